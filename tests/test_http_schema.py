"""The HTTP API against its own OpenAPI document (schemathesis): whatever the document
allows, the API answers without a 5xx and with a response the document describes."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from starlette.types import Receive, Scope, Send

from delayq.embedded import EmbeddedServer
from delayq.http import create_app, document

TOKEN = "s3cret-token-for-schema-tests"


class LateApp:
    """The app under test, made once the module's private server runs (the schema is
    loaded when the module is, before any fixture)."""

    app: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self.app(scope, receive, send)


LATE = LateApp()
schema = schemathesis.openapi.from_dict(document())
schema.app = LATE


@schema.auth()
class Bearer:
    """The token, as an auth provider: schemathesis's check that the API enforces it sends
    the request again without it, and with a wrong one."""

    def get(self, case: Any, context: Any) -> str:
        return TOKEN

    def set(self, case: Any, data: str, context: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@schema.hook
def map_body(context: Any, body: Any) -> Any:
    """JSON Schema cannot say that the ids of a batch's tasks differ (uniqueness of one field
    across items): a repeated id is dropped from what is sent here, and test_http checks
    that the API refuses one (422, naming both tasks)."""
    tasks = body.get("tasks") if isinstance(body, dict) else None
    if not isinstance(tasks, list):
        return body
    seen: set[str] = set()
    unique = []
    for task in tasks:
        tid = task.get("id") if isinstance(task, dict) else None
        if isinstance(tid, str) and tid in seen:
            task = {k: v for k, v in task.items() if k != "id"}
        elif isinstance(tid, str):
            seen.add(tid)
        unique.append(task)
    return {**body, "tasks": unique}


@pytest.fixture(scope="module", autouse=True)
def private_server() -> Iterator[EmbeddedServer]:
    srv = EmbeddedServer(appendonly=True).start()  # durable=true is confirmed
    LATE.app = create_app(srv.url, token=TOKEN)
    yield srv
    LATE.app = None
    srv.stop()


@schema.parametrize()
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
def test_the_api_matches_its_openapi_document(case: Any) -> None:
    if case.headers and "Idempotency-Key" in case.headers:
        # One key is one request's: the same key with another body is refused (422), which
        # no schema can say, so each generated key is made unique (test_http_idempotency
        # checks the reuse)
        case.headers["Idempotency-Key"] = uuid.uuid4().hex
    case.call_and_validate()


def test_every_route_under_v1_documents_its_errors_and_the_token() -> None:
    doc = document()
    assert doc["openapi"] == "3.1.0"
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if path.startswith("/v1"):
                assert {"401", "422", "500", "503"} <= set(op["responses"]), (method, path)
                assert op["security"] == [{"bearer": []}]
                for code, response in op["responses"].items():
                    if code >= "400":
                        assert "application/problem+json" in response["content"]
    for name in ("Task", "BatchTask", "Batch", "Reschedule", "ExpiringSet", "ExpiringTouch"):
        assert doc["components"]["schemas"][name]["additionalProperties"] is False
