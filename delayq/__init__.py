"""delayq: reliable delayed tasks on Redis and Valkey — on time, once, surviving crashes."""

from delayq.controls import Controls, RateLimit
from delayq.errors import (
    ConfigurationError,
    ConnectionFailed,
    DelayqError,
    Discard,
    DurabilityError,
    Fail,
    InvalidTaskError,
    LeaseLost,
    PayloadTooLarge,
    ProtocolVersionError,
    Retry,
    ScriptError,
    TaskAborted,
    TaskNotFound,
    WorkerFailed,
)
from delayq.expiring.facade import Expired
from delayq.queue import AsyncQueue, Queue
from delayq.spec import CheckedSpec, TaskSpec, TaskType
from delayq.task import QueueStats, Scheduled, Task, TaskInfo
from delayq.worker.events import TaskEvent
from delayq.worker.worker import Worker

__version__ = "0.1.0"

__all__ = [
    "AsyncQueue",
    "CheckedSpec",
    "ConfigurationError",
    "ConnectionFailed",
    "Controls",
    "DelayqError",
    "Discard",
    "DurabilityError",
    "Expired",
    "Fail",
    "InvalidTaskError",
    "LeaseLost",
    "PayloadTooLarge",
    "ProtocolVersionError",
    "Queue",
    "QueueStats",
    "RateLimit",
    "Retry",
    "Scheduled",
    "ScriptError",
    "Task",
    "TaskAborted",
    "TaskEvent",
    "TaskInfo",
    "TaskNotFound",
    "TaskSpec",
    "TaskType",
    "Worker",
    "WorkerFailed",
]
