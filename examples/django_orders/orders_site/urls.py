from django.contrib import admin
from django.urls import path
from orders import views

urlpatterns = [
    path("admin/", admin.site.urls),
    path("orders", views.place_order),
    path("orders/gate-first", views.place_order_gate_first),
    path("orders/<uuid:order_id>", views.show_order),
    path("orders/<uuid:order_id>/pay", views.pay_order),
    path("products/<int:product_id>", views.show_product),
]
