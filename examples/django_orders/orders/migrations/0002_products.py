"""Two products to order, for trying the example by hand (the tests make their own)."""

from django.db import migrations


def add_products(apps, schema_editor):  # type: ignore[no-untyped-def]
    product = apps.get_model("orders", "Product")
    product.objects.bulk_create([product(name="apple", stock=100), product(name="pear", stock=5)])


class Migration(migrations.Migration):
    dependencies = [("orders", "0001_initial")]

    operations = [migrations.RunPython(add_products, migrations.RunPython.noop)]
