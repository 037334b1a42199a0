"""The envelope: one ``enqueue()``/``enqueue_many()`` call on its way to the table.

Enqueue is a pipeline of named steps over one ``Envelope`` (``DatabaseBackend.enqueue_many``
reads as the list): **validate** the task's options, **build** the envelope (each call
checked against the task's signature or schema, encoded and sized: ``build``),
**middleware** (the enqueue middleware chain may add metadata, change options or refuse),
**write** (``rows`` renders the columns; the backend takes the dedup key, checks the queue's
depth and inserts), **results**.

Building is pure apart from the clock value it is given, so every bad-input rule (queue,
schema, arity, serializability, size) is decided before any SQL, and nothing is written
when one fails.

Enqueue middleware is the mirror of execution middleware (``middleware.py``): a factory
takes ``call_next`` and returns a function of the ``Envelope`` that returns what
``call_next`` returns (the list of ``TaskResult``)::

    def stamp_tenant(call_next):
        def middleware(envelope):
            return call_next(envelope.with_metadata(tenant=current_tenant()))
        return middleware

It runs on the caller's thread and connection, inside the caller's transaction when
there is one; enqueue opens its own (for a batch or a dedup key) only around the write,
inside the chain. A middleware refuses a call by raising (``EnqueueRefused``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any, NamedTuple, cast

from . import compat
from .codec import EncodeError, display_call, dumps, encode_call, unencodable_call_error
from .conf import BackendSettings
from .db.values import JsonText
from .definition import CallRules
from .exceptions import InvalidTaskArguments, InvalidTaskOptions, PayloadTooLarge
from .metadata import EMPTY, EMPTY_TEXT, encode_metadata
from .middleware import build_chain

logger = logging.getLogger("django_tasks_plus")

_fallbacks_logged: set[tuple[str, str, str]] = set()


class Call(NamedTuple):
    """One call of an enqueue, built: the caller's arguments, their stored form, and what
    the call's ``TaskResult`` shows.

    A named tuple: a bulk enqueue builds one per task, and a frozen dataclass's
    ``__init__`` cost more than the encoding.
    """

    id: str  # the task's id: a random (version 4) UUID in its canonical text form
    args: Sequence[Any]  # as the caller passed them
    kwargs: Mapping[str, Any]
    args_text: str  # the stored JSON
    kwargs_text: str
    shown_args: list[Any]  # as the TaskResult shows them
    shown_kwargs: dict[str, Any]
    breaker_key: str | None  # "name/key" of its circuit breaker, or None


@dataclass(frozen=True, slots=True)
class Envelope:
    """One ``enqueue()``/``enqueue_many()`` call: what enqueue middleware sees and passes on.

    Change it with ``with_metadata()`` and ``using()`` (or ``dataclasses.replace``);
    ``calls`` are the validated calls and are not to be changed.
    """

    task: compat.Task  # with this call's options (queue, priority, run_after, keys…)
    calls: tuple[Call, ...]
    backend: str  # the TASKS alias
    enqueued_at: datetime
    metadata: Mapping[str, Any] = field(default_factory=lambda: EMPTY)  # added to every row

    def with_metadata(self, **items: Any) -> Envelope:
        """A copy whose metadata also holds ``items`` (replacing keys already there)."""
        return replace(self, metadata={**self.metadata, **items})

    def using(self, **options: Any) -> Envelope:
        """A copy whose task has other per-call options (``Task.using``'s keywords)."""
        return replace(self, task=self.task.using(**options))


EnqueueHandler = Callable[[Envelope], list[compat.TaskResult]]
EnqueueMiddleware = Callable[[EnqueueHandler], EnqueueHandler]


def build_enqueue_chain(
    middlewares: Sequence[EnqueueMiddleware], innermost: EnqueueHandler
) -> EnqueueHandler:
    """Wrap the write step in the enqueue middlewares, the first one outermost."""
    # The chain is the same whatever a handler takes; middleware.py types it for attempts.
    chain = build_chain(cast(Any, middlewares), cast(Any, innermost), handles="the envelope")
    return cast(EnqueueHandler, chain)


def after_middleware(original: compat.Task, envelope: Any) -> Envelope:
    """The envelope a chain passed to the write step, checked: a middleware may change
    the task's per-call options, never which task it is or where it is stored."""
    if not isinstance(envelope, Envelope):
        raise TypeError(
            f"An enqueue middleware of {original.module_path} called call_next with "
            f"{envelope!r}, not an Envelope; pass the envelope it received, or a copy of it "
            "(envelope.with_metadata(), envelope.using())."
        )
    task = envelope.task
    if task is not original and (
        not isinstance(task, compat.Task)
        or task.module_path != original.module_path
        or task.backend != original.backend
    ):
        raise InvalidTaskOptions(
            f"An enqueue middleware of {original.module_path} replaced the task with "
            f"{task!r}: it may change the call's options (envelope.using()), not the task "
            "or its backend."
        )
    return envelope


# The UUID variant bits (10xx) for the first hex digit of the fourth group.
_VARIANT = {digit: "89ab"[int(digit, 16) & 0b11] for digit in "0123456789abcdef"}


def new_task_ids(count: int) -> list[str]:
    """``count`` random version-4 UUIDs as text, from one read of the OS's random source.

    The same randomness and format as ``str(uuid.uuid4())``, at a fraction of the cost of
    building a ``UUID`` object per task in a bulk enqueue.
    """
    raw = os.urandom(16 * count).hex()
    ids = []
    for start in range(0, 32 * count, 32):
        h = raw[start : start + 32]
        ids.append(f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[h[16]]}{h[17:20]}-{h[20:]}")
    return ids


def resolve_queue(settings: BackendSettings, task: compat.Task) -> str:
    """The queue a task's rows go to: its own, or the fallback queue (logged once)."""
    if settings.serves(task.queue_name):
        return task.queue_name
    fallback = settings.fallback_queue
    marker = (settings.alias, task.module_path, task.queue_name)
    if marker not in _fallbacks_logged:
        _fallbacks_logged.add(marker)
        logger.warning(
            "Task %s names queue %r, which backend %r does not serve; its tasks go to %r "
            "(QUEUE_RESOLUTION='fallback').",
            task.module_path,
            task.queue_name,
            settings.alias,
            fallback,
        )
    return fallback


def build(
    settings: BackendSettings,
    task: compat.Task,
    calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]],
    *,
    now: datetime,
) -> Envelope:
    """The build step: validate and encode every call; raise a typed error before
    anything is written."""
    limit = settings.max_payload_bytes
    rules = CallRules(task)
    calls = list(calls)
    return Envelope(
        task=task,
        calls=tuple(
            [
                _call(task, rules, limit, task_id, args, kwargs)
                for task_id, (args, kwargs) in zip(new_task_ids(len(calls)), calls, strict=True)
            ]
        ),
        backend=settings.alias,
        enqueued_at=now,
    )


def _call(
    task: compat.Task,
    rules: CallRules,
    limit: int | None,
    task_id: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Call:
    stored_args, stored_kwargs = rules.payload(args, kwargs)
    try:
        encoded_args, encoded_kwargs = encode_call(stored_args, stored_kwargs)
    except EncodeError as exc:
        raise InvalidTaskArguments(
            f"Cannot enqueue {task.module_path}: {exc}", field_path=exc.field_path
        ) from exc
    args_text = dumps(encoded_args) if encoded_args else "[]"
    kwargs_text = dumps(encoded_kwargs) if encoded_kwargs else "{}"
    try:
        # Also the check that the text can be stored at all: UTF-8 refuses lone surrogates.
        size = _utf8_length(args_text) + _utf8_length(kwargs_text)
    except UnicodeEncodeError:
        error = unencodable_call_error(stored_args, stored_kwargs)
        raise InvalidTaskArguments(
            f"Cannot enqueue {task.module_path}: {error}", field_path=error.field_path
        ) from None
    if limit is not None and size > limit:
        raise PayloadTooLarge(
            f"Cannot enqueue {task.module_path}: its encoded arguments are {size:,} bytes, "
            f"over the limit of {limit:,} (OPTIONS['MAX_PAYLOAD_BYTES']).",
            limit=limit,
            size=size,
        )
    key = rules.breaker_key(args, kwargs)
    shown_args, shown_kwargs = display_call(encoded_args, encoded_kwargs, args_text, kwargs_text)
    return Call(task_id, args, kwargs, args_text, kwargs_text, shown_args, shown_kwargs, key)


def rows(settings: BackendSettings, envelope: Envelope) -> list[dict[str, Any]]:
    """The write step's columns, one dict per call; the columns every row of the batch
    shares are worked out once, from the envelope as the middleware left it."""
    task = envelope.task
    metadata = envelope.metadata
    metadata_text = (
        EMPTY_TEXT
        if not metadata
        else encode_metadata(metadata, f"Cannot enqueue {task.module_path}")
    )
    now = envelope.enqueued_at
    shared = {
        "task_path": task.module_path,
        "backend_name": settings.alias,
        "queue_name": resolve_queue(settings, task),
        "priority": task.priority,
        "status": compat.TaskResultStatus.READY.value,
        # The claim needs a time; results show what the caller gave (None: "as soon as
        # possible"), which retries and deferrals never move.
        "run_after": task.run_after or now,
        "requested_run_after": task.run_after,
        "attempt": 0,
        "worker_ids": JsonText("[]"),
        "errors": JsonText("[]"),
        "enqueued_at": now,
        "dead_letter_reason": "",
        "ordering_key": getattr(task, "ordering_key", None),
        "ordering_blocked": False,
        "dedup_key": getattr(task, "dedup_key", None),
        "cancel_requested": False,
        "metadata": JsonText(metadata_text),
    }
    return [
        {
            "id": call.id,
            **shared,
            "args": JsonText(call.args_text),
            "kwargs": JsonText(call.kwargs_text),
            "breaker_key": call.breaker_key,
        }
        for call in envelope.calls
    ]


def _utf8_length(text: str) -> int:
    """Bytes of ``text`` in UTF-8; raises ``UnicodeEncodeError`` for a lone surrogate."""
    return len(text) if text.isascii() else len(text.encode())
