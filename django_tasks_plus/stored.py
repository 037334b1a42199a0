"""Reading JSON columns that a person, a script or a bug may have corrupted.

Rows are written by the backend and the worker, but they live in an ordinary table: an
UPDATE by hand, a restore gone wrong or a bug elsewhere can leave text that is not JSON
(SQLite stores any text) or JSON of the wrong shape. One such row must never stop a
worker from claiming the others, and nothing it holds may be thrown away silently:

* ``args``/``kwargs`` that are not JSON become ``CorruptJson``; the worker dead-letters
  the row with the parser's message (see ``worker.execution.prepare_call``). So does JSON
  nested too deeply for Python's parser (about 1,500 levels; PostgreSQL's ``jsonb`` takes
  about 12,000), which would otherwise raise ``RecursionError`` in the middle of a claim.
* ``errors`` that are not a list of error objects are kept as one error entry naming
  ``CorruptTaskRecord``, with the stored text in it, so later attempts append after it.
* ``worker_ids`` are bookkeeping: anything but a list of strings reads as empty.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from .codec import loads

CORRUPT_ERROR_PATH = "django_tasks_plus.exceptions.CorruptTaskRecord"
_KEPT_TEXT_LIMIT = 10_000


@dataclass(frozen=True)
class CorruptJson:
    """A column whose stored text is not JSON; ``text`` is what was there."""

    text: str
    problem: str


TOO_DEEP_TO_PARSE = "nested too deeply to parse"


def parse_column(value: Any) -> Any:
    """A JSON column's value: decoded if it arrived as text, ``CorruptJson`` if unparsable.

    Never raises for what a row holds: one bad row must not fail the claim of the others.
    """
    if not isinstance(value, str | bytes):
        return value
    try:
        return loads(value)
    except ValueError as exc:  # json.JSONDecodeError, UnicodeDecodeError
        return CorruptJson(_text(value), str(exc))
    except RecursionError:
        return CorruptJson(_text(value), TOO_DEEP_TO_PARSE)


def _text(value: str | bytes) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def worker_id_list(value: Any) -> tuple[str, ...]:
    """The ``worker_ids`` column as a tuple of ids; a corrupt value reads as none."""
    if isinstance(value, str) and len(value) <= _CACHED_TEXT_LIMIT:
        return _worker_ids_from_text(value)
    return _worker_ids(value)


# Longer texts (many attempts, or a hostile row) are decoded each time, not kept.
_CACHED_TEXT_LIMIT = 1_000


@lru_cache(maxsize=256)
def _worker_ids_from_text(text: str) -> tuple[str, ...]:
    """Decoded once per distinct text: a claim returns thousands of rows a second whose
    ``worker_ids`` read the same (``["<this worker>"]`` on every first attempt)."""
    return _worker_ids(text)


def _worker_ids(value: Any) -> tuple[str, ...]:
    if value == "[]":  # a fresh task's: no decoding
        return ()
    value = parse_column(value)
    if isinstance(value, list | tuple) and all(isinstance(item, str) for item in value):
        return tuple(value)
    return ()


def error_list(value: Any) -> tuple[Mapping[str, Any], ...]:
    """The ``errors`` column as error entries; a corrupt value becomes one entry keeping it."""
    if value == "[]":  # a first attempt's: no decoding
        return ()
    value = parse_column(value)
    if value is None:
        return ()
    if isinstance(value, list | tuple) and all(isinstance(item, Mapping) for item in value):
        return tuple(value)
    text = value.text if isinstance(value, CorruptJson) else repr(value)
    if len(text) > _KEPT_TEXT_LIMIT:
        text = f"{text[:_KEPT_TEXT_LIMIT]}… ({len(text):,} characters)"
    return (
        {
            "exception_class_path": CORRUPT_ERROR_PATH,
            "traceback": (
                "The row's errors column held a value that is not a list of errors; "
                f"it is kept here as it was: {text}"
            ).replace("\x00", "\\x00"),
        },
    )
