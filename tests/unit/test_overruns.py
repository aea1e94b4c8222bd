"""What ``--recycle-stuck`` measures (``Overruns.stuck_for``): a thread that outlived its
attempt, but not one still within its ``TOLD_S`` to stop after a lost lease or an abort."""

from __future__ import annotations

import asyncio
import types

from delayq.worker.lifecycle import STOPPING
from delayq.worker.overruns import TOLD_S, Overruns


class _Run(types.SimpleNamespace):
    """The parts of a run that Overruns reads (a Run needs a claim and a lane)."""

    __hash__ = object.__hash__


async def test_a_handler_told_to_stop_is_not_stuck_within_its_time_to_stop() -> None:
    overruns = Overruns()
    fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    executor = types.SimpleNamespace(emit=lambda *a, **k: None)
    run = _Run(
        threads=0,
        task=None,
        state=STOPPING,
        lane=types.SimpleNamespace(executor=executor),
        claimed=types.SimpleNamespace(id="t", header=types.SimpleNamespace(kind="k")),
    )
    overruns.outlived(run, fut, None, lambda r: None)  # (None: told to stop, not timed out)
    await asyncio.sleep(TOLD_S * 0.5)
    assert overruns.stuck_for() == 0.0  # it may still stop as told: not stuck yet
    await asyncio.sleep(TOLD_S * 0.6)
    assert overruns.stuck_for() >= TOLD_S  # reported: stuck since it was told
    fut.set_result(None)
    await asyncio.sleep(0)
