"""Turning one call of a task into the row to insert: validated, encoded, sized.

Pure apart from the clock value it is given, so every bad-input rule (queue, schema,
arity, serializability, size) is decided here, before any SQL, and nothing is written
when one fails.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, NamedTuple

from . import compat
from .binding import bind_payload
from .codec import EncodeError, display_call, dumps, encode_call, unencodable_call_error
from .conf import BackendSettings
from .db.values import JsonText
from .definition import breaker_key, check_arguments, compiled_schema
from .exceptions import InvalidTaskArguments, PayloadTooLarge

logger = logging.getLogger("django_tasks_plus")

_fallbacks_logged: set[tuple[str, str, str]] = set()


class Envelope(NamedTuple):
    """One task row ready to insert, plus what its ``TaskResult`` shows.

    A named tuple: a bulk enqueue builds one per task, and a frozen dataclass's
    ``__init__`` cost more than the encoding.
    """

    id: str  # a random (version 4) UUID in its canonical text form
    values: dict[str, Any]
    shown_args: list[Any]
    shown_kwargs: dict[str, Any]

    @property
    def queue_name(self) -> str:
        return self.values["queue_name"]


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


def _payload(
    task: compat.Task, args: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments to store: validated by the schema if the task has one."""
    schema = compiled_schema(task)
    if schema is None:
        args, kwargs = tuple(args), dict(kwargs)
        check_arguments(task, args, kwargs)
        return args, kwargs
    payload = bind_payload(task.func, args, kwargs, takes_context=task.takes_context)
    # Stored by name, so a later deploy can re-validate it against the schema.
    return (), schema.validate(payload)


def build_envelopes(
    settings: BackendSettings,
    task: compat.Task,
    calls: Iterable[tuple[Sequence[Any], Mapping[str, Any]]],
    *,
    now: datetime,
) -> list[Envelope]:
    """Validate and encode every call; raise a typed error before anything is written.

    The columns every row of the batch shares are worked out once, not per call.
    """
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
        "breaker_key": None,
    }
    limit = settings.max_payload_bytes
    calls = list(calls)
    return [
        _envelope(task, shared, limit, task_id, args, kwargs)
        for task_id, (args, kwargs) in zip(new_task_ids(len(calls)), calls, strict=True)
    ]


def _envelope(
    task: compat.Task,
    shared: dict[str, Any],
    limit: int | None,
    task_id: str,
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
) -> Envelope:
    stored_args, stored_kwargs = _payload(task, args, kwargs)
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
    values = {"id": task_id, **shared, "args": JsonText(args_text)}
    values["kwargs"] = JsonText(kwargs_text)
    if getattr(task, "breaker", None) is not None:
        values["breaker_key"] = breaker_key(task, args, kwargs)
    shown_args, shown_kwargs = display_call(encoded_args, encoded_kwargs, args_text, kwargs_text)
    return Envelope(task_id, values, shown_args, shown_kwargs)


def _utf8_length(text: str) -> int:
    """Bytes of ``text`` in UTF-8; raises ``UnicodeEncodeError`` for a lone surrogate."""
    return len(text) if text.isascii() else len(text.encode())
