"""docs/http.md "Mounting it in your application", as written: the API mounted in a
Starlette application, for ``uvicorn`` to serve (the URL from ``DELAYQ_REDIS_URL``)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from starlette.applications import Starlette
from starlette.routing import Mount

from delayq.http import create_app

TOKEN = "mounted-api-token-1234"

delayq_api = create_app(os.environ["DELAYQ_REDIS_URL"], token=TOKEN)


@asynccontextmanager
async def lifespan(app: Any) -> AsyncIterator[None]:
    yield
    await delayq_api.state.api.aclose()


app = Starlette(routes=[Mount("/delayq", app=delayq_api)], lifespan=lifespan)
