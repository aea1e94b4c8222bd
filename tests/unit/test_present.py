"""admin/present.py's one duration formatter: the CLI's and dashboard's durations, and the
dashboard charts' spans (``exact``), which dashboard/charts.py formatted with a second one."""

from __future__ import annotations

import pytest

from delayq.admin.present import human_seconds


@pytest.mark.parametrize(
    ("seconds", "text", "exact"),
    [
        (0.0123, "12ms", "12.3ms"),
        (0.0005, "0ms", "0.5ms"),
        (0.5, "500ms", "500ms"),
        (10, "10.0s", "10s"),
        (59.5, "59.5s", "59.5s"),
        (95, "1m35s", "1.58333m"),
        (300, "5m00s", "5m"),
        (5400, "1h30m", "1.5h"),
        (7300, "2h01m", "2.02778h"),
        (86400, "1d00h", "1d"),
        (90000, "1d01h", "1.04167d"),
    ],
)
def test_a_duration_reads_for_people_and_a_span_in_its_unit(
    seconds: float, text: str, exact: str
) -> None:
    assert human_seconds(seconds) == text
    assert human_seconds(seconds, exact=True) == exact
