"""The business database: products with stock, and orders. SQLite, one connection per call,
so the API's threads and the worker's handler threads never share one.

The order status is the source of truth; Redis only holds the reminder to close. Every
change of status is a conditional UPDATE (``WHERE status = 'pending'``): whoever changes a
pending order first wins, and everybody else changes nothing.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS products ("
    " id INTEGER PRIMARY KEY, name TEXT NOT NULL, stock INTEGER NOT NULL CHECK (stock >= 0))",
    "CREATE TABLE IF NOT EXISTS orders ("
    " id TEXT PRIMARY KEY, product_id INTEGER NOT NULL REFERENCES products (id),"
    " qty INTEGER NOT NULL, status TEXT NOT NULL,"  # pending | paid | closed
    " created_at REAL NOT NULL, close_at REAL NOT NULL, closed_at REAL)",
)

# What a fresh database starts with, so the example has something to sell.
CATALOGUE = ((1, "widget", 100), (2, "gadget", 5))

ORDER_COLUMNS = ("id", "product_id", "qty", "status", "created_at", "close_at", "closed_at")


class Store:
    def __init__(self, path: str) -> None:
        self.path = path

    @contextmanager
    def _connect(self) -> Iterator[sqlite3.Connection]:
        # Autocommit mode: transactions are explicit (BEGIN IMMEDIATE takes the write lock at
        # once, so two writers queue on the busy timeout instead of failing mid-transaction).
        conn = sqlite3.connect(self.path, timeout=30, isolation_level=None)
        try:
            yield conn
        finally:
            conn.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        with self._connect() as conn:
            conn.execute("BEGIN IMMEDIATE")
            try:
                yield conn
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")

    def init(self) -> None:
        """Create the tables and the catalogue if missing (the API and the worker both call
        this at start-up; whichever comes first does the work)."""
        with self._connect() as conn:
            conn.execute("PRAGMA journal_mode=WAL")  # readers do not wait for the writer
        with self._transaction() as conn:
            for ddl in SCHEMA:
                conn.execute(ddl)
            conn.executemany("INSERT OR IGNORE INTO products VALUES (?, ?, ?)", CATALOGUE)

    # -- the business ------------------------------------------------------------------------

    def place(self, order_id: str, product_id: int, qty: int, close_at: float) -> bool:
        """Reserve the stock and record a pending order, in one transaction. False when the
        product is unknown or short of stock (nothing is written then)."""
        with self._transaction() as conn:
            reserved = conn.execute(
                "UPDATE products SET stock = stock - ? WHERE id = ? AND stock >= ?",
                (qty, product_id, qty),
            ).rowcount
            if reserved != 1:
                return False
            conn.execute(
                "INSERT INTO orders (id, product_id, qty, status, created_at, close_at)"
                " VALUES (?, ?, ?, 'pending', ?, ?)",
                (order_id, product_id, qty, time.time(), close_at),
            )
        return True

    def pay(self, order_id: str) -> str | None:
        """Mark a pending order paid. Returns the order's status afterwards ('paid', or
        'closed' when the close won the race), or None for an unknown order."""
        with self._transaction() as conn:
            conn.execute(
                "UPDATE orders SET status = 'paid' WHERE id = ? AND status = 'pending'",
                (order_id,),
            )
            row = conn.execute("SELECT status FROM orders WHERE id = ?", (order_id,)).fetchone()
        return str(row[0]) if row else None

    def close_if_pending(self, order_id: str) -> bool:
        """The idempotency gate: close a pending order and return its stock, in one
        transaction. False (and nothing changed) when it is paid, closed, or unknown.

        The status change and the stock return commit together or not at all, so a close
        that runs twice, or races a payment, can never return the stock twice or close a
        paid order: the second writer's UPDATE matches no row.
        """
        with self._transaction() as conn:
            closed = conn.execute(
                "UPDATE orders SET status = 'closed', closed_at = ?"
                " WHERE id = ? AND status = 'pending'",
                (time.time(), order_id),
            ).rowcount
            if closed != 1:
                return False
            conn.execute(
                "UPDATE products SET stock = stock + (SELECT qty FROM orders WHERE id = ?)"
                " WHERE id = (SELECT product_id FROM orders WHERE id = ?)",
                (order_id, order_id),
            )
        return True

    # -- reading -----------------------------------------------------------------------------

    def order(self, order_id: str) -> dict[str, Any] | None:
        with self._connect() as conn:
            row = conn.execute(
                f"SELECT {', '.join(ORDER_COLUMNS)} FROM orders WHERE id = ?", (order_id,)
            ).fetchone()
        return dict(zip(ORDER_COLUMNS, row, strict=True)) if row else None

    def product(self, product_id: int) -> dict[str, Any] | None:
        with self._connect() as conn:
            row = conn.execute(
                "SELECT id, name, stock FROM products WHERE id = ?", (product_id,)
            ).fetchone()
        return {"id": row[0], "name": row[1], "stock": row[2]} if row else None
