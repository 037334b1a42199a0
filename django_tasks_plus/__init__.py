"""django-tasks-plus: a durable database backend for Django's Tasks framework.

The public API, re-exported in one place. Nothing inside the package imports from here.
"""

from .breaker import Breaker, DroppedTask
from .compat import TaskResult, TaskResultStatus
from .context import TaskContext
from .definition import Task, task
from .exceptions import (
    Abort,
    BreakerHeldTooLong,
    Cancelled,
    CircuitLocked,
    CircuitNotFound,
    CorruptTaskRecord,
    DatabaseUnavailable,
    DedupKeyLocked,
    EnqueueRefused,
    InvalidBackendOptions,
    InvalidRetryPolicy,
    InvalidTaskArguments,
    InvalidTaskOptions,
    LeaseExpired,
    OutcomeNotStorable,
    PayloadTooLarge,
    QueueFull,
    ReturnValueNotSerializable,
    TaskDeferred,
    TaskNotRegistered,
    TaskRowLocked,
    TasksPlusError,
    TaskTimeout,
    TimeOutOfRange,
    TransactionLeaked,
    UnknownBreaker,
    UnsupportedDatabase,
)
from .middleware import Hold
from .operations import (
    aenqueue_many,
    cancel,
    delete,
    discard,
    enqueue_many,
    get_metadata,
    prune_dedup_keys,
    redrive,
    run_now,
)
from .retry import ExponentialBackoff, RetryPolicy, exponential_backoff, no_retry
from .timebounds import HORIZON

__version__ = "0.1.0"

__all__ = [
    "HORIZON",
    "Abort",
    "Breaker",
    "BreakerHeldTooLong",
    "Cancelled",
    "CircuitLocked",
    "CircuitNotFound",
    "CorruptTaskRecord",
    "DatabaseUnavailable",
    "DedupKeyLocked",
    "DroppedTask",
    "EnqueueRefused",
    "ExponentialBackoff",
    "Hold",
    "InvalidBackendOptions",
    "InvalidRetryPolicy",
    "InvalidTaskArguments",
    "InvalidTaskOptions",
    "LeaseExpired",
    "OutcomeNotStorable",
    "PayloadTooLarge",
    "QueueFull",
    "RetryPolicy",
    "ReturnValueNotSerializable",
    "Task",
    "TaskContext",
    "TaskDeferred",
    "TaskNotRegistered",
    "TaskResult",
    "TaskResultStatus",
    "TaskRowLocked",
    "TaskTimeout",
    "TasksPlusError",
    "TimeOutOfRange",
    "TransactionLeaked",
    "UnknownBreaker",
    "UnsupportedDatabase",
    "aenqueue_many",
    "cancel",
    "delete",
    "discard",
    "enqueue_many",
    "exponential_backoff",
    "get_metadata",
    "no_retry",
    "prune_dedup_keys",
    "redrive",
    "run_now",
    "task",
]
