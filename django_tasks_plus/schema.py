"""Payload schemas: a task's arguments, by name, checked at enqueue and again in the worker.

A task declared with ``@task(schema=...)`` has a *payload*: its call bound to the function's
parameter names, defaults filled in, ``**kwargs`` merged in and the ``context`` parameter
left out. The schema is checked when the task is enqueued (fail fast, in the caller's
request) and again in the worker just before the call, so a payload stored by an older
deploy that no longer fits is dead-lettered with the reason instead of being run.

Accepted schemas: a dataclass, a TypedDict, a pydantic v2 model (only when pydantic is
installed; it is never required) or a callable ``payload -> payload``. Errors name the
offending value (``payload['user']['age'] must be int, got str ('x')``), and the
``InvalidTaskArguments`` raised carries it as ``field_path`` (a tuple of keys and indexes).

Type rules for dataclass and TypedDict fields, chosen for payloads that went through JSON:

* ``int`` refuses ``bool``; ``float`` accepts ``int`` (but not ``bool``).
* ``tuple[...]`` accepts lists too, because a stored tuple comes back as a list.
* ``Sequence[X]`` refuses ``str`` and ``bytes``: a string is almost never meant there.
* Enums accept a member or the exact value of one (what storage gives back).
* Nested dataclasses and TypedDicts are given as dicts and checked field by field; a
  dataclass instance is accepted as is.
* Annotation forms this module does not understand accept any value: the schema must
  never be the thing that crashes.
"""

from __future__ import annotations

import collections.abc as cabc
import dataclasses
import enum
import types
import typing
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping
from functools import lru_cache
from typing import Any, cast

from .exceptions import InvalidTaskArguments, InvalidTaskOptions

FieldPath = tuple[Any, ...]
Checker = Callable[[Any, FieldPath], None]

ACCEPTED_KINDS = (
    "a dataclass, a TypedDict or a pydantic model class, or a callable that takes the "
    "payload dict and returns it"
)

# Wrappers that qualify a type without changing what values it accepts.
_WRAPPERS = tuple(
    form
    for form in (
        typing.Annotated,
        typing.Required,
        typing.NotRequired,
        typing.Final,
        getattr(typing, "ReadOnly", None),
    )
    if form is not None
)
_TYPE_ALIAS = getattr(typing, "TypeAliasType", None)
_UNION_ORIGINS = (typing.Union, types.UnionType)


# --- errors -----------------------------------------------------------------------------


class _Invalid(Exception):
    """Internal: a value did not fit; ``path`` is where the message points."""

    def __init__(self, path: FieldPath, problem: str, field_path: FieldPath | None = None):
        super().__init__(problem)
        self.path = path
        self.problem = problem
        self.field_path = path if field_path is None else field_path

    def render(self) -> str:
        return f"{render_path(self.path)} {self.problem}"


def render_path(path: FieldPath) -> str:
    """``('user', 'tags', 0)`` -> ``payload['user']['tags'][0]``."""
    return "payload" + "".join(f"[{key!r}]" for key in path)


def _error(where: str, field_path: FieldPath, text: str) -> InvalidTaskArguments:
    """Our public error, with the path also available to code (``exc.field_path``)."""
    return InvalidTaskArguments(f"{where}(): {text}", field_path=field_path)


def _got(value: object) -> str:
    """``got str ('x')``: the type and a short repr, so long values keep messages short."""
    text = repr(value)
    if len(text) > 60:
        text = text[:57] + "..."
    return f"got {type(value).__name__} ({text})"


def _describe(tp: object) -> str:
    """A readable name for an annotation: ``list[int]``, ``int | None``, ``User``."""
    if tp is None or tp is type(None):
        return "None"
    if tp is Ellipsis:
        return "..."
    if tp is Any:
        return "Any"
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in _UNION_ORIGINS:
        return " | ".join(_describe(arg) for arg in args)
    if origin is typing.Literal:
        return f"Literal[{', '.join(repr(arg) for arg in args)}]"
    if origin is not None:
        name = getattr(origin, "__qualname__", None) or repr(origin).replace("typing.", "")
        if origin is tuple and not args:
            return "tuple[()]"
        return f"{name}[{', '.join(_describe(arg) for arg in args)}]" if args else name
    if isinstance(tp, type):
        return tp.__qualname__
    return repr(tp).replace("typing.", "")


# --- compiling annotations into checkers --------------------------------------------------


def _accept(value: object, path: FieldPath) -> None:
    """Checker for ``Any`` and for annotation forms we do not understand."""


def _check_none(value: object, path: FieldPath) -> None:
    if value is not None:
        raise _Invalid(path, f"must be None, {_got(value)}")


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


def _compile(tp: object) -> Checker:
    """A function that raises ``_Invalid`` when a value does not fit the annotation ``tp``."""
    tp = _unwrap(tp)
    if tp is Any or tp is object:
        return _accept
    if tp is None or tp is type(None):
        return _check_none
    if tp is typing.Tuple:  # noqa: UP006 - bare typing.Tuple means any tuple, not tuple[()]
        return _compile_class(tuple)
    origin = typing.get_origin(tp)
    if origin is not None:
        return _compile_generic(tp, origin, typing.get_args(tp))
    if isinstance(tp, type):
        return _compile_class(tp)
    return _accept  # TypeVar, unresolved ForwardRef, strings, anything new


def _isinstance_checker(cls: type, label: str) -> Checker:
    def check(value: object, path: FieldPath) -> None:
        try:
            ok = isinstance(value, cls)
        except TypeError:  # e.g. a Protocol that is not runtime_checkable
            return
        if not ok:
            raise _Invalid(path, f"must be {label}, {_got(value)}")

    return check


def _compile_class(cls: type) -> Checker:
    """Checker for a plain class annotation (no type arguments)."""
    if cls is bool:
        return _isinstance_checker(bool, "bool")
    if cls is int:

        def check_int(value: object, path: FieldPath) -> None:
            if isinstance(value, bool) or not isinstance(value, int):
                raise _Invalid(path, f"must be int, {_got(value)}")

        return check_int
    if cls is float:

        def check_float(value: object, path: FieldPath) -> None:
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise _Invalid(path, f"must be float, {_got(value)}")

        return check_float
    if cls is tuple:
        return _isinstance_checker((list, tuple), "tuple")  # type: ignore[arg-type]
    if issubclass(cls, enum.Enum):
        return _enum_checker(cls)
    if dataclasses.is_dataclass(cls) or _is_typeddict(cls):
        return _nested_struct_checker(cls)
    if _is_pydantic_model(cls):
        return _nested_pydantic_checker(cls)
    return _isinstance_checker(cls, cls.__qualname__)


def _compile_generic(tp: object, origin: Any, args: tuple[Any, ...]) -> Checker:
    """Checker for a parameterized annotation: unions, literals, containers."""
    if origin is typing.Literal:
        return _literal_checker(args)
    if origin in _UNION_ORIGINS:
        return _union_checker(args)
    if not isinstance(origin, type):
        return _accept
    if origin is tuple:
        return _tuple_checker(tp, args)
    if issubclass(origin, cabc.Mapping):
        return _mapping_checker(tp, origin, args)
    if issubclass(origin, cabc.Set):
        return _set_checker(tp, origin, args)
    if issubclass(origin, cabc.Sequence):
        return _sequence_checker(tp, origin, args)
    return _isinstance_checker(origin, _describe(tp))


def _same_literal(value: object, allowed: object) -> bool:
    """Equal and of the same type (so ``True`` is not ``1``); an enum also matches its value."""
    if type(value) is type(allowed) and value == allowed:
        return True
    if isinstance(allowed, enum.Enum):
        return type(value) is type(allowed.value) and value == allowed.value
    return False


def _literal_checker(allowed: tuple[Any, ...]) -> Checker:
    choices = ", ".join(repr(item) for item in allowed)

    def check(value: object, path: FieldPath) -> None:
        if not any(_same_literal(value, item) for item in allowed):
            raise _Invalid(path, f"must be one of {choices}, {_got(value)}")

    return check


def _union_checker(arms: tuple[Any, ...]) -> Checker:
    """First arm that fits wins. If the value fit one arm's shape but failed deeper inside
    it (a list with one bad item), that deeper error is the useful one to report."""
    checkers = [_compile(arm) for arm in arms]
    label = " | ".join(_describe(arm) for arm in arms)

    def check(value: object, path: FieldPath) -> None:
        deeper: list[_Invalid] = []
        for checker in checkers:
            try:
                checker(value, path)
            except _Invalid as exc:
                if len(exc.field_path) > len(path):
                    deeper.append(exc)
            else:
                return
        if len(deeper) == 1:
            raise deeper[0]
        raise _Invalid(path, f"must be {label}, {_got(value)}")

    return check


def _tuple_checker(tp: object, args: tuple[Any, ...]) -> Checker:
    """``tuple[X, ...]`` or fixed ``tuple[X, Y]``; lists pass because JSON has no tuples."""
    label = _describe(tp)
    if len(args) == 2 and args[1] is Ellipsis:
        return _items_checker((list, tuple), label, _compile(args[0]))
    items = [_compile(arg) for arg in args]

    def check(value: object, path: FieldPath) -> None:
        if not isinstance(value, list | tuple):
            raise _Invalid(path, f"must be {label}, {_got(value)}")
        if len(value) != len(items):
            raise _Invalid(path, f"must have {len(items)} items ({label}), got {len(value)}")
        for index, (item, checker) in enumerate(zip(value, items, strict=True)):
            checker(item, (*path, index))

    return check


def _items_checker(accepted: type | tuple[type, ...], label: str, item: Checker) -> Checker:
    def check(value: object, path: FieldPath) -> None:
        if not isinstance(value, accepted) or isinstance(value, str | bytes | bytearray):
            raise _Invalid(path, f"must be {label}, {_got(value)}")
        for index, element in enumerate(cast("Iterable[object]", value)):
            item(element, (*path, index))

    return check


def _sequence_checker(tp: object, origin: type, args: tuple[Any, ...]) -> Checker:
    """``list[X]`` wants a list; ``Sequence[X]`` any sequence but a string."""
    item = _compile(args[0]) if args else _accept
    return _items_checker(origin, _describe(tp), item)


def _set_checker(tp: object, origin: type, args: tuple[Any, ...]) -> Checker:
    label = _describe(tp)
    item = _compile(args[0]) if args else _accept

    def check(value: object, path: FieldPath) -> None:
        if not isinstance(value, origin):
            raise _Invalid(path, f"must be {label}, {_got(value)}")
        for element in value:  # type: ignore[attr-defined]
            try:
                item(element, path)
            except _Invalid as exc:  # set items have no index to point at
                raise _Invalid(path, f"has an invalid item: {exc.problem}") from None

    return check


def _mapping_checker(tp: object, origin: type, args: tuple[Any, ...]) -> Checker:
    label = _describe(tp)
    key_check = _compile(args[0]) if len(args) == 2 else _accept
    value_check = _compile(args[1]) if len(args) == 2 else _accept

    def check(value: object, path: FieldPath) -> None:
        if not isinstance(value, origin):
            raise _Invalid(path, f"must be {label}, {_got(value)}")
        for key, item in value.items():  # type: ignore[attr-defined]
            try:
                key_check(key, path)
            except _Invalid as exc:
                raise _Invalid(path, f"has an invalid key {key!r}: {exc.problem}") from None
            value_check(item, (*path, key))

    return check


def _enum_checker(cls: type[enum.Enum]) -> Checker:
    """A member, or the exact value of one: storage keeps values, not members."""
    values = [member.value for member in cls]
    shown = ", ".join(repr(v) for v in values[:10]) + (", ..." if len(values) > 10 else "")

    def check(value: object, path: FieldPath) -> None:
        if isinstance(value, cls):
            return
        if any(type(value) is type(v) and value == v for v in values):
            return
        raise _Invalid(
            path, f"must be {cls.__qualname__} (a member or one of {shown}), {_got(value)}"
        )

    return check


# --- dataclasses and TypedDicts -----------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Struct:
    """The compiled fields of a dataclass or TypedDict: built once, reused per payload."""

    checkers: dict[str, Checker]
    required: tuple[str, ...]

    def check(self, value: Mapping[str, Any], path: FieldPath) -> None:
        for name in self.required:
            if name not in value:
                raise _Invalid(path, f"is missing required field {name!r}", (*path, name))
        for key in value:
            if key not in self.checkers:
                raise _Invalid(path, f"has unknown field {key!r}", (*path, key))
        for key, item in value.items():
            self.checkers[key](item, (*path, key))


def _is_typeddict(cls: object) -> bool:
    """``typing.is_typeddict``, plus TypedDicts from ``typing_extensions``."""
    if typing.is_typeddict(cls):
        return True
    return (
        isinstance(cls, type)
        and issubclass(cls, dict)
        and hasattr(cls, "__required_keys__")
        and hasattr(cls, "__optional_keys__")
    )


def _type_hints(cls: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(cls, include_extras=True)
    except Exception as exc:  # NameError for a missing forward reference, and friends
        raise InvalidTaskOptions(
            f"the schema {cls.__module__}.{cls.__qualname__} has type hints that cannot be "
            f"resolved: {type(exc).__name__}: {exc}"
        ) from exc


def _typeddict_required(cls: type, hints: dict[str, Any]) -> set[str]:
    """``__required_keys__``, corrected by explicit ``Required``/``NotRequired`` markers.

    Python 3.11 misses those markers when annotations are strings (``from __future__
    import annotations``); the resolved hints still carry them, so they decide.
    """
    required = set(getattr(cls, "__required_keys__", hints))
    for name, hint in hints.items():
        while typing.get_origin(hint) in _WRAPPERS:
            if typing.get_origin(hint) is typing.Required:
                required.add(name)
            elif typing.get_origin(hint) is typing.NotRequired:
                required.discard(name)
            hint = typing.get_args(hint)[0]
    return required


@lru_cache(maxsize=1024)
def _struct(cls: type) -> _Struct:
    """Compile a dataclass or TypedDict once; nested ones are compiled on first use, which
    also keeps self-referencing schemas (a tree of nodes) from recursing forever."""
    hints = _type_hints(cls)
    if dataclasses.is_dataclass(cls):
        fields = [field for field in dataclasses.fields(cls) if field.init]
        names = [field.name for field in fields]
        required = {
            field.name
            for field in fields
            if field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        }
    else:
        names = list(hints)
        required = _typeddict_required(cls, hints)
    return _Struct(
        checkers={name: _compile(hints.get(name, Any)) for name in names},
        required=tuple(name for name in names if name in required),
    )


def _nested_struct_checker(cls: type) -> Checker:
    is_dataclass = dataclasses.is_dataclass(cls)

    def check(value: object, path: FieldPath) -> None:
        if is_dataclass and isinstance(value, cls):
            return
        if not isinstance(value, Mapping):
            raise _Invalid(path, f"must be a dict of {cls.__qualname__} fields, {_got(value)}")
        _struct(cls).check(value, path)

    return check


# --- pydantic (optional) ------------------------------------------------------------------


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


def _nested_pydantic_checker(cls: type) -> Checker:
    def check(value: object, path: FieldPath) -> None:
        if isinstance(value, cls):
            return
        try:
            cls.model_validate(value)  # type: ignore[attr-defined]
        except Exception as exc:
            raise _pydantic_invalid(exc, path) from None

    return check


# --- public schemas -----------------------------------------------------------------------


class PayloadSchema(ABC):
    """A compiled ``schema=`` option: ``validate(payload)`` returns the payload or raises
    ``InvalidTaskArguments`` whose message and ``field_path`` name the bad value."""

    kind: str = ""

    def __init__(self, schema: Any, where: str) -> None:
        self.schema = schema
        self.where = where

    @abstractmethod
    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        """Return the payload (a callable schema may normalize it) or raise."""

    def __repr__(self) -> str:
        name = getattr(self.schema, "__qualname__", None) or repr(self.schema)
        return f"<{type(self).__name__} {self.kind} {name} for {self.where}>"


class _StructSchema(PayloadSchema):
    """A dataclass or TypedDict: exact keys, each value checked against its annotation."""

    def __init__(self, schema: type, where: str, kind: str) -> None:
        super().__init__(schema, where)
        self.kind = kind

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        if not isinstance(payload, Mapping):
            raise _error(self.where, (), f"payload must be a dict, {_got(payload)}")
        try:
            _struct(self.schema).check(payload, ())
        except _Invalid as exc:
            raise _error(self.where, exc.field_path, exc.render()) from None
        return payload


class _PydanticSchema(PayloadSchema):
    """A pydantic model: validated with ``model_validate``; the caller's values are kept."""

    kind = "pydantic"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            self.schema.model_validate(payload)
        except Exception as exc:
            invalid = _pydantic_invalid(exc, ())
            raise _error(self.where, invalid.field_path, invalid.render()) from exc
        return payload


class _CallableSchema(PayloadSchema):
    """A function ``payload -> payload``: whatever it raises becomes the error message."""

    kind = "callable"

    def validate(self, payload: dict[str, Any]) -> dict[str, Any]:
        try:
            result = self.schema(dict(payload))  # a copy: the caller's dict is not touched
        except Exception as exc:
            if isinstance(exc, ValueError | TypeError | AssertionError):
                detail = str(exc) or type(exc).__name__
            else:  # likely a bug in the schema function itself: say what kind
                detail = f"{type(exc).__name__}: {exc}"
            raise _error(self.where, (), f"payload is invalid: {detail}") from exc
        if not isinstance(result, dict):
            raise _error(
                self.where,
                (),
                f"schema callable must return the payload dict, got {type(result).__name__}",
            )
        return result


def compile_schema(schema: object, *, where: str) -> PayloadSchema:
    """Check a ``schema=`` option at definition time and prepare it for validation.

    ``where`` is the task's path, used in messages. Raises ``InvalidTaskOptions`` for
    anything that is not one of the accepted kinds.
    """
    if isinstance(schema, type) and typing.get_origin(schema) is None:
        if dataclasses.is_dataclass(schema):
            return _StructSchema(schema, where, "dataclass")
        if _is_typeddict(schema):
            return _StructSchema(schema, where, "typeddict")
        if _is_pydantic_model(schema):
            return _PydanticSchema(schema, where)
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
        return _CallableSchema(schema, where)
    raise InvalidTaskOptions(
        f"{where}: schema must be {ACCEPTED_KINDS}, got {type(schema).__name__} ({schema!r})."
    )


__all__ = ["PayloadSchema", "compile_schema", "render_path"]
