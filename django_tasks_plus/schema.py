"""Payload schemas: a task's payload (its arguments by name, see ``binding.py``) checked at
enqueue and again in the worker, so a stored payload that no longer fits is dead-lettered.

A dataclass or TypedDict schema is *lowered* once, at definition time, into msgspec structs
that refuse unknown fields and checked by ``msgspec.convert(strict=True)``. What msgspec
refuses (some unions, pydantic models, a class met again while its struct is built) becomes
a *fallback* class checked through ``_dec_hook``; an annotation nothing can check fails the
definition. msgspec's error path is walked through the payload and the annotations, so
messages read ``payload['user']['age'] must be int, got str ('x')``.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import enum
import re
import sys
import threading
import typing
from collections.abc import Callable, Mapping, Sequence
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any
from uuid import UUID

import msgspec

from .exceptions import InvalidTaskArguments, InvalidTaskOptions
from .typehints import (
    CONTAINERS,
    UNIONS,
    child,
    describe,
    is_record,
    record_fields,
    type_hints,
    unwrap,
)

FieldPath = tuple[Any, ...]

ACCEPTED_KINDS = (
    "a dataclass, a TypedDict or a pydantic model class, or a callable that takes the "
    "payload dict and returns it"
)
# Values the codec restores as themselves: a str is *not* a datetime here (no coercion).
_BUILTINS = (datetime, date, time, timedelta, Decimal, UUID, bytes, bytearray)
_STEP = re.compile(r"\.([^.\[`]+)|\[(\d+|\.\.\.)\]")  # the steps of msgspec's `$.a[0].b`


class _Invalid(ValueError):
    """A value did not fit; ``path`` is where the message points. A ``ValueError``, so a
    fallback check raising it in ``_dec_hook`` comes back as msgspec's ``__cause__``."""

    def __init__(self, path: FieldPath, problem: str, field_path: FieldPath | None = None):
        super().__init__(problem)
        self.path, self.problem = path, problem
        self.field_path = path if field_path is None else field_path

    def under(self, path: FieldPath) -> _Invalid:
        """The same error, for a value found at ``path``."""
        moved = _Invalid((*path, *self.path), self.problem, (*path, *self.field_path))
        moved.__cause__ = self.__cause__
        return moved


def render_path(path: FieldPath) -> str:
    """``('user', 'tags', 0)`` -> ``payload['user']['tags'][0]``."""
    return "payload" + "".join(f"[{key!r}]" for key in path)


def _got(value: object) -> str:
    """``got str ('x')``: the type and a short repr, so long values keep messages short."""
    text = repr(value)
    return f"got {type(value).__name__} ({text[:57] + '...' if len(text) > 60 else text})"


def _must(tp: object) -> str:
    """What ``must be`` says for an annotation, enums and literals listing their choices."""
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(repr(arg) for arg in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = [repr(member.value) for member in tp]
        shown = ", ".join(values[:10]) + (", ..." if len(values) > 10 else "")
        return f"{tp.__qualname__} (a member or one of {shown})"
    return f"a dict of {describe(tp)} fields" if is_record(tp) else describe(tp)


def _is_pydantic_model(obj: object) -> bool:
    """A pydantic v2 model class (pydantic is optional: a model means it is imported)."""
    pydantic = sys.modules.get("pydantic")
    return pydantic is not None and isinstance(obj, type) and issubclass(obj, pydantic.BaseModel)


# --- lowering annotations to what msgspec checks --------------------------------------


class _Fallback:
    """Base of the classes msgspec hands to ``_dec_hook``: ``check`` raises ``_Invalid``."""

    check: Callable[[Any], None]


def _fallback(tp: object, check: Callable[[Any], None]) -> type[_Fallback]:
    return type(describe(tp), (_Fallback,), {"check": staticmethod(check)})


def _dec_hook(tp: type, value: Any) -> Any:
    """A fallback's check, or an instance check for any other class msgspec does not know."""
    if issubclass(tp, _Fallback):
        tp.check(value)
        return object.__new__(tp)  # msgspec wants an instance of the type it asked for
    try:
        if isinstance(value, tp):
            return value
    except TypeError:  # a Protocol that is not runtime_checkable: nothing to check
        return value
    raise ValueError("not an instance")  # the message names the annotation, not this class


_OPTIONS: dict[str, Any] = {"strict": True, "dec_hook": _dec_hook, "builtin_types": _BUILTINS}
_OPTIONS["from_attributes"] = True  # a dataclass instance is checked by its attributes


def _lower(tp: object) -> Any:
    """The type msgspec checks for an annotation (classes cached by ``_struct``)."""
    tp = unwrap(tp)
    return _struct(tp) if is_record(tp) else _lower_other(tp)  # type: ignore[arg-type]


@lru_cache(maxsize=1024)
def _lower_other(tp: Any) -> Any:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp in (Any, None, type(None), Ellipsis, object):  # Ellipsis: tuple[int, ...]
        return Any if tp is object else tp
    if origin in UNIONS:
        union = typing.Union[tuple(_lower(arm) for arm in args)]  # type: ignore[valid-type]  # noqa: UP007
        return union if _supported(union) else _fallback(tp, lambda v: _one_of(tp, args, v))
    if _is_pydantic_model(tp):
        return _fallback(tp, lambda value: _check_pydantic(tp, value))
    lowered = tp
    if origin in CONTAINERS and args:  # msgspec checks an Iterable as a list, item by item
        lowered = (cabc.Collection if origin is cabc.Iterable else origin)[tuple(map(_lower, args))]
    known = origin in (typing.Literal, *CONTAINERS) or (origin is None and isinstance(tp, type))
    if not known or tp is cabc.Callable or not _supported(lowered):
        raise InvalidTaskOptions(f"{describe(tp)} cannot be checked")
    return lowered


def _supported(lowered: Any) -> bool:
    """Whether msgspec takes a type (it raises TypeError for unions and enums it refuses)."""
    try:
        msgspec.inspect.type_info(lowered)
    except TypeError:
        return False
    return True


def _one_of(tp: object, arms: tuple[Any, ...], value: Any) -> None:
    """The fallback check of a union, arm by arm. On error, the error of the arm the value
    was shaped for (the only one with an error inside the value), else ``must be`` ``tp``."""
    errors = []
    for arm in arms:
        if (error := _first_error(value, arm, ())) is None:
            return
        errors.append(error)
    deeper = [error for error in errors if error.field_path]
    raise deeper[0] if len(deeper) == 1 else _Invalid((), f"must be {_must(tp)}, {_got(value)}")


_STRUCTS: dict[type, Any] = {}
_LOCK = threading.RLock()
_BUILDING: set[type] = set()


def _struct(cls: type) -> Any:
    """A msgspec struct with the fields of a dataclass or TypedDict, refusing unknown keys.
    A class met again while its own struct is built (a tree of nodes) is checked lazily."""
    if cls in _STRUCTS:
        return _STRUCTS[cls]
    if cls in _BUILDING:
        return _fallback(cls, lambda value: _one_of(cls, (cls,), value))
    hints = type_hints(cls)
    names, required = record_fields(cls, hints)
    with _LOCK:
        _BUILDING.add(cls)
        try:
            specs: list[Any] = []
            rename: dict[str, str] = {}  # keys that cannot be attribute names get one
            for index, name in enumerate(names):
                try:
                    lowered = _lower(hints.get(name, Any))
                except InvalidTaskOptions as exc:  # the path to the field, from the outside in
                    raise InvalidTaskOptions(f"field {cls.__qualname__}.{name}: {exc}") from None
                attr = name if name.isidentifier() and not name.startswith("__") else f"f{index}"
                rename[attr] = name
                specs.append((attr, lowered) if name in required else (attr, lowered, None))
            specs.sort(key=len)  # msgspec wants required fields first
            struct = msgspec.defstruct(
                cls.__qualname__, specs, forbid_unknown_fields=True, rename=rename
            )
        finally:
            _BUILDING.discard(cls)
    _STRUCTS[cls] = struct
    return struct


# --- explaining an error ---------------------------------------------------------------


def _first_error(value: Any, tp: object, path: FieldPath, lowered: Any = None) -> _Invalid | None:
    """None if ``value`` fits the annotation ``tp`` (``lowered``, if known), else where and
    why it does not: msgspec's error, its path walked through the value and the annotations."""
    try:
        msgspec.convert(value, _lower(tp) if lowered is None else lowered, **_OPTIONS)
        return None
    except msgspec.ValidationError as exc:
        message, cause = str(exc), exc.__cause__
    at = re.search(r" - at `(key` in `)?\$(.*)`$", message, re.DOTALL)
    for name, index in _STEP.findall(at[2] if at else ""):
        if index == "..." or (index and not isinstance(value, Sequence)):  # dict values, sets
            return _in_collection(value, tp, path)
        key: Any = int(index) if index else name
        value = value[key] if isinstance(value, Mapping | Sequence) else getattr(value, key)
        tp, path = child(tp, key), (*path, key)
    if isinstance(cause, _Invalid):  # a fallback check said where and why
        return cause.under(path)
    if at and at[1]:  # a dict's key: msgspec does not say which
        return _in_collection(value, tp, path)
    tp = unwrap(tp)
    if field := re.match(
        r"Object (missing required|contains unknown) field `(.*?)`( - |$)", message
    ):
        kind = "is missing required" if field[1] == "missing required" else "has unknown"
        return _Invalid(path, f"{kind} field {field[2]!r}", (*path, field[2]))
    if " of length " in message:  # a fixed tuple
        count = len(typing.get_args(tp))
        return _Invalid(path, f"must have {count} items ({describe(tp)}), got {len(value)}")
    return _Invalid(path, f"must be {_must(tp)}, {_got(value)}")


def _in_collection(value: Any, tp: object, path: FieldPath) -> _Invalid:
    """The first bad key or value of a dict, or item of a set: msgspec does not say which."""
    keyed = isinstance(value, Mapping)
    for key, item in value.items() if keyed else enumerate(value):
        if keyed and (found := _first_error(key, child(tp, key, of_key=True), path)):
            return _Invalid(path, f"has an invalid key {key!r}: {found.problem}")
        if found := _first_error(item, child(tp, key), (*path, key) if keyed else path):
            return found if keyed else _Invalid(path, f"has an invalid item: {found.problem}")
    return _Invalid(path, f"must be {describe(unwrap(tp))}, {_got(value)}")


def _check_pydantic(model: Any, value: Any) -> None:
    """``model_validate``, its first error raised as ours with its ``loc`` as the field path.
    The caller's values are kept, not pydantic's coerced ones."""
    import pydantic

    if isinstance(value, model):
        return
    try:
        model.model_validate(value)
    except pydantic.ValidationError as exc:
        errors = exc.errors()
        first, loc, more = errors[0], tuple(errors[0]["loc"]), len(errors) - 1
        suffix = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
        if first["type"] in ("missing", "extra_forbidden") and loc:
            kind = "is missing required" if first["type"] == "missing" else "has unknown"
            raise _Invalid(loc[:-1], f"{kind} field {loc[-1]!r}{suffix}", loc) from exc
        got = f", {_got(first['input'])}" if "input" in first else ""
        raise _Invalid(loc, f"is invalid: {first['msg']}{got}{suffix}") from exc
    except Exception as exc:  # whatever a validator raises
        raise _Invalid((), f"is invalid: {type(exc).__name__}: {exc}") from exc


# --- public schemas -----------------------------------------------------------------------


class PayloadSchema:
    """A compiled ``schema=`` option: ``validate(payload)`` returns the payload (a callable
    schema may normalize it) or raises ``InvalidTaskArguments`` naming the bad value."""

    def __init__(self, schema: Any, where: str, kind: str) -> None:
        self.schema, self.where, self.kind = schema, where, kind
        if kind != "callable":
            try:  # lowered now, so an annotation nothing can check fails the definition
                self.struct = _lower(schema)
            except InvalidTaskOptions as exc:
                raise InvalidTaskOptions(f"{where}: schema {schema.__qualname__}: {exc}") from None

    def __repr__(self) -> str:
        name = getattr(self.schema, "__qualname__", None) or repr(self.schema)
        return f"<PayloadSchema {self.kind} {name} for {self.where}>"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            if self.kind == "callable":
                return self._call(payload)
            if not isinstance(payload, Mapping):
                raise _Invalid((), f"must be a dict, {_got(payload)}")
            if (error := _first_error(payload, self.schema, (), self.struct)) is not None:
                raise error
            return payload
        except _Invalid as exc:
            text = f"{self.where}(): {render_path(exc.path)} {exc.problem}"
            raise InvalidTaskArguments(text, field_path=exc.field_path) from exc.__cause__

    def _call(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            result = self.schema(dict(payload))  # a copy: the caller's dict is not touched
        except (ValueError, TypeError, AssertionError) as exc:
            raise _Invalid((), f"is invalid: {str(exc) or type(exc).__name__}") from exc
        except Exception as exc:  # likely a bug in the schema function itself: say what kind
            raise _Invalid((), f"is invalid: {type(exc).__name__}: {exc}") from exc
        if not isinstance(result, dict):
            text = f"{self.where}(): schema callable must return the payload dict, got "
            raise InvalidTaskArguments(text + type(result).__name__)
        return result


def compile_schema(schema: object, *, where: str) -> PayloadSchema:
    """Check a ``schema=`` option at definition time and prepare it for validation. ``where``
    is the task's path, for messages; anything but the accepted kinds is refused."""
    if isinstance(schema, type) and typing.get_origin(schema) is None:
        if dataclasses.is_dataclass(schema) or is_record(schema) or _is_pydantic_model(schema):
            kind = "dataclass" if dataclasses.is_dataclass(schema) else "typeddict"
            return PayloadSchema(schema, where, "pydantic" if _is_pydantic_model(schema) else kind)
        raise InvalidTaskOptions(
            f"{where}: schema {schema.__qualname__} is a class but not a dataclass, TypedDict "
            f"or pydantic model; schema must be {ACCEPTED_KINDS}."
        )
    if dataclasses.is_dataclass(schema):
        raise InvalidTaskOptions(
            f"{where}: schema is an instance of the dataclass {type(schema).__qualname__}; "
            "pass the class itself."
        )
    if callable(schema) and typing.get_origin(schema) is None:
        return PayloadSchema(schema, where, "callable")
    raise InvalidTaskOptions(
        f"{where}: schema must be {ACCEPTED_KINDS}, got {type(schema).__name__} ({schema!r})."
    )


__all__ = ["PayloadSchema", "compile_schema", "render_path"]
