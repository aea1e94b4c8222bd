"""``DELAYQ_REQUIRE_BROWSER=1`` (CI sets it, as the README's test command does): a test
skipped for want of Chromium fails instead. The dashboard's browser tests skip themselves
when ``/usr/bin/chromium`` is missing, which on a developer's machine is a fair skip, but in
CI would let the suite pass without them. A pytest plugin: ``tests/conftest.py`` takes its
hook, and ``tests/test_release.py`` loads it alone (``-p``) to check it. A skip counts as
one for want of Chromium when its reason names it.
"""

from __future__ import annotations

import os
from collections.abc import Generator
from typing import Any

import pytest

REQUIRE_BROWSER_ENV = "DELAYQ_REQUIRE_BROWSER"


def _skip_reason(report: pytest.TestReport) -> str:
    longrepr: Any = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    return str(longrepr)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    if not (report.skipped and os.environ.get(REQUIRE_BROWSER_ENV) == "1"):
        return
    reason = _skip_reason(report)
    if "chromium" in reason.lower():
        report.outcome = "failed"
        report.longrepr = (
            f"{REQUIRE_BROWSER_ENV}=1 and this browser test would be skipped: {reason}. "
            f"Install Chromium (apt-get install chromium), or unset {REQUIRE_BROWSER_ENV} "
            "to let it skip"
        )
