"""The order API: ``uvicorn examples.fastapi_orders.app:app``.

POST /orders             reserve stock, record a pending order, schedule its close
POST /orders/{id}/pay    mark it paid and cancel the close
GET  /orders/{id}        the order
GET  /products/{id}      the product and its stock

One :class:`~delayq.AsyncQueue` (one connection pool) serves every request; the app's
lifespan opens it at start-up and closes it at shutdown. The close itself runs in the
worker (``worker.py``), never in the API process.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

from fastapi import APIRouter, Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel, Field

from delayq import AsyncQueue

from .settings import CLOSE_KIND, Settings, close_task_id
from .store import Store


class NewOrder(BaseModel):
    product_id: int
    qty: int = Field(default=1, ge=1, le=1000)


class Order(BaseModel):
    id: str
    product_id: int
    qty: int
    status: str  # pending | paid | closed
    created_at: float
    close_at: float
    closed_at: float | None = None


class PaidOrder(Order):
    close_task_cancelled: bool  # False: the close was already running, and its gate saw 'paid'


class Product(BaseModel):
    id: int
    name: str
    stock: int


def _queue(request: Request) -> AsyncQueue:
    queue: AsyncQueue = request.app.state.queue
    return queue


def _store(request: Request) -> Store:
    store: Store = request.app.state.store
    return store


def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


QueueDep = Annotated[AsyncQueue, Depends(_queue)]
StoreDep = Annotated[Store, Depends(_store)]
SettingsDep = Annotated[Settings, Depends(_settings)]

router = APIRouter()


@router.post("/orders", status_code=201)
async def create_order(
    body: NewOrder, queue: QueueDep, store: StoreDep, settings: SettingsDep
) -> Order:
    order_id = secrets.token_hex(8)
    close_at = time.time() + settings.close_after  # for display; the task is due on Redis's clock
    # Schedule the close before the order is written. If the write then fails (or this
    # process dies in between), the close finds no pending order and is discarded: harmless.
    # The other way round, a crash between the two would leave a pending order that nothing
    # ever closes.
    await queue.schedule(
        CLOSE_KIND,
        {"order_id": order_id},
        delay=settings.close_after,
        task_id=close_task_id(order_id),
    )
    placed = await asyncio.to_thread(store.place, order_id, body.product_id, body.qty, close_at)
    if not placed:
        await queue.cancel(close_task_id(order_id))  # tidy up; the gate would discard it anyway
        raise HTTPException(409, "unknown product or not enough stock")
    return Order(**await _order_or_404(store, order_id))


@router.post("/orders/{order_id}/pay")
async def pay_order(order_id: str, queue: QueueDep, store: StoreDep) -> PaidOrder:
    status = await asyncio.to_thread(store.pay, order_id)
    if status is None:
        raise HTTPException(404, "no such order")
    if status == "closed":
        raise HTTPException(409, "the order was closed unpaid; its stock is back on sale")
    # The order is paid (now, or by an earlier request). Cancel its close: True if it was
    # still waiting. If it was already running, it is not stopped, but its gate finds the
    # order paid and discards itself, so paying is safe whichever side wins the race.
    cancelled = await queue.cancel(close_task_id(order_id))
    return PaidOrder(**await _order_or_404(store, order_id), close_task_cancelled=cancelled)


@router.get("/orders/{order_id}")
async def get_order(order_id: str, store: StoreDep) -> Order:
    return Order(**await _order_or_404(store, order_id))


@router.get("/products/{product_id}")
async def get_product(product_id: int, store: StoreDep) -> Product:
    product = await asyncio.to_thread(store.product, product_id)
    if product is None:
        raise HTTPException(404, "no such product")
    return Product(**product)


async def _order_or_404(store: Store, order_id: str) -> dict[str, Any]:
    order = await asyncio.to_thread(store.order, order_id)
    if order is None:
        raise HTTPException(404, "no such order")
    return order


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings.from_env()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        store = Store(settings.database)
        await asyncio.to_thread(store.init)
        app.state.settings = settings
        app.state.store = store
        app.state.queue = AsyncQueue(settings.queue, url=settings.redis_url, clock=settings.clock)
        try:
            yield
        finally:
            await app.state.queue.close()

    app = FastAPI(title="orders (delayq example)", lifespan=lifespan)
    app.include_router(router)
    return app


app = create_app()
