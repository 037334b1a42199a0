"""Reading type annotations: what a field's annotation says once its wrappers are stripped,
which fields a dataclass or TypedDict has and which are required, the annotation of an item
inside a container, and a readable name for an annotation. Pure: no values are checked here
(``schema.py`` checks them with msgspec)."""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import re
import types
import typing
from functools import lru_cache
from typing import Any

from .exceptions import InvalidTaskOptions

WRAPPERS: tuple[Any, ...] = (typing.Annotated, typing.Required, typing.NotRequired)
WRAPPERS += (typing.Final, getattr(typing, "ReadOnly", typing.Final))
UNIONS = (typing.Union, types.UnionType)
CONTAINERS: tuple[Any, ...] = (list, tuple, dict, set, frozenset, cabc.Set, cabc.MutableSet)
CONTAINERS += (cabc.Sequence, cabc.MutableSequence, cabc.Collection, cabc.Iterable)
CONTAINERS += (cabc.Mapping, cabc.MutableMapping)


def describe(tp: object) -> str:
    """A readable name for an annotation: ``list[int]``, ``int | None``, ``User``."""
    if typing.get_origin(tp) in UNIONS:
        return " | ".join(describe(arm) for arm in typing.get_args(tp))
    if tp is None or tp is type(None):
        return "None"
    if isinstance(tp, type):
        return tp.__qualname__
    if typing.get_origin(tp) in CONTAINERS and typing.get_args(tp):  # Optional[X] inside too
        items = ("..." if arg is Ellipsis else describe(arg) for arg in typing.get_args(tp))
        return f"{describe(typing.get_origin(tp))}[{', '.join(items)}]"
    return re.sub(r"(?<![\w.'\"])(?:[a-z_]\w*\.)+", "", repr(tp))  # no module paths


def unwrap(tp: Any) -> Any:
    """Strip ``Annotated``/``Required``/``Final``..., follow ``NewType`` and ``type`` aliases."""
    while True:
        if typing.get_origin(tp) in WRAPPERS:
            tp = typing.get_args(tp)[0]
        elif hasattr(tp, "__supertype__"):  # typing.NewType
            tp = tp.__supertype__
        elif type(tp).__name__ == "TypeAliasType":  # a ``type X = ...`` statement
            tp = tp.__value__
        else:
            return tp


def is_record(tp: object) -> bool:
    """A dataclass or a TypedDict (``typing``'s or ``typing_extensions``')."""
    typeddict = isinstance(tp, type) and issubclass(tp, dict) and hasattr(tp, "__total__")
    return typeddict or (isinstance(tp, type) and dataclasses.is_dataclass(tp))


@lru_cache(maxsize=1024)
def type_hints(cls: type) -> dict[str, Any]:
    """A class's resolved annotations, extras kept; unresolvable ones fail the definition."""
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:  # NameError for a missing forward reference, and friends
        raise InvalidTaskOptions(
            f"the schema {cls.__module__}.{cls.__qualname__} has type hints that cannot be "
            f"resolved: {type(exc).__name__}: {exc}"
        ) from exc


def record_fields(cls: type, hints: dict[str, Any]) -> tuple[list[str], set[str]]:
    """The field names of a dataclass or TypedDict and the required ones; a TypedDict's
    ``Required``/``NotRequired`` are read from the resolved hints (3.11 misses strings)."""
    if dataclasses.is_dataclass(cls):
        fields = [field for field in dataclasses.fields(cls) if field.init]
        missing = dataclasses.MISSING
        no_default = {f.name for f in fields if f.default is missing is f.default_factory}
        return [field.name for field in fields], no_default
    required = set(getattr(cls, "__required_keys__", hints))
    for name, hint in hints.items():
        while (origin := typing.get_origin(hint)) in WRAPPERS:
            if origin in (typing.Required, typing.NotRequired):
                (required.add if origin is typing.Required else required.discard)(name)
            hint = typing.get_args(hint)[0]
    return list(hints), required


def child(tp: Any, key: Any, of_key: bool = False) -> Any:
    """The annotation of ``key`` (or of the key itself) in a value annotated ``tp``, or None."""
    tp = unwrap(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in UNIONS:
        in_arms = (child(arm, key, of_key) for arm in args)
        return next((found for found in in_arms if found is not None), None)
    if is_record(tp):
        return type_hints(tp).get(key)
    if origin not in CONTAINERS or not args:
        return Any if tp is Any or tp in CONTAINERS or origin in CONTAINERS else None
    if origin is tuple and args[-1] is not Ellipsis:
        return args[key] if isinstance(key, int) and key < len(args) else None
    return args[1] if issubclass(origin, cabc.Mapping) and not of_key else args[0]
