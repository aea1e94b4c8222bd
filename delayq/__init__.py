"""delayq: reliable delayed tasks on Redis and Valkey — on time, once, surviving crashes."""

from .core import TaskSpec
from .errors import (
    ConfigurationError,
    ConnectionFailed,
    DelayqError,
    Discard,
    DurabilityError,
    Fail,
    InvalidTaskError,
    LeaseLost,
    PayloadTooLarge,
    Retry,
    ScriptError,
    WorkerFailed,
)
from .queue import AsyncQueue, Queue
from .task import QueueStats, Scheduled, Task, TaskInfo
from .worker import Worker
from .worker.events import TaskEvent
from .worker.expiry import Expired

__version__ = "0.1.0"

__all__ = [
    "AsyncQueue",
    "ConfigurationError",
    "ConnectionFailed",
    "DelayqError",
    "Discard",
    "DurabilityError",
    "Expired",
    "Fail",
    "InvalidTaskError",
    "LeaseLost",
    "PayloadTooLarge",
    "Queue",
    "QueueStats",
    "Retry",
    "Scheduled",
    "ScriptError",
    "Task",
    "TaskEvent",
    "TaskInfo",
    "TaskSpec",
    "Worker",
    "WorkerFailed",
]
