"""Task metadata: the open map on every task row where features keep their per-call data.

A feature (a schedule, a tracer, a group, a tenant) stores what it needs about one task
under keys of its own, instead of adding a column and threading it through the engine.
Enqueue middleware writes the map (``envelope.Envelope.with_metadata``); the worker hands
it, decoded, to execution middleware (``Attempt.metadata``) and to the task
(``TaskContext.metadata``); ``django_tasks_plus.get_metadata(result)`` reads it from any
process.

Values follow the argument codec's rules (``codec.py``): plain JSON, plus its tagged
types (``datetime``, ``Decimal``, ``UUID``…), which come back unchanged. Keys are short
names (``key_problem``). The encoded map may take at most ``METADATA_MAX_BYTES``.

Each key lives for a *call* (the default: it survives a redrive, like a schedule's
occurrence, a trace context or a group id) or for a *run* (a redrive clears it, like how
long the last run was held). ``register_key`` declares a key's lifetime; redrive reads
``run_keys()``. Pure: no Django, no I/O.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Literal

from .codec import DecodeError, EncodeError, dumps, from_json, to_json
from .exceptions import InvalidTaskArguments, PayloadTooLarge
from .limits import METADATA_KEY_MAX_LENGTH, METADATA_MAX_BYTES

Lifetime = Literal["call", "run"]
LIFETIMES: tuple[Lifetime, ...] = ("call", "run")

EMPTY: Mapping[str, Any] = MappingProxyType({})
"""The metadata of a task that has none (shared, read-only)."""

EMPTY_TEXT = "{}"
"""The stored form of no metadata."""


@dataclass(frozen=True, slots=True)
class MetadataKey:
    """A declared metadata key: its name, its lifetime and what it is for."""

    name: str
    lifetime: Lifetime = "call"
    description: str = ""


class MetadataKeys:
    """The declared keys, by name. Declaring is idempotent; a second declaration of a
    name with another lifetime is refused, since two features would then disagree on
    what a redrive does to it."""

    def __init__(self) -> None:
        self._keys: dict[str, MetadataKey] = {}
        self._lock = threading.Lock()
        self._run_keys: tuple[str, ...] = ()

    def register(
        self, name: str, *, lifetime: Lifetime = "call", description: str = ""
    ) -> MetadataKey:
        problem = key_problem(name)
        if problem:
            raise ValueError(f"Metadata key {name!r} {problem}")
        if lifetime not in LIFETIMES:
            raise ValueError(
                f"Metadata key {name!r}: lifetime must be 'call' (kept by a redrive) or "
                f"'run' (cleared by a redrive), got {lifetime!r}."
            )
        key = MetadataKey(name, lifetime, description)
        with self._lock:
            known = self._keys.get(name)
            if known is not None:
                if known.lifetime != lifetime:
                    raise ValueError(
                        f"Metadata key {name!r} is already declared with lifetime "
                        f"{known.lifetime!r}; it cannot also be {lifetime!r}."
                    )
                return known
            self._keys[name] = key
            self._run_keys = tuple(
                sorted(k.name for k in self._keys.values() if k.lifetime == "run")
            )
        return key

    def get(self, name: str) -> MetadataKey:
        """The declaration of ``name``; an undeclared key lives for a call."""
        return self._keys.get(name) or MetadataKey(name)

    def run_keys(self) -> tuple[str, ...]:
        """The keys a redrive clears, sorted."""
        return self._run_keys

    def unregister(self, name: str) -> None:
        """Forget a declaration (tests)."""
        with self._lock:
            self._keys.pop(name, None)
            self._run_keys = tuple(k for k in self._run_keys if k != name)


KEYS = MetadataKeys()
"""The process's declared keys: features declare theirs when their module is imported."""


def register_key(name: str, *, lifetime: Lifetime = "call", description: str = "") -> MetadataKey:
    """Declare a metadata key: ``lifetime="call"`` survives a redrive, ``"run"`` does not.

    Declare at import time of the module that owns the key, as a model declares a field.
    """
    return KEYS.register(name, lifetime=lifetime, description=description)


def run_keys() -> tuple[str, ...]:
    """The declared keys that a redrive clears."""
    return KEYS.run_keys()


_KEY = re.compile(r"[A-Za-z0-9_.:/-]+")


def key_problem(name: Any) -> str | None:
    """Why ``name`` cannot be a metadata key, or None.

    Keys are plain names (letters, digits, ``_ . : / -``), so every database can address
    one inside the stored object (a redrive removes per-run keys in SQL)."""
    if not isinstance(name, str) or not name or len(name) > METADATA_KEY_MAX_LENGTH:
        return (
            f"must be a non-empty string of at most {METADATA_KEY_MAX_LENGTH} characters"
            f" (got a {type(name).__name__})."
        )
    if not _KEY.fullmatch(name):
        return "may hold only letters, digits and _ . : / - characters."
    return None


def encode_metadata(metadata: Mapping[str, Any], where: str) -> str:
    """The stored JSON text of ``metadata``; raise a typed error naming ``where`` and the
    offending key before anything is written.

    The map stays a plain JSON object (each value is encoded on its own), so the database
    can remove a key in place (a redrive does).
    """
    if not metadata:
        return EMPTY_TEXT
    if not isinstance(metadata, Mapping):
        raise InvalidTaskArguments(f"{where}: metadata must be a dict, got {metadata!r}.")
    encoded: dict[str, Any] = {}
    for name, value in metadata.items():
        problem = key_problem(name)
        if problem:
            raise InvalidTaskArguments(
                f"{where}: metadata key {name!r} {problem}", field_path=("metadata",)
            )
        try:
            encoded[name] = to_json(value, f"metadata[{name!r}]")
        except EncodeError as exc:
            raise InvalidTaskArguments(
                f"{where}: {exc}", field_path=("metadata", name, *exc.field_path[1:])
            ) from exc
    text = dumps(encoded)
    size = len(text) if text.isascii() else len(text.encode())
    if size > METADATA_MAX_BYTES:
        raise PayloadTooLarge(
            f"{where}: its encoded metadata is {size:,} bytes, over the limit of "
            f"{METADATA_MAX_BYTES:,}.",
            limit=METADATA_MAX_BYTES,
            size=size,
        )
    return text


def decode_metadata(stored: Any) -> Mapping[str, Any]:
    """The stored map (parsed JSON), decoded and read-only.

    Raises ``DecodeError`` for anything no enqueue writes (not an object, a bad tag):
    a worker dead-letters such a row instead of running it with half its context.
    """
    if stored is None or (isinstance(stored, dict) and not stored):
        return EMPTY
    if not isinstance(stored, dict):
        raise DecodeError("metadata", f"is a {type(stored).__name__}, not an object.")
    return MappingProxyType(
        {name: from_json(value, f"metadata[{name!r}]") for name, value in stored.items()}
    )
