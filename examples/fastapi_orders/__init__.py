"""A FastAPI order service: close an unpaid order after 15 minutes and give its stock back.

- ``app.py``: the HTTP API. Creating an order schedules its close task; paying cancels it.
  One ``AsyncQueue`` lives as long as the app (FastAPI lifespan).
- ``worker.py``: the worker that runs the close task, behind the idempotency gate.
- ``store.py``: the business database (SQLite), shared by both.
- ``settings.py``: where Redis and the database are, read from the environment.
"""
