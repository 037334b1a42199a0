"""Payload schemas: a task's payload (its arguments by name, see ``binding.py``) checked at
enqueue and again in the worker, so a stored payload that no longer fits is dead-lettered.

A dataclass or TypedDict schema is *lowered* once, at definition time, into a msgspec
struct that refuses unknown fields, checked with ``msgspec.convert(strict=True)``. What
msgspec cannot check (unions it refuses, nested pydantic models, self-references, other
classes) becomes a *marker* class that msgspec hands to ``_dec_hook``; annotations nothing
can check (TypeVar, unresolved names, Callable) fail the definition. msgspec's error path
is walked through the payload and the original annotations, so messages read
``payload['user']['age'] must be int, got str ('x')`` and carry a ``field_path``.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import enum
import re
import threading
import types
import typing
from collections import deque
from collections.abc import Callable, Mapping
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from functools import lru_cache
from typing import Any
from uuid import UUID

import msgspec

from .exceptions import InvalidTaskArguments, InvalidTaskOptions

FieldPath = tuple[Any, ...]

ACCEPTED_KINDS = (
    "a dataclass, a TypedDict or a pydantic model class, or a callable that takes the "
    "payload dict and returns it"
)
_WRAPPERS = tuple(
    form
    for form in (typing.Annotated, typing.Required, typing.NotRequired, typing.Final)
    + ((typing.ReadOnly,) if hasattr(typing, "ReadOnly") else ())
)
_TYPE_ALIAS = getattr(typing, "TypeAliasType", None)
_UNION_ORIGINS = (typing.Union, types.UnionType)
_CONTAINERS: tuple[Any, ...] = (list, tuple, set, frozenset, dict, deque, cabc.Sequence)
_CONTAINERS += (cabc.Collection, cabc.Iterable, cabc.MutableSequence, cabc.Set, cabc.MutableSet)
_CONTAINERS += (cabc.Mapping, cabc.MutableMapping)
# Values the codec restores as themselves: a str is *not* a datetime here (no coercion).
_BUILTINS = (datetime, date, time, timedelta, Decimal, UUID, bytes, bytearray)
_AT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")


class _Invalid(Exception):
    """Internal: a value did not fit; ``path`` is where the message points."""

    def __init__(self, path: FieldPath, problem: str, field_path: FieldPath | None = None):
        super().__init__(problem)
        self.path, self.problem = path, problem
        self.field_path = path if field_path is None else field_path

    def render(self) -> str:
        return f"{render_path(self.path)} {self.problem}"


def render_path(path: FieldPath) -> str:
    """``('user', 'tags', 0)`` -> ``payload['user']['tags'][0]``."""
    return "payload" + "".join(f"[{key!r}]" for key in path)


def _error(where: str, field_path: FieldPath, text: str) -> InvalidTaskArguments:
    return InvalidTaskArguments(f"{where}(): {text}", field_path=field_path)


def _got(value: object) -> str:
    """``got str ('x')``: the type and a short repr, so long values keep messages short."""
    text = repr(value)
    return f"got {type(value).__name__} ({text[:57] + '...' if len(text) > 60 else text})"


def _describe(tp: object) -> str:
    """A readable name for an annotation: ``list[int]``, ``int | None``, ``User``."""
    if tp is None or tp is type(None):
        return "None"
    if isinstance(tp, list):  # Callable's parameters
        return f"[{', '.join(_describe(arg) for arg in tp)}]"
    if tp is Ellipsis or tp is Any:
        return "..." if tp is Ellipsis else "Any"
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNION_ORIGINS:
        return " | ".join(_describe(arg) for arg in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(arg) for arg in args)}]"
    if origin is not None:
        name = getattr(origin, "__qualname__", None) or repr(origin).replace("typing.", "")
        if origin is tuple and not args:
            return "tuple[()]"
        return f"{name}[{', '.join(_describe(arg) for arg in args)}]" if args else name
    return tp.__qualname__ if isinstance(tp, type) else repr(tp).replace("typing.", "")


def _must(tp: object) -> str:
    """What ``must be`` says for an annotation, enums and literals listing their choices."""
    if typing.get_origin(tp) is typing.Literal:
        return "one of " + ", ".join(repr(arg) for arg in typing.get_args(tp))
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        values = [repr(member.value) for member in tp]
        shown = ", ".join(values[:10]) + (", ..." if len(values) > 10 else "")
        return f"{tp.__qualname__} (a member or one of {shown})"
    if _is_struct(tp):
        return f"a dict of {tp.__qualname__} fields"  # type: ignore[attr-defined]
    return _describe(tp)


def _unwrap(tp: object) -> object:
    """Strip ``Annotated``/``Required``/``Final``..., follow ``NewType`` and ``type`` aliases."""
    while True:
        if typing.get_origin(tp) in _WRAPPERS:
            tp = typing.get_args(tp)[0]
        elif hasattr(tp, "__supertype__"):  # typing.NewType
            tp = tp.__supertype__
        elif _TYPE_ALIAS is not None and isinstance(tp, _TYPE_ALIAS):
            tp = tp.__value__
        else:
            return tp


def _is_typeddict(cls: object) -> bool:
    """``typing.is_typeddict``, plus TypedDicts from ``typing_extensions``."""
    return typing.is_typeddict(cls) or (
        isinstance(cls, type) and issubclass(cls, dict) and hasattr(cls, "__required_keys__")
    )


@lru_cache(maxsize=1024)
def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:  # NameError for a missing forward reference, and friends
        raise InvalidTaskOptions(
            f"the schema {cls.__module__}.{cls.__qualname__} has type hints that cannot be "
            f"resolved: {type(exc).__name__}: {exc}"
        ) from exc


def _typeddict_required(cls: type, hints: dict[str, Any]) -> set[str]:
    """``__required_keys__``, corrected by the ``Required``/``NotRequired`` of the resolved
    hints (Python 3.11 misses them when annotations are strings)."""
    required = set(getattr(cls, "__required_keys__", hints))
    for name, hint in hints.items():
        while typing.get_origin(hint) in _WRAPPERS:
            if typing.get_origin(hint) is typing.Required:
                required.add(name)
            elif typing.get_origin(hint) is typing.NotRequired:
                required.discard(name)
            hint = typing.get_args(hint)[0]
    return required


def _is_struct(tp: object) -> bool:
    return isinstance(tp, type) and (dataclasses.is_dataclass(tp) or _is_typeddict(tp))


# --- lowering annotations to what msgspec checks --------------------------------------


class _Marker:
    """Base of the classes msgspec hands to ``_dec_hook``; ``test`` says if a value fits."""

    test: Callable[[Any], bool]


def _dec_hook(tp: type, value: Any) -> Any:
    if not (isinstance(tp, type) and issubclass(tp, _Marker)) or not tp.test(value):
        raise ValueError(f"must be {tp.__qualname__}")  # msgspec adds the path
    return object.__new__(tp)  # msgspec wants an instance of the type it asked for


_OPTIONS: dict[str, Any] = {
    "strict": True,
    "from_attributes": True,  # a dataclass instance is checked by its attributes
    "dec_hook": _dec_hook,
    "builtin_types": _BUILTINS,
}


def _marker(label: str, test: Callable[[Any], bool]) -> type[_Marker]:
    return type(label, (_Marker,), {"test": staticmethod(test)})


def _fits(value: Any, lowered: Any) -> bool:
    try:
        msgspec.convert(value, lowered, **_OPTIONS)
    except ValueError:  # msgspec's ValidationError too
        return False
    return True


def _accepted(lowered: Any) -> bool:
    """Whether msgspec supports a type (it raises TypeError when it first inspects it)."""
    try:
        _fits(None, lowered)
    except TypeError:
        return False
    return True


_STRUCTS: dict[type, Any] = {}
_LOCK = threading.RLock()
_BUILDING: set[type] = set()


def _lower(tp: object) -> Any:
    """The type msgspec checks for an annotation (classes cached by ``_struct``)."""
    tp = _unwrap(tp)
    return _struct(tp) if _is_struct(tp) else _lower_cached(tp)  # type: ignore[arg-type]


@lru_cache(maxsize=1024)
def _lower_cached(tp: Any) -> Any:
    if tp is Any or tp is object or tp is None or tp is type(None):
        return Any if tp is object else tp
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNION_ORIGINS:
        arms = tuple(_lower(arm) for arm in args)
        union = typing.Union[arms]  # type: ignore[valid-type]  # noqa: UP007
        if _accepted(union):
            return union
        return _marker(_describe(tp), lambda value: any(_fits(value, arm) for arm in arms))
    if origin is typing.Literal:
        lowered = tp
    elif origin in _CONTAINERS:
        inner = tuple(arg if arg is Ellipsis else _lower(arg) for arg in args)
        lowered = origin[inner] if inner else origin
    elif origin is not None:
        raise InvalidTaskOptions(f"{_describe(tp)} cannot be checked")
    elif not isinstance(tp, type) or tp is cabc.Callable:
        raise InvalidTaskOptions(
            f"{tp!r} cannot be checked (a TypeVar, an unresolved name or a form)"
        )
    elif _is_pydantic_model(tp):
        return _marker(tp.__qualname__, lambda value: _fits_pydantic(value, tp))
    else:
        lowered = tp
    if not _accepted(lowered):
        raise InvalidTaskOptions(f"{_describe(tp)} cannot be checked")
    if isinstance(msgspec.inspect.type_info(lowered), msgspec.inspect.CustomType):
        return _marker(tp.__qualname__, lambda value: _is_instance(value, tp))  # isinstance
    return lowered


def _fits_pydantic(value: object, model: Any) -> bool:
    try:
        return isinstance(value, model) or bool(model.model_validate(value))
    except Exception:  # pydantic's ValidationError, or whatever a validator raises
        return False


def _is_instance(value: object, cls: type) -> bool:
    try:
        return isinstance(value, cls)
    except TypeError:  # a Protocol that is not runtime_checkable: nothing to check
        return True


def _struct(cls: type) -> Any:
    """A msgspec struct with the fields of a dataclass or TypedDict, refusing unknown keys.
    A class met again while its own struct is built (a tree of nodes) is checked lazily."""
    if cls in _STRUCTS:
        return _STRUCTS[cls]
    if cls in _BUILDING:
        return _marker(cls.__qualname__, lambda value: _fits(value, _STRUCTS[cls]))
    hints = _type_hints(cls)
    if dataclasses.is_dataclass(cls):
        fields = [field for field in dataclasses.fields(cls) if field.init]
        names = [field.name for field in fields]
        missing = dataclasses.MISSING
        required = {f.name for f in fields if f.default is missing and f.default_factory is missing}
    else:
        names, required = list(hints), _typeddict_required(cls, hints)
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


def _first_error(value: Any, tp: object, path: FieldPath) -> _Invalid | None:
    """None if ``value`` fits the annotation ``tp``, else where and why it does not."""
    try:
        msgspec.convert(value, _lower(tp), **_OPTIONS)
    except msgspec.ValidationError as exc:
        return _explain(str(exc), value, tp, path)
    return None


def _child(tp: object, key: Any) -> object:
    """The annotation of ``key`` inside a value annotated ``tp``."""
    tp = _unwrap(tp)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in _UNION_ORIGINS:
        return next((c for c in (_child(arm, key) for arm in args) if c is not None), None)
    if _is_struct(tp):
        return _type_hints(tp).get(key) if isinstance(key, str) else None
    if origin is tuple and args and args[-1] is not Ellipsis:
        return args[key] if isinstance(key, int) and key < len(args) else None
    if isinstance(origin, type) and issubclass(origin, cabc.Mapping):
        return args[1] if len(args) == 2 else Any
    if isinstance(origin, type) and issubclass(origin, cabc.Iterable):
        return args[0] if args else Any
    return Any if tp is Any or tp in _CONTAINERS else None


def _explain(message: str, value: Any, tp: object, path: FieldPath) -> _Invalid:
    """Our error from msgspec's: its path walked through the payload and annotations."""
    problem, _, at = message.rpartition(" - at `") if " - at `" in message else (message, "", "")
    for name, index in _AT.findall(at.rpartition("`$")[2].rstrip("`")):
        origin = typing.get_origin(_unwrap(tp))
        if index == "..." or origin in (set, frozenset, cabc.Set, cabc.MutableSet):
            return _in_collection(value, _unwrap(tp), path)
        key: Any = int(index) if index else name
        tp = _child(tp, key)
        value = value[key] if isinstance(value, Mapping | list | tuple) else getattr(value, key)
        path = (*path, key)
    return _at(problem, at.startswith("key` in"), value, _unwrap(tp), path)


def _in_collection(value: Any, tp: object, path: FieldPath) -> _Invalid:
    """The first bad item of a dict (msgspec loses the key) or of a set (no index)."""
    args = typing.get_args(tp)
    if isinstance(value, Mapping):
        for key, item in value.items():
            if found := _first_error(item, args[1] if len(args) == 2 else Any, (*path, key)):
                return found
    else:
        for item in value:
            if found := _first_error(item, args[0] if args else Any, path):
                return _Invalid(path, f"has an invalid item: {found.problem}")
    return _Invalid(path, f"must be {_describe(tp)}, {_got(value)}")


def _at(problem: str, bad_key: bool, value: Any, tp: Any, path: FieldPath) -> _Invalid:
    """The error at the end of msgspec's path, in this module's words."""
    field = re.search(r"(missing required|contains unknown) field `(.*)`", problem)
    if field:
        kind = "is missing required" if field[1] == "missing required" else "has unknown"
        return _Invalid(path, f"{kind} field {field[2]!r}", (*path, field[2]))
    args = typing.get_args(tp)
    if bad_key:
        for key in value:
            if found := _first_error(key, args[0], path):
                return _Invalid(path, f"has an invalid key {key!r}: {found.problem}")
    if typing.get_origin(tp) in _UNION_ORIGINS:  # report the arm the value was shaped for
        errors = [_first_error(value, arm, path) for arm in args]
        deeper = [error for error in errors if error and len(error.field_path) > len(path)]
        if len(deeper) == 1:
            return deeper[0]
    elif _is_pydantic_model(tp) and not isinstance(value, tp):
        try:
            tp.model_validate(value)
        except Exception as exc:
            return _pydantic_invalid(exc, path)
    elif _is_struct(tp) and isinstance(value, Mapping):  # checked lazily (self-reference)
        if (found := _first_error(value, tp, path)) is not None:
            return found
    elif typing.get_origin(tp) is tuple and isinstance(value, list | tuple) and args[-1:] != (...,):
        count = f"{len(args)} items ({_describe(tp)}), got {len(value)}"
        if len(value) != len(args):
            return _Invalid(path, f"must have {count}")
    return _Invalid(path, f"must be {_must(tp)}, {_got(value)}")


def _is_pydantic_model(obj: object) -> bool:
    """A pydantic v2 model class; pydantic is imported only if the object looks like one."""
    if not isinstance(obj, type) or getattr(obj, "model_validate", None) is None:
        return False
    try:
        import pydantic
    except ImportError:
        return False
    return issubclass(obj, pydantic.BaseModel)


def _pydantic_invalid(exc: Exception, path: FieldPath) -> _Invalid:
    """Our error from pydantic's: the first problem, with its ``loc`` as the field path."""
    import pydantic

    if not isinstance(exc, pydantic.ValidationError):
        return _Invalid(path, f"is invalid: {type(exc).__name__}: {exc}")
    errors = exc.errors()
    if not errors:
        return _Invalid(path, f"is invalid: {exc}")
    first = errors[0]
    loc = tuple(first.get("loc", ()))
    more = len(errors) - 1
    suffix = f" (and {more} more error{'s' if more > 1 else ''})" if more else ""
    kind = first.get("type")
    if kind == "missing" and loc:
        return _Invalid(
            (*path, *loc[:-1]), f"is missing required field {loc[-1]!r}{suffix}", (*path, *loc)
        )
    if kind == "extra_forbidden" and loc:
        return _Invalid((*path, *loc[:-1]), f"has unknown field {loc[-1]!r}{suffix}", (*path, *loc))
    got = f", {_got(first['input'])}" if "input" in first else ""
    return _Invalid((*path, *loc), f"is invalid: {first.get('msg', exc)}{got}{suffix}")


# --- public schemas -----------------------------------------------------------------------


class PayloadSchema:
    """A compiled ``schema=`` option: ``validate(payload)`` returns the payload (a callable
    schema may normalize it) or raises ``InvalidTaskArguments`` naming the bad value."""

    def __init__(self, schema: Any, where: str, kind: str) -> None:
        self.schema, self.where, self.kind = schema, where, kind
        if kind in ("dataclass", "typeddict"):
            try:  # lowered now, so an annotation nothing can check fails the definition
                self.struct = _struct(schema)
            except InvalidTaskOptions as exc:
                raise InvalidTaskOptions(f"{where}: schema {schema.__qualname__}: {exc}") from None

    def __repr__(self) -> str:
        name = getattr(self.schema, "__qualname__", None) or repr(self.schema)
        return f"<PayloadSchema {self.kind} {name} for {self.where}>"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            return self._validate(payload)
        except _Invalid as exc:
            raise _error(self.where, exc.field_path, exc.render()) from exc.__cause__

    def _validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        if self.kind == "callable":
            return self._call(payload)
        if self.kind == "pydantic":
            try:  # the caller's values are kept, not pydantic's coerced ones
                self.schema.model_validate(payload)
            except Exception as exc:
                raise _pydantic_invalid(exc, ()) from exc
        elif not isinstance(payload, Mapping):
            raise _Invalid((), f"must be a dict, {_got(payload)}")
        else:
            try:
                msgspec.convert(payload, self.struct, **_OPTIONS)
            except msgspec.ValidationError as exc:
                raise _explain(str(exc), payload, self.schema, ()) from None
        return payload

    def _call(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            result = self.schema(dict(payload))  # a copy: the caller's dict is not touched
        except Exception as exc:
            if isinstance(exc, ValueError | TypeError | AssertionError):
                raise _Invalid((), f"is invalid: {str(exc) or type(exc).__name__}") from exc
            # likely a bug in the schema function itself: say what kind
            raise _Invalid((), f"is invalid: {type(exc).__name__}: {exc}") from exc
        if not isinstance(result, dict):
            kind = type(result).__name__
            text = f"schema callable must return the payload dict, got {kind}"
            raise _error(self.where, (), text)
        return result


def compile_schema(schema: object, *, where: str) -> PayloadSchema:
    """Check a ``schema=`` option at definition time and prepare it for validation.

    ``where`` is the task's path, used in messages. Raises ``InvalidTaskOptions`` for
    anything that is not one of the accepted kinds.
    """
    if isinstance(schema, type) and typing.get_origin(schema) is None:
        if dataclasses.is_dataclass(schema):
            return PayloadSchema(schema, where, "dataclass")
        if _is_typeddict(schema):
            return PayloadSchema(schema, where, "typeddict")
        if _is_pydantic_model(schema):
            return PayloadSchema(schema, where, "pydantic")
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
