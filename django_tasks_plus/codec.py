"""Turns task arguments and return values into JSON that every supported database stores.

Plain JSON values (``None``, ``bool``, ``int``, finite ``float``, ``str``, ``list`` and
``dict`` with ``str`` keys) are stored as themselves, so rows stay readable and match what
Django's own task backends store. A few more types are common in task arguments and must
come back unchanged, so they are stored as a *tag*: a two-key object such as
``{"__dtp__": "datetime", "v": "2026-01-01T12:00:00+00:00"}``. Tagged types: ``tuple``,
``set``, ``frozenset``, ``bytes`` (base64), ``datetime`` (naive or aware; the UTC offset is
kept), ``date``, ``time``, ``timedelta``, ``Decimal`` (exponent kept) and ``UUID``. A user
dict that happens to contain the tag key is itself stored as a ``"dict"`` tag holding its
items, so decoding never mistakes user data for a tag.

The rule is strict on purpose: a value that would not come back unchanged is refused at
enqueue time, with the path of the offending value, instead of failing in a worker later.
NaN/Infinity and NUL characters are refused because PostgreSQL's ``jsonb`` cannot hold
them, and a queue should behave the same on every database. Subclasses of supported types
(``IntEnum``, ``StrEnum``, ``OrderedDict``, named tuples...) are stored as their base type.

This code runs on every enqueue and every task run, so the common case (small containers of
ints and strings) is handled by exact-type checks, and paths are only built on error.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import decimal
import json
import math
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]

TAG = "__dtp__"
"""Key that marks a tagged value; unlikely in user data, and escaped when it appears."""

PAYLOAD = "v"
"""Key of a tag's payload."""

_NUL = "contains a NUL character, which databases cannot store."
_SUPPORTED = (
    "None, bool, int, float, str, list, tuple, dict, set, frozenset, bytes, "
    "datetime.datetime, datetime.date, datetime.time, datetime.timedelta, "
    "decimal.Decimal, uuid.UUID"
)


FieldPath = tuple[str | int, ...]


class _Located(Exception):
    """A problem at a place in a value: ``path`` as text (``args[0]['when']``),
    ``field_path`` as data (``('args', 0, 'when')``)."""

    def __init__(self, path: str, problem: str, field_path: FieldPath = ()) -> None:
        super().__init__(f"{path} {problem}")
        self.path = path
        self.problem = problem
        self.field_path = field_path or (path,)


class EncodeError(_Located, TypeError):
    """A value that cannot be stored."""


class DecodeError(_Located, ValueError):
    """Stored data that is not a valid encoding."""


class _Refused(Exception):
    """Internal: carries a problem outward; each container on the way adds its path step.

    Building paths only on failure keeps the successful (common) case cheap.
    """

    def __init__(self, problem: str, step: str | None = None) -> None:
        self.problem = problem
        self.steps: list[str] = [] if step is None else [step]
        self.keys: list[str | int] = []  # the same path as data, for ``field_path``
        # Set when a dict key (not its value) is the problem: that dict adds no "[key]".
        self.at_key = False

    def within(self, key: str | int) -> None:
        """Record that the problem sits under ``key`` of the enclosing container."""
        self.steps.append(f"[{key!r}]")
        self.keys.append(key)

    def path(self, root: str) -> str:
        return root + "".join(reversed(self.steps))

    def field_path(self, root: str) -> tuple[str | int, ...]:
        return (root, *reversed(self.keys))


def _tagged(name: str, payload: JsonValue) -> dict[str, JsonValue]:
    return {TAG: name, PAYLOAD: payload}


# --------------------------------------------------------------------------- encoding


def _encode(value: Any) -> JsonValue:
    cls = type(value)
    if cls is str:
        if "\x00" in value:
            raise _Refused(_NUL)
        return value
    if cls is int or cls is bool or value is None:
        return value
    if cls is list:
        return _encode_items(value)
    if cls is dict:
        return _encode_dict(value)
    encoder = _ENCODERS.get(cls)
    if encoder is None:
        encoder = _encoder_for_subclass(cls)
    return encoder(value)


def _encode_items(items: Iterable[Any]) -> list[JsonValue]:
    out: list[JsonValue] = []
    append = out.append
    try:
        for item in items:
            cls = type(item)
            if cls is str:
                if "\x00" in item:
                    raise _Refused(_NUL)
                append(item)
            elif cls is int or cls is bool or item is None:
                append(item)
            else:
                append(_encode(item))
    except _Refused as exc:
        exc.within(len(out))  # every earlier item was appended
        raise
    return out


def _encode_values(mapping: Mapping[Any, Any]) -> dict[str, JsonValue]:
    out: dict[str, JsonValue] = {}
    try:
        for key, item in mapping.items():
            if type(key) is not str:
                key = _plain_key(key)
            if "\x00" in key:
                raise _key_refusal(_NUL, " key")
            cls = type(item)
            if cls is str:
                if "\x00" in item:
                    raise _Refused(_NUL)
                out[key] = item
            elif cls is int or cls is bool or item is None:
                out[key] = item
            else:
                out[key] = _encode(item)
    except _Refused as exc:
        if exc.at_key:
            exc.at_key = False
        else:
            exc.within(key)
        raise
    return out


def _plain_key(key: Any) -> str:
    if isinstance(key, str):
        return str.__str__(key)
    raise _key_refusal(f"has the key {key!r} ({type(key).__name__}); only str keys can be stored.")


def _key_refusal(problem: str, step: str | None = None) -> _Refused:
    refusal = _Refused(problem, step)
    refusal.at_key = True
    return refusal


def _encode_dict(mapping: Mapping[Any, Any]) -> JsonValue:
    out = _encode_values(mapping)
    if TAG in out:  # user data that looks like a tag: store its items instead
        return _tagged("dict", [[key, item] for key, item in out.items()])
    return out


def _encode_float(value: float) -> float:
    if not math.isfinite(value):
        raise _Refused(f"is {value!r}; only finite numbers can be stored.")
    return float.__float__(value)


def _encode_str(value: str) -> str:
    return _encode(str.__str__(value))  # type: ignore[return-value]


def _encode_set(name: str) -> Callable[[Any], JsonValue]:
    def encode(members: Iterable[Any]) -> JsonValue:
        encoded: list[JsonValue] = []
        try:
            for member in members:
                encoded.append(_encode(member))
        except _Refused as exc:
            exc.steps.append(" member")
            raise
        encoded.sort(key=dumps)  # sets have no order; make the stored text deterministic
        return _tagged(name, encoded)

    return encode


def _encode_decimal(value: decimal.Decimal) -> JsonValue:
    if not value.is_finite():
        raise _Refused(f"is Decimal({str(value)!r}); only finite numbers can be stored.")
    return _tagged("decimal", decimal.Decimal.__str__(value))


_ENCODERS: dict[type, Callable[[Any], JsonValue]] = {
    # Exact types are looked up directly; subclasses find their base through the MRO.
    str: _encode_str,
    int: int.__int__,
    bool: bool,
    type(None): lambda value: None,
    float: _encode_float,
    list: _encode_items,
    dict: _encode_dict,
    tuple: lambda value: _tagged("tuple", _encode_items(value)),
    set: _encode_set("set"),
    frozenset: _encode_set("frozenset"),
    bytes: lambda value: _tagged("bytes", base64.b64encode(value).decode("ascii")),
    dt.datetime: lambda value: _tagged("datetime", dt.datetime.isoformat(value)),
    dt.date: lambda value: _tagged("date", dt.date.isoformat(value)),
    dt.time: lambda value: _tagged("time", dt.time.isoformat(value)),
    dt.timedelta: lambda value: _tagged(
        "timedelta", [value.days, value.seconds, value.microseconds]
    ),
    decimal.Decimal: _encode_decimal,
    uuid.UUID: lambda value: _tagged("uuid", uuid.UUID.__str__(value)),
}


def _encoder_for_subclass(cls: type) -> Callable[[Any], JsonValue]:
    for base in cls.__mro__[1:]:
        encoder = _ENCODERS.get(base)
        if encoder is not None:
            return encoder
    raise _Refused(
        f"is a {cls.__module__}.{cls.__qualname__}, which cannot be stored "
        f"(supported types: {_SUPPORTED})."
    )


def _refusal_to_error(exc: _Refused, root: str) -> EncodeError:
    return EncodeError(exc.path(root), exc.problem, exc.field_path(root))


_TOO_DEEP = "is nested too deeply (or contains itself)."


def to_json(value: Any, path: str) -> JsonValue:
    """Return ``value`` in its stored JSON form, or raise ``EncodeError`` naming ``path``.

    Refusing here, at enqueue time, beats a worker failing on the value later.
    """
    try:
        return _encode(value)
    except _Refused as exc:
        raise _refusal_to_error(exc, path) from None
    except RecursionError:
        raise EncodeError(path, _TOO_DEEP) from None


def encode_call(args: Any, kwargs: Any) -> tuple[list[JsonValue], dict[str, JsonValue]]:
    """Encode a call's arguments: ``args`` is stored as a list, ``kwargs`` as a dict.

    The two containers themselves are never tagged, so stored rows keep Django's shape.
    """
    try:
        encoded_args = _encode_items(args)
    except _Refused as exc:
        raise _refusal_to_error(exc, "args") from None
    except RecursionError:
        raise EncodeError("args", _TOO_DEEP) from None
    try:
        encoded_kwargs = _encode_values(kwargs)
    except _Refused as exc:
        raise _refusal_to_error(exc, "kwargs") from None
    except RecursionError:
        raise EncodeError("kwargs", _TOO_DEEP) from None
    return encoded_args, encoded_kwargs


# --------------------------------------------------------------------------- decoding


def _decode(value: Any) -> Any:
    cls = type(value)
    if cls is list:
        return _decode_items(value)
    if cls is dict:
        if TAG in value:
            return _decode_tag(value)
        return _decode_values(value)
    return value


def _decode_items(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    append = out.append
    try:
        for item in items:
            cls = type(item)
            append(_decode(item) if cls is list or cls is dict else item)
    except _Refused as exc:
        exc.within(len(out))
        raise
    return out


def _decode_values(mapping: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        for key, item in mapping.items():
            cls = type(item)
            out[key] = _decode(item) if cls is list or cls is dict else item
    except _Refused as exc:
        exc.within(key)
        raise
    return out


def _tag_name(tag: dict[str, Any]) -> str:
    """The name of a well-formed tag; raise ``_Refused`` for anything else."""
    if len(tag) != 2 or PAYLOAD not in tag:
        raise _Refused(
            f"is a malformed tag: expected exactly the keys {TAG!r} and {PAYLOAD!r}, "
            f"got {sorted(map(str, tag))!r}."
        )
    name = tag[TAG]
    if type(name) is not str or name not in _DECODERS:
        raise _Refused(f"has an unknown tag {name!r}.")
    return name


def _decode_tag(tag: dict[str, Any]) -> Any:
    return _DECODERS[_tag_name(tag)](tag[PAYLOAD])


def _payload(name: str, payload: Any, expected: type) -> Any:
    if type(payload) is not expected:
        raise _Refused(
            f"is a {name!r} tag whose payload is a {type(payload).__name__}, "
            f"not a {expected.__name__}."
        )
    return payload


def _decode_iso(name: str, parse: Callable[[str], Any]) -> Callable[[Any], Any]:
    def decode(payload: Any) -> Any:
        try:
            return parse(_payload(name, payload, str))
        except ValueError:
            raise _Refused(f"is a {name!r} tag with the invalid value {payload!r}.") from None

    return decode


def _offset(parse: Callable[[str], Any], text: str) -> Any:
    """``fromisoformat``, minding that CPython reads a ``+00:00:00.000001`` offset as UTC.

    ``isoformat`` writes such sub-second offsets (``timezone`` allows them), so a value
    would otherwise come back with a different offset.
    """
    value = parse(text)
    if len(text) > 16 and text[-7] == "." and text[-16:-7] in ("+00:00:00", "-00:00:00"):
        micros = int(text[-6:])
        offset = dt.timedelta(microseconds=-micros if text[-16] == "-" else micros)
        value = value.replace(tzinfo=dt.timezone(offset))
    return value


def _decode_timedelta(payload: Any) -> dt.timedelta:
    parts = _payload("timedelta", payload, list)
    if len(parts) != 3 or any(type(part) is not int for part in parts):
        raise _Refused(
            f"is a 'timedelta' tag whose payload {payload!r} is not [days, seconds, microseconds]."
        )
    try:
        return dt.timedelta(days=parts[0], seconds=parts[1], microseconds=parts[2])
    except OverflowError:
        raise _Refused(f"is a 'timedelta' tag out of range: {payload!r}.") from None


def _decode_decimal(payload: Any) -> decimal.Decimal:
    try:
        value = decimal.Decimal(_payload("decimal", payload, str))
    except decimal.InvalidOperation:
        value = None
    if value is None or not value.is_finite():
        raise _Refused(f"is a 'decimal' tag with the invalid value {payload!r}.")
    return value


def _decode_bytes(payload: Any) -> bytes:
    try:
        return base64.b64decode(_payload("bytes", payload, str), validate=True)
    except (binascii.Error, ValueError):
        raise _Refused(f"is a 'bytes' tag with invalid base64 {payload!r}.") from None


def _decode_set(name: str, build: Callable[[list[Any]], Any]) -> Callable[[Any], Any]:
    def decode(payload: Any) -> Any:
        members: list[Any] = []
        payload = _payload(name, payload, list)
        try:
            for member in payload:
                members.append(_decode(member))
        except _Refused as exc:
            exc.steps.append(" member")
            raise
        try:
            return build(members)
        except TypeError:
            raise _Refused(f"is a {name!r} tag with an unhashable member.") from None

    return decode


def _dict_pairs(payload: Any) -> list[list[Any]]:
    pairs = _payload("dict", payload, list)
    for pair in pairs:
        if type(pair) is not list or len(pair) != 2 or type(pair[0]) is not str:
            raise _Refused(f"is a 'dict' tag whose item {pair!r} is not a [str, value] pair.")
    return pairs


def _decode_escaped_dict(payload: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pairs = _dict_pairs(payload)
    try:
        for key, item in pairs:
            out[key] = _decode(item)
    except _Refused as exc:
        exc.within(key)
        raise
    return out


_DECODERS: dict[str, Callable[[Any], Any]] = {
    "tuple": lambda payload: tuple(_decode_items(_payload("tuple", payload, list))),
    "set": _decode_set("set", set),
    "frozenset": _decode_set("frozenset", frozenset),
    "dict": _decode_escaped_dict,
    "bytes": _decode_bytes,
    "datetime": _decode_iso("datetime", lambda text: _offset(dt.datetime.fromisoformat, text)),
    "date": _decode_iso("date", dt.date.fromisoformat),
    "time": _decode_iso("time", lambda text: _offset(dt.time.fromisoformat, text)),
    "timedelta": _decode_timedelta,
    "decimal": _decode_decimal,
    "uuid": _decode_iso("uuid", uuid.UUID),
}


def _decode_root(value: Any, path: str) -> Any:
    try:
        return _decode(value)
    except _Refused as exc:
        raise DecodeError(exc.path(path), exc.problem, exc.field_path(path)) from None
    except RecursionError:
        raise DecodeError(path, _TOO_DEEP) from None


def from_json(value: JsonValue, path: str = "value") -> Any:
    """Turn a stored JSON value back into Python, restoring tagged types.

    Raises ``DecodeError`` naming ``path`` for a malformed tag, an unknown tag name or a
    bad payload: stored data that no encoder wrote should fail loudly, not half-decode.
    """
    return _decode_root(value, path)


def decode_call(args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """Inverse of ``encode_call``; raises ``DecodeError`` on malformed stored data."""
    if not isinstance(args, list | tuple):
        raise DecodeError("args", f"is a {type(args).__name__}, not a list.")
    if not isinstance(kwargs, dict):
        raise DecodeError("kwargs", f"is a {type(kwargs).__name__}, not a dict.")
    decoded_args = _decode_root(list(args), "args")
    try:
        decoded_kwargs = _decode_values(kwargs)
    except _Refused as exc:
        raise DecodeError(exc.path("kwargs"), exc.problem, exc.field_path("kwargs")) from None
    except RecursionError:
        raise DecodeError("kwargs", _TOO_DEEP) from None
    return decoded_args, decoded_kwargs


# --------------------------------------------------------------------------- display


def display(value: JsonValue) -> Any:
    """The stored form as plain JSON types, for people and for Django's ``TaskResult``.

    Django normalizes ``TaskResult.args``/``kwargs`` to JSON types, so tagged values are
    shown in their closest JSON shape (ISO strings, seconds, lists...). Never raises on
    well-formed data; a malformed tag is returned unchanged.
    """
    cls = type(value)
    if cls is list:
        return [display(item) for item in value]
    if cls is dict:
        if TAG in value:
            return _display_tag(value)
        return {key: display(item) for key, item in value.items()}
    return value


def display_call(args: Any, kwargs: Any) -> tuple[list[Any], dict[str, Any]]:
    """``display`` for stored call arguments (whose outer list and dict are never tags)."""
    return [display(item) for item in args], {key: display(item) for key, item in kwargs.items()}


def _display_tag(tag: dict[str, Any]) -> Any:
    try:
        name = _tag_name(tag)
        payload = tag[PAYLOAD]
        if name in ("tuple", "set", "frozenset"):
            return [display(item) for item in _payload(name, payload, list)]
        if name == "dict":
            return {key: display(item) for key, item in _dict_pairs(payload)}
        return _PLAIN[name](_DECODERS[name](payload))
    except _Refused:
        return tag


def _isoformat(value: dt.date | dt.time) -> str:
    return value.isoformat()


_PLAIN: dict[str, Callable[[Any], JsonValue]] = {
    "datetime": _isoformat,
    "date": _isoformat,
    "time": _isoformat,
    "timedelta": dt.timedelta.total_seconds,
    "decimal": str,
    "uuid": str,
    "bytes": lambda value: base64.b64encode(value).decode("ascii"),
}


# --------------------------------------------------------------------------- text


# One encoder, made once: json.dumps() with options builds a new encoder on every call.
_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _refuse(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _c_encoder() -> Callable[[Any], str] | None:
    """The C encoder behind ``_ENCODER``, built once.

    ``JSONEncoder.encode`` builds it again on every call; for the many small values of a
    bulk enqueue that was half of the encoding time. Values reaching ``dumps`` are
    already converted and acyclic (the codec checked), so no circular-reference markers.
    Falls back to ``_ENCODER`` where the C accelerator does not exist.
    """
    make = getattr(json.encoder, "c_make_encoder", None)
    if make is None:
        return None
    encode = make(
        None,  # markers: no cycle check
        _refuse,
        json.encoder.encode_basestring,  # ensure_ascii=False
        None,  # indent
        ":",
        ",",
        False,  # sort_keys
        False,  # skipkeys
        False,  # allow_nan
    )
    return lambda value: "".join(encode(value, 0))


_C_ENCODE = _c_encoder()


def dumps(value: JsonValue) -> str:
    """Compact JSON text of an already-converted value."""
    if _C_ENCODE is None:
        return _ENCODER.encode(value)
    return _C_ENCODE(value)


def loads(text: str | bytes | None) -> Any:
    """Parse stored JSON text; ``None`` stays ``None``."""
    return None if text is None else json.loads(text)
