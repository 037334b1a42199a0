"""django-tasks-plus: a durable database backend for Django's Tasks framework.

The public API, re-exported in one place. Nothing inside the package imports from here.
"""

from .compat import TaskContext, TaskResult, TaskResultStatus
from .definition import Task, task
from .exceptions import (
    Abort,
    DatabaseUnavailable,
    InvalidBackendOptions,
    InvalidRetryPolicy,
    InvalidTaskArguments,
    InvalidTaskOptions,
    LeaseExpired,
    ReturnValueNotSerializable,
    TaskDeferred,
    TaskNotRegistered,
    TasksPlusError,
    TaskTimeout,
    UnsupportedDatabase,
)
from .retry import ExponentialBackoff, RetryPolicy, exponential_backoff, no_retry

__version__ = "0.1.0"

__all__ = [
    "Abort",
    "DatabaseUnavailable",
    "ExponentialBackoff",
    "InvalidBackendOptions",
    "InvalidRetryPolicy",
    "InvalidTaskArguments",
    "InvalidTaskOptions",
    "LeaseExpired",
    "RetryPolicy",
    "ReturnValueNotSerializable",
    "Task",
    "TaskContext",
    "TaskDeferred",
    "TaskNotRegistered",
    "TaskResult",
    "TaskResultStatus",
    "TaskTimeout",
    "TasksPlusError",
    "UnsupportedDatabase",
    "exponential_backoff",
    "no_retry",
    "task",
]
