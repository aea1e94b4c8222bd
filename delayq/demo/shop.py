"""The demo's business database: orders and inventory, on SQLite or PostgreSQL.

The close handler is the idempotency gate the field recommends: the status update
``WHERE status = 'pending'`` and the stock return commit in one transaction, so running the
close twice, or racing a payment, can never return stock twice or close a paid order.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

SCHEMA = (
    "CREATE TABLE demo_inventory (product_id INTEGER PRIMARY KEY, stock INTEGER NOT NULL,"
    " initial INTEGER NOT NULL)",
    "CREATE TABLE demo_orders (id INTEGER PRIMARY KEY, product_id INTEGER NOT NULL,"
    " qty INTEGER NOT NULL, status TEXT NOT NULL, created_at DOUBLE PRECISION NOT NULL,"
    " close_due_at DOUBLE PRECISION NOT NULL, paid_at DOUBLE PRECISION,"
    " closed_at DOUBLE PRECISION, close_lateness_ms DOUBLE PRECISION, close_attempt INTEGER)",
    "CREATE TABLE demo_restock_log (order_id INTEGER NOT NULL, qty INTEGER NOT NULL,"
    " at DOUBLE PRECISION NOT NULL)",
)
TABLES = ("demo_restock_log", "demo_orders", "demo_inventory")


class Shop:
    """One connection to the business database (one per process)."""

    def __init__(self, url: str) -> None:
        self.url = url
        scheme = urlsplit(url).scheme
        self.conn: Any
        if scheme == "sqlite":
            path = (
                url[len("sqlite:///") :] if url.startswith("sqlite:///") else url[len("sqlite:") :]
            )
            # Autocommit mode; transactions are explicit. WAL lets readers run beside the
            # writer, and the busy timeout queues the worker processes' writes.
            self.conn = sqlite3.connect(path, timeout=30, isolation_level=None)
            self.conn.execute("PRAGMA journal_mode=WAL")
            self.conn.execute("PRAGMA busy_timeout=30000")
            self.postgres = False
        elif scheme in ("postgres", "postgresql"):
            try:
                import psycopg
            except ImportError:
                raise SystemExit(
                    "--database-url postgresql://... needs psycopg: pip install 'delayq[demo]'"
                ) from None
            self.conn = psycopg.connect(url, autocommit=True)
            self.postgres = True
        else:
            raise SystemExit(
                f"unsupported --database-url {url!r}: use sqlite:///FILE or postgresql://"
            )

    def _sql(self, sql: str) -> str:
        return sql.replace("?", "%s") if self.postgres else sql

    def execute(self, sql: str, params: tuple[Any, ...] = ()) -> Any:
        return self.conn.execute(self._sql(sql), params)

    def begin(self) -> None:
        self.execute("BEGIN" if self.postgres else "BEGIN IMMEDIATE")

    def commit(self) -> None:
        self.execute("COMMIT")

    def rollback(self) -> None:
        self.execute("ROLLBACK")

    def close(self) -> None:
        self.conn.close()

    # -- set-up --------------------------------------------------------------------------

    def create(self, products: int, stock: int) -> None:
        for table in TABLES:
            self.execute(f"DROP TABLE IF EXISTS {table}")
        for ddl in SCHEMA:
            self.execute(ddl)
        self.begin()
        for p in range(products):
            self.execute("INSERT INTO demo_inventory VALUES (?, ?, ?)", (p, stock, stock))
        self.commit()

    # -- the business --------------------------------------------------------------------

    def place(self, order_id: int, product_id: int, qty: int, close_due_at: float) -> bool:
        """Reserve stock and record a pending order; False when out of stock."""
        self.begin()
        try:
            cur = self.execute(
                "UPDATE demo_inventory SET stock = stock - ? WHERE product_id = ? AND stock >= ?",
                (qty, product_id, qty),
            )
            if cur.rowcount != 1:
                self.rollback()
                return False
            self.execute(
                "INSERT INTO demo_orders (id, product_id, qty, status, created_at, close_due_at)"
                " VALUES (?, ?, ?, 'pending', ?, ?)",
                (order_id, product_id, qty, time.time(), close_due_at),
            )
            self.commit()
            return True
        except BaseException:
            self.rollback()
            raise

    def pay(self, order_id: int) -> bool:
        """Mark a pending order paid; False if it was already closed (the race was lost)."""
        cur = self.execute(
            "UPDATE demo_orders SET status = 'paid', paid_at = ?"
            " WHERE id = ? AND status = 'pending'",
            (time.time(), order_id),
        )
        return bool(cur.rowcount == 1)

    def close_order(self, order_id: int, lateness_ms: float, attempt: int) -> bool:
        """The gate: close a still-pending order and return its stock in one transaction.
        False means it was paid or closed already, and nothing changed."""
        self.begin()
        try:
            cur = self.execute(
                "UPDATE demo_orders SET status = 'closed', closed_at = ?, close_lateness_ms = ?,"
                " close_attempt = ? WHERE id = ? AND status = 'pending'",
                (time.time(), lateness_ms, attempt, order_id),
            )
            if cur.rowcount != 1:
                self.rollback()
                return False
            product_id, qty = self.execute(
                "SELECT product_id, qty FROM demo_orders WHERE id = ?", (order_id,)
            ).fetchone()
            self.execute(
                "UPDATE demo_inventory SET stock = stock + ? WHERE product_id = ?",
                (qty, product_id),
            )
            self.execute(
                "INSERT INTO demo_restock_log VALUES (?, ?, ?)", (order_id, qty, time.time())
            )
            self.commit()
            return True
        except BaseException:
            self.rollback()
            raise

    # -- what the report reads -------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        rows = self.execute("SELECT status, COUNT(*) FROM demo_orders GROUP BY status").fetchall()
        return {status: int(n) for status, n in rows}

    def lateness_ms(self) -> list[tuple[float, int]]:
        rows = self.execute(
            "SELECT close_lateness_ms, close_attempt FROM demo_orders WHERE status = 'closed'"
        ).fetchall()
        return [(float(ms), int(a)) for ms, a in rows]

    def audit(self) -> Audit:
        def one(sql: str) -> int:
            return int(self.execute(sql).fetchone()[0] or 0)

        return Audit(
            pending=one("SELECT COUNT(*) FROM demo_orders WHERE status = 'pending'"),
            paid_restocked=one(
                "SELECT COUNT(*) FROM demo_restock_log r JOIN demo_orders o ON o.id = r.order_id"
                " WHERE o.status <> 'closed'"
            ),
            restocked_twice=one(
                "SELECT COUNT(*) FROM (SELECT order_id FROM demo_restock_log GROUP BY order_id"
                " HAVING COUNT(*) > 1) t"
            ),
            closed_not_restocked=one(
                "SELECT COUNT(*) FROM demo_orders o WHERE o.status = 'closed' AND NOT EXISTS"
                " (SELECT 1 FROM demo_restock_log r WHERE r.order_id = o.id)"
            ),
            stock_mismatches=one(
                "SELECT COUNT(*) FROM demo_inventory i WHERE i.stock <> i.initial - COALESCE("
                "(SELECT SUM(o.qty) FROM demo_orders o WHERE o.product_id = i.product_id"
                " AND o.status = 'paid'), 0)"
            ),
            closed_early=one(
                "SELECT COUNT(*) FROM demo_orders WHERE status = 'closed' AND close_lateness_ms < 0"
            ),
        )


@dataclass(frozen=True)
class Audit:
    pending: int  # unpaid orders never closed
    paid_restocked: int  # stock returned for an order that was not closed (e.g. paid)
    restocked_twice: int
    closed_not_restocked: int
    stock_mismatches: int  # products whose stock != initial - paid
    closed_early: int  # closed before the deadline
