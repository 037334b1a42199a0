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
them, and a queue should behave the same on every database. Text with a lone surrogate
(``os.fsdecode(b"\\xff")``) is refused because it is not valid Unicode: no database can store
it as UTF-8. Containers may nest at most ``MAX_DEPTH`` levels, and decoding enforces the
same limit, so whatever ``enqueue()`` accepts a worker can read back, and a hostile row
cannot exhaust a worker's stack. Subclasses of supported types (``IntEnum``, ``StrEnum``,
``OrderedDict``, named tuples...) are stored as their base type.

This code runs on every enqueue and every task run, so the common case (small containers of
ints and strings) is handled by exact-type checks, and paths are only built on error. Lone
surrogates are found on the JSON text (one ``isascii()`` per call for ASCII text), and only
then located in the value.
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

MAX_DEPTH = 100
"""The deepest nesting of containers (list, tuple, dict, set, frozenset) one value may have.

``[[1]]`` is 2 levels; the outer ``args`` list and ``kwargs`` dict of a call do not count.
Enforced the same way when encoding (at enqueue, and for return values) and when decoding
(in the worker), so a value ``enqueue()`` accepts can always be read back. 100 is far more
than real task arguments need, and leaves a wide margin on any thread: walking 100 levels
takes at most about 400 Python frames (Python stops at 1,000), and their stored JSON is
at most about 300 levels deep (a tagged tuple or set adds one level, an escaped dict two),
where Python's JSON parser stops near 1,000 (3.11) to 1,500 (3.12+).
"""

_NUL = "contains a NUL character, which databases cannot store."
_SUPPORTED = (
    "None, bool, int, float, str, list, tuple, dict, set, frozenset, bytes, "
    "datetime.datetime, datetime.date, datetime.time, datetime.timedelta, "
    "decimal.Decimal, uuid.UUID"
)
_TOO_DEEP = "is nested too deeply (or contains itself)."
_TOO_DEEP_TO_STORE = (
    f"is nested too deeply: more than {MAX_DEPTH} levels of lists, tuples, dicts and sets "
    "(or it contains itself). Pass flatter data, or store it elsewhere and pass a reference."
)
_TOO_DEEP_STORED = (
    f"is nested too deeply: more than {MAX_DEPTH} levels of lists and objects, which no "
    "enqueue writes."
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
        # Set for nesting that is too deep: the path then names only the argument (or the
        # whole value), not a hundred levels of "[0]" (or an endless loop's worth).
        self.whole_value = False

    def within(self, key: str | int, depth: int) -> None:
        """Record that the problem sits under ``key`` of the enclosing container.

        ``depth`` is that container's level: 0 for a call's ``args``/``kwargs``.
        """
        if self.whole_value and depth > 0:
            return
        self.steps.append(f"[{key!r}]")
        self.keys.append(key)

    def within_dict(self, key: str, depth: int) -> None:
        """Record that the problem sits at ``key`` of the enclosing dict: under its value,
        or in the key itself (which the key's own refusal already named)."""
        if self.at_key:
            self.at_key = False
        else:
            self.within(key, depth)

    def member(self) -> None:
        """Record that the problem sits in a member of the enclosing set."""
        if not self.whole_value:
            self.steps.append(" member")

    def path(self, root: str) -> str:
        return root + "".join(reversed(self.steps))

    def field_path(self, root: str) -> tuple[str | int, ...]:
        return (root, *reversed(self.keys))


def _too_deep(problem: str) -> _Refused:
    refusal = _Refused(problem)
    refusal.whole_value = True
    return refusal


def _tagged(name: str, payload: JsonValue) -> dict[str, JsonValue]:
    return {TAG: name, PAYLOAD: payload}


# --------------------------------------------------------------------------- encoding
#
# ``depth`` is the level a value sits at if it is a container: 1 for an argument or a
# return value itself, one more for each container around it. Only containers check it.


def _encode(value: Any, depth: int) -> JsonValue:
    # The common scalars first, by exact type: most values are ints and strings.
    cls = type(value)
    if cls is str:
        if "\x00" in value:
            raise _Refused(_NUL)
        return value
    if cls is int or cls is bool or value is None:
        return value
    encoder = _ENCODERS.get(cls)
    if encoder is None:
        encoder = _encoder_for_subclass(cls)
    return encoder(value, depth)


def _encode_items(items: Iterable[Any], depth: int) -> list[JsonValue]:
    if depth > MAX_DEPTH:
        raise _too_deep(_TOO_DEEP_TO_STORE)
    inner = depth + 1
    out: list[JsonValue] = []
    try:
        for item in items:
            out.append(_encode(item, inner))
    except _Refused as exc:
        exc.within(len(out), depth)  # every earlier item was appended
        raise
    return out


def _encode_values(mapping: Mapping[Any, Any], depth: int) -> dict[str, JsonValue]:
    if depth > MAX_DEPTH:
        raise _too_deep(_TOO_DEEP_TO_STORE)
    inner = depth + 1
    out: dict[str, JsonValue] = {}
    try:
        for key, item in mapping.items():
            if type(key) is not str:
                key = _plain_key(key)
            if "\x00" in key:
                raise _key_refusal(_NUL, " key")
            out[key] = _encode(item, inner)
    except _Refused as exc:
        exc.within_dict(key, depth)
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


def _encode_dict(mapping: Mapping[Any, Any], depth: int) -> JsonValue:
    out = _encode_values(mapping, depth)
    if TAG in out:  # user data that looks like a tag: store its items instead
        return _tagged("dict", [[key, item] for key, item in out.items()])
    return out


def _encode_float(value: float, depth: int) -> float:
    if not math.isfinite(value):
        raise _Refused(f"is {value!r}; only finite numbers can be stored.")
    return float.__float__(value)


def _encode_str(value: str, depth: int) -> JsonValue:
    return _encode(str.__str__(value), depth)


def _encode_set(name: str) -> Callable[[Any, int], JsonValue]:
    def encode(members: Iterable[Any], depth: int) -> JsonValue:
        if depth > MAX_DEPTH:
            raise _too_deep(_TOO_DEEP_TO_STORE)
        inner = depth + 1
        encoded: list[JsonValue] = []
        try:
            for member in members:
                encoded.append(_encode(member, inner))
        except _Refused as exc:
            exc.member()
            raise
        encoded.sort(key=dumps)  # sets have no order; make the stored text deterministic
        return _tagged(name, encoded)

    return encode


def _encode_decimal(value: decimal.Decimal, depth: int) -> JsonValue:
    if not value.is_finite():
        raise _Refused(f"is Decimal({str(value)!r}); only finite numbers can be stored.")
    return _tagged("decimal", decimal.Decimal.__str__(value))


_ENCODERS: dict[type, Callable[[Any, int], JsonValue]] = {
    # Exact types are looked up directly; subclasses find their base through the MRO.
    # Each takes the value and its depth; only containers use the depth.
    str: _encode_str,
    int: lambda value, _depth: int.__int__(value),
    bool: lambda value, _depth: bool(value),
    type(None): lambda value, _depth: None,
    float: _encode_float,
    list: _encode_items,
    dict: _encode_dict,
    tuple: lambda value, depth: _tagged("tuple", _encode_items(value, depth)),
    set: _encode_set("set"),
    frozenset: _encode_set("frozenset"),
    bytes: lambda value, _depth: _tagged("bytes", base64.b64encode(value).decode("ascii")),
    dt.datetime: lambda value, _depth: _tagged("datetime", dt.datetime.isoformat(value)),
    dt.date: lambda value, _depth: _tagged("date", dt.date.isoformat(value)),
    dt.time: lambda value, _depth: _tagged("time", dt.time.isoformat(value)),
    dt.timedelta: lambda value, _depth: _tagged(
        "timedelta", [value.days, value.seconds, value.microseconds]
    ),
    decimal.Decimal: _encode_decimal,
    uuid.UUID: lambda value, _depth: _tagged("uuid", uuid.UUID.__str__(value)),
}


def _encoder_for_subclass(cls: type) -> Callable[[Any, int], JsonValue]:
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


# -- text that UTF-8 cannot encode (lone surrogates)
#
# Such text is rare, and the JSON text is built anyway, so it is looked for there: an
# ASCII text (the usual case) costs one ``isascii()``. Only when the text cannot be
# encoded is the value walked again to say where the bad string sits.


def _encodable(text: str) -> bool:
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _surrogate_problem(text: str) -> str:
    bad = next((char for char in text if "\ud800" <= char <= "\udfff"), "\udfff")
    return (
        f"contains the lone surrogate {bad!a}, which is not valid Unicode and cannot be "
        "stored as UTF-8 (text decoded with os.fsdecode() or errors='surrogateescape' holds "
        "such characters). Pass bytes instead, or decode with errors='replace'."
    )


def _find_unencodable(value: Any, depth: int) -> None:
    """Raise ``_Refused`` at the first string or dict key that UTF-8 cannot encode.

    Walks a value the encoder has already accepted, so only its container types occur.
    """
    if isinstance(value, str):
        if not _encodable(value):
            raise _Refused(_surrogate_problem(value))
    elif isinstance(value, dict):
        for key, item in value.items():
            try:
                if not _encodable(key):
                    raise _key_refusal(_surrogate_problem(key), " key")
                _find_unencodable(item, depth + 1)
            except _Refused as exc:
                exc.within_dict(key, depth)
                raise
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            try:
                _find_unencodable(item, depth + 1)
            except _Refused as exc:
                exc.within(index, depth)
                raise
    elif isinstance(value, set | frozenset):
        for member in value:
            try:
                _find_unencodable(member, depth + 1)
            except _Refused as exc:
                exc.member()
                raise


def _locate_unencodable(value: Any, root: str, depth: int) -> EncodeError | None:
    try:
        _find_unencodable(value, depth)
    except _Refused as exc:
        return _refusal_to_error(exc, root)
    return None


# Not expected for values the encoder accepted; said plainly if it ever happens.
_UNENCODABLE = "contains text that cannot be stored as UTF-8."


def unencodable_call_error(args: Any, kwargs: Any) -> EncodeError:
    """The error for call arguments whose JSON text (see ``dumps``) UTF-8 cannot encode.

    ``encode_call`` does not look for lone surrogates itself: the caller finds them on the
    text it builds anyway (``text.encode()`` raising ``UnicodeEncodeError``), then asks
    here where they are.
    """
    return (
        _locate_unencodable(args, "args", 0)
        or _locate_unencodable(kwargs, "kwargs", 0)
        or EncodeError("args", _UNENCODABLE)
    )


def _storable_text(encoded: JsonValue) -> bool:
    if isinstance(encoded, str):  # the encoder's output: exact types only
        return _encodable(encoded)
    if isinstance(encoded, list | dict):
        return _encodable(dumps(encoded))
    return True  # None, bool, int, float


def to_json(value: Any, path: str) -> JsonValue:
    """Return ``value`` in its stored JSON form, or raise ``EncodeError`` naming ``path``.

    Refusing here, at enqueue time, beats a worker failing on the value later. Unlike
    ``encode_call``, this also refuses lone surrogates itself.
    """
    try:
        encoded = _encode(value, 1)
    except _Refused as exc:
        raise _refusal_to_error(exc, path) from None
    except RecursionError:
        raise EncodeError(path, _TOO_DEEP) from None
    if not _storable_text(encoded):
        raise _locate_unencodable(value, path, 1) or EncodeError(path, _UNENCODABLE)
    return encoded


def encode_call(args: Any, kwargs: Any) -> tuple[list[JsonValue], dict[str, JsonValue]]:
    """Encode a call's arguments: ``args`` is stored as a list, ``kwargs`` as a dict.

    The two containers themselves are never tagged, so stored rows keep Django's shape.
    Lone surrogates are left for the caller to find on the JSON text (see
    ``unencodable_call_error``), which keeps this, the bulk-enqueue path, lean.
    """
    try:
        encoded_args = _encode_items(args, 0)
    except _Refused as exc:
        raise _refusal_to_error(exc, "args") from None
    except RecursionError:
        raise EncodeError("args", _TOO_DEEP) from None
    try:
        encoded_kwargs = _encode_values(kwargs, 0) if kwargs else {}
    except _Refused as exc:
        raise _refusal_to_error(exc, "kwargs") from None
    except RecursionError:
        raise EncodeError("kwargs", _TOO_DEEP) from None
    return encoded_args, encoded_kwargs


# --------------------------------------------------------------------------- decoding


#
# ``depth`` counts as in encoding: each JSON array or object is a level, and a tag counts
# as the one container it stands for, so the decoder refuses exactly what the encoder
# would have refused. A tag of a scalar type (datetime...) is no container, as in encoding.


def _decode(value: Any, depth: int) -> Any:
    cls = type(value)
    if cls is list:
        return _decode_items(value, depth)
    if cls is dict:
        if TAG in value:
            return _decode_tag(value, depth)
        return _decode_values(value, depth)
    return value


def _decode_items(items: list[Any], depth: int) -> list[Any]:
    if depth > MAX_DEPTH:
        raise _too_deep(_TOO_DEEP_STORED)
    inner = depth + 1
    out: list[Any] = []
    append = out.append
    try:
        for item in items:
            cls = type(item)
            append(_decode(item, inner) if cls is list or cls is dict else item)
    except _Refused as exc:
        exc.within(len(out), depth)
        raise
    return out


def _decode_values(mapping: dict[str, Any], depth: int) -> dict[str, Any]:
    if depth > MAX_DEPTH:
        raise _too_deep(_TOO_DEEP_STORED)
    inner = depth + 1
    out: dict[str, Any] = {}
    try:
        for key, item in mapping.items():
            cls = type(item)
            out[key] = _decode(item, inner) if cls is list or cls is dict else item
    except _Refused as exc:
        exc.within(key, depth)
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


def _decode_tag(tag: dict[str, Any], depth: int) -> Any:
    return _DECODERS[_tag_name(tag)](tag[PAYLOAD], depth)


def _payload(name: str, payload: Any, expected: type) -> Any:
    if type(payload) is not expected:
        raise _Refused(
            f"is a {name!r} tag whose payload is a {type(payload).__name__}, "
            f"not a {expected.__name__}."
        )
    return payload


def _decode_iso(name: str, parse: Callable[[str], Any]) -> Callable[[Any, int], Any]:
    def decode(payload: Any, _depth: int) -> Any:
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


def _decode_timedelta(payload: Any, _depth: int) -> dt.timedelta:
    parts = _payload("timedelta", payload, list)
    if len(parts) != 3 or any(type(part) is not int for part in parts):
        raise _Refused(
            f"is a 'timedelta' tag whose payload {payload!r} is not [days, seconds, microseconds]."
        )
    try:
        return dt.timedelta(days=parts[0], seconds=parts[1], microseconds=parts[2])
    except OverflowError:
        raise _Refused(f"is a 'timedelta' tag out of range: {payload!r}.") from None


def _decode_decimal(payload: Any, _depth: int) -> decimal.Decimal:
    try:
        value = decimal.Decimal(_payload("decimal", payload, str))
    except decimal.InvalidOperation:
        value = None
    if value is None or not value.is_finite():
        raise _Refused(f"is a 'decimal' tag with the invalid value {payload!r}.")
    return value


def _decode_bytes(payload: Any, _depth: int) -> bytes:
    try:
        return base64.b64decode(_payload("bytes", payload, str), validate=True)
    except (binascii.Error, ValueError):
        raise _Refused(f"is a 'bytes' tag with invalid base64 {payload!r}.") from None


def _decode_set(name: str, build: Callable[[list[Any]], Any]) -> Callable[[Any, int], Any]:
    def decode(payload: Any, depth: int) -> Any:
        if depth > MAX_DEPTH:
            raise _too_deep(_TOO_DEEP_STORED)
        inner = depth + 1
        members: list[Any] = []
        payload = _payload(name, payload, list)
        try:
            for member in payload:
                members.append(_decode(member, inner))
        except _Refused as exc:
            exc.member()
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


def _decode_escaped_dict(payload: Any, depth: int) -> dict[str, Any]:
    if depth > MAX_DEPTH:
        raise _too_deep(_TOO_DEEP_STORED)
    inner = depth + 1
    out: dict[str, Any] = {}
    pairs = _dict_pairs(payload)
    try:
        for key, item in pairs:
            out[key] = _decode(item, inner)
    except _Refused as exc:
        exc.within(key, depth)
        raise
    return out


_DECODERS: dict[str, Callable[[Any, int], Any]] = {
    # Each takes the payload and the depth of the value the tag stands for.
    "tuple": lambda payload, depth: tuple(_decode_items(_payload("tuple", payload, list), depth)),
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
        return _decode(value, 1)
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
    try:
        decoded_args = _decode_items(list(args), 0)
    except _Refused as exc:
        raise DecodeError(exc.path("args"), exc.problem, exc.field_path("args")) from None
    except RecursionError:
        raise DecodeError("args", _TOO_DEEP) from None
    try:
        decoded_kwargs = _decode_values(kwargs, 0)
    except _Refused as exc:
        raise DecodeError(exc.path("kwargs"), exc.problem, exc.field_path("kwargs")) from None
    except RecursionError:
        raise DecodeError("kwargs", _TOO_DEEP) from None
    return decoded_args, decoded_kwargs


# --------------------------------------------------------------------------- display


# The deepest stored JSON an enqueue writes: MAX_DEPTH containers, each at most three
# JSON levels (an escaped dict is a tag holding a list of pairs).
MAX_STORED_DEPTH = 3 * MAX_DEPTH + 1


def display(value: Any, depth: int = 1) -> Any:
    """The stored form as plain JSON types, for people and for Django's ``TaskResult``.

    Django normalizes ``TaskResult.args``/``kwargs`` to JSON types, so tagged values are
    shown in their closest JSON shape (ISO strings, seconds, lists...). Never raises on
    well-formed data; a malformed tag is returned unchanged. Stored JSON deeper than any
    enqueue writes (a hand edit, a hostile row) raises ``DecodeError``, on every Python
    version alike, rather than whatever the interpreter's recursion limit allows.
    """
    cls = type(value)
    if cls is list or cls is dict:
        if depth > MAX_STORED_DEPTH:
            raise DecodeError("value", f"is nested more than {MAX_STORED_DEPTH} levels deep.")
        if cls is list:
            return [display(item, depth + 1) for item in value]
        if TAG in value:
            return _display_tag(value, depth)
        return {key: display(item, depth + 1) for key, item in value.items()}
    return value


def display_call(args: Any, kwargs: Any, *texts: str) -> tuple[list[Any], dict[str, Any]]:
    """``display`` for stored call arguments (whose outer list and dict are never tags).

    ``texts``, when given, are the ``dumps`` texts of a fresh ``encode_call`` result: if
    the tag key occurs in none of them, that result already is plain JSON and is returned
    as is, so a bulk enqueue does not walk its arguments a second time.
    """
    if texts:
        for text in texts:
            if TAG in text:
                break
        else:
            return args, kwargs
    return [display(item, 2) for item in args], {
        key: display(item, 2) for key, item in kwargs.items()
    }


def _display_tag(tag: dict[str, Any], depth: int) -> Any:
    try:
        name = _tag_name(tag)
        payload = tag[PAYLOAD]
        if name in ("tuple", "set", "frozenset"):
            return [display(item, depth + 2) for item in _payload(name, payload, list)]
        if name == "dict":
            return {key: display(item, depth + 3) for key, item in _dict_pairs(payload)}
        return _PLAIN[name](_DECODERS[name](payload, 1))  # a scalar: depth plays no part
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


# One encoder, made once: json.dumps() with options builds a new one on every call.
# Compact, UTF-8 text as is (the size limit counts its bytes, and lone surrogates are found
# by encoding it), no NaN. No cycle check: the codec has already refused cycles (as nesting
# too deep), so values reaching ``dumps`` are acyclic.
_ENCODER = json.JSONEncoder(
    separators=(",", ":"), ensure_ascii=False, allow_nan=False, check_circular=False
)

dumps: Callable[[JsonValue], str] = _ENCODER.encode
"""Compact JSON text of an already-converted value."""


# The scanner behind ``json.loads`` (json's C one), called directly: ``loads`` below
# reads the JSON columns of every claimed row, mostly short texts such as ``[1, 2]``,
# where ``json.loads``'s Python wrappers (type checks, two whitespace matches) cost three
# quarters of the call. The default decoder's options; shared by threads as json's is.
# (``JSONDecoder.__init__`` sets ``scan_once``; typeshed does not declare it.)
_scan_once: Callable[[str, int], tuple[Any, int]] = json.JSONDecoder().scan_once  # type: ignore[attr-defined]


def loads(text: str | bytes | None) -> Any:
    """Parse stored JSON text; ``None`` stays ``None``.

    Text the scanner reads whole from its first character is returned as ``json.loads``
    would return it; anything else (bytes, surrounding whitespace, a BOM, trailing data,
    malformed text) goes through ``json.loads``, so results and errors are its own."""
    if type(text) is str:
        try:
            value, end = _scan_once(text, 0)
        except (StopIteration, ValueError):
            return json.loads(text)
        if end == len(text):
            return value
    return None if text is None else json.loads(text)
