"""Argument and return-value encoding: JSON that every database stores the same way.

Pure tests (no database): the stored form is plain JSON, tagged types come back exactly,
refused values name their path, malformed stored data fails loudly, and ``display`` always
yields plain JSON.
"""

from __future__ import annotations

import collections
import datetime as dt
import decimal
import enum
import json
import math
import uuid
import zoneinfo
from decimal import Decimal
from typing import Any, NamedTuple

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_tasks_plus.codec import (
    MAX_DEPTH,
    PAYLOAD,
    TAG,
    DecodeError,
    EncodeError,
    decode_call,
    display,
    display_call,
    dumps,
    encode_call,
    from_json,
    loads,
    to_json,
)

# --------------------------------------------------------------------------- helpers

PLAIN_TYPES = (type(None), bool, int, float, str, list, dict)
TAG_NAMES = [
    "tuple",
    "set",
    "frozenset",
    "dict",
    "bytes",
    "datetime",
    "date",
    "time",
    "timedelta",
    "decimal",
    "uuid",
]


def round_trip(value: Any) -> Any:
    """Encode, store as text, read back and decode, as enqueue and a worker would."""
    return from_json(loads(dumps(to_json(value, "x"))))


def assert_same(expected: Any, actual: Any) -> None:
    """``==`` plus exact types all the way down (``==`` alone mixes 1, 1.0 and True)."""
    assert type(actual) is type(expected), (expected, actual)
    assert actual == expected
    if isinstance(expected, float):
        assert math.copysign(1, actual) == math.copysign(1, expected)
    elif isinstance(expected, Decimal):
        assert actual.as_tuple() == expected.as_tuple()  # exponent and sign kept
    elif isinstance(expected, dt.datetime | dt.time):
        assert (actual.utcoffset() is None) == (expected.utcoffset() is None)
        assert actual.utcoffset() == expected.utcoffset()
    elif isinstance(expected, list | tuple):
        for left, right in zip(expected, actual, strict=True):
            assert_same(left, right)
    elif isinstance(expected, dict):
        assert list(actual) == list(expected)
        for key in expected:
            assert_same(expected[key], actual[key])
    elif isinstance(expected, set | frozenset):
        # Equal members cannot coexist in a set, so each has exactly one partner.
        for member in expected:
            (partner,) = [other for other in actual if other == member]
            assert_same(member, partner)


def assert_plain(value: Any) -> None:
    """Only JSON's own types, with str keys."""
    assert type(value) in PLAIN_TYPES, value
    if type(value) is list:
        for item in value:
            assert_plain(item)
    elif type(value) is dict:
        for key, item in value.items():
            assert type(key) is str
            assert_plain(item)


# --------------------------------------------------------------------------- strategies

# Storable text: no NUL, and no lone surrogates (category Cs), which UTF-8 cannot encode.
text = st.text(st.characters(exclude_characters="\x00", exclude_categories=["Cs"]), max_size=8)
keys = text | st.sampled_from([TAG, PAYLOAD])
finite_floats = st.floats(allow_nan=False, allow_infinity=False)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | finite_floats | text,
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(text.filter(lambda key: key != TAG), children, max_size=5)
    ),
    max_leaves=20,
)

offsets = st.timedeltas(
    min_value=dt.timedelta(hours=-24) + dt.timedelta(microseconds=1),
    max_value=dt.timedelta(hours=24) - dt.timedelta(microseconds=1),
)
fixed_zones = st.none() | st.just(dt.UTC) | st.builds(dt.timezone, offsets)
decimals = st.decimals(allow_nan=False, allow_infinity=False) | st.builds(
    lambda sign, digits, exponent: Decimal((sign, digits, exponent)),
    st.integers(0, 1),
    st.lists(st.integers(0, 9), min_size=1, max_size=30).map(tuple),
    st.integers(-40, 40),
)
hashable_leaves = (
    st.none()
    | st.booleans()
    | st.integers()
    | finite_floats
    | text
    | st.binary(max_size=16)
    | st.datetimes(timezones=fixed_zones)
    | st.dates()
    | st.times(timezones=fixed_zones)
    | st.timedeltas()
    | decimals
    | st.uuids()
)
hashables = st.recursive(
    hashable_leaves,
    lambda children: (
        st.lists(children, max_size=4).map(tuple) | st.frozensets(children, max_size=4)
    ),
    max_leaves=10,
)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return (
        st.lists(children, max_size=4)
        | st.lists(children, max_size=4).map(tuple)
        | st.dictionaries(keys, children, max_size=4)
        | st.sets(hashables, max_size=4)
        | st.frozensets(hashables, max_size=4)
        # User data shaped exactly like a tag must not be mistaken for one.
        | st.fixed_dictionaries({TAG: st.sampled_from(TAG_NAMES) | children, PAYLOAD: children})
    )


values = st.recursive(hashable_leaves, _containers, max_leaves=25)


# --------------------------------------------------------------------------- properties


@given(values)
def test_every_supported_value_round_trips_exactly(value):
    assert_same(value, round_trip(value))


@given(values)
def test_stored_form_is_plain_json(value):
    stored = to_json(value, "x")
    assert_plain(stored)
    assert loads(dumps(stored)) == stored


@given(values)
def test_display_is_plain_json(value):
    shown = display(loads(dumps(to_json(value, "x"))))
    assert_plain(shown)
    assert loads(dumps(shown)) == shown


@given(json_values)
def test_json_values_are_stored_as_themselves(value):
    stored = to_json(value, "x")
    assert stored == value
    assert_same(value, loads(dumps(stored)))
    assert display(stored) == value


@given(st.lists(values, max_size=4), st.dictionaries(keys, values, max_size=4))
def test_call_round_trips(args, kwargs):
    stored_args, stored_kwargs = encode_call(tuple(args), kwargs)
    assert type(stored_args) is list
    assert type(stored_kwargs) is dict
    assert list(stored_kwargs) == list(kwargs)  # the kwargs dict itself is never a tag
    decoded_args, decoded_kwargs = decode_call(
        loads(dumps(stored_args)), loads(dumps(stored_kwargs))
    )
    assert_same(args, decoded_args)
    assert_same(kwargs, decoded_kwargs)


@given(st.sets(hashables, max_size=6))
def test_stored_sets_do_not_depend_on_insertion_order(members):
    forwards, backwards = set(), set()
    ordered = list(members)
    for member in ordered:
        forwards.add(member)
    for member in reversed(ordered):
        backwards.add(member)
    assert dumps(to_json(forwards, "x")) == dumps(to_json(backwards, "x"))


# --------------------------------------------------------------------------- examples

PARIS = zoneinfo.ZoneInfo("Europe/Paris")


@pytest.mark.parametrize(
    ("value", "stored"),
    [
        ((1, "a"), {TAG: "tuple", PAYLOAD: [1, "a"]}),
        ((), {TAG: "tuple", PAYLOAD: []}),
        ({3, 1, "b"}, {TAG: "set", PAYLOAD: ["b", 1, 3]}),
        (frozenset({2}), {TAG: "frozenset", PAYLOAD: [2]}),
        (b"\x00\xff", {TAG: "bytes", PAYLOAD: "AP8="}),
        (dt.datetime(2026, 1, 1, 12), {TAG: "datetime", PAYLOAD: "2026-01-01T12:00:00"}),
        (
            dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC),
            {TAG: "datetime", PAYLOAD: "2026-01-01T12:00:00+00:00"},
        ),
        (
            dt.datetime(2026, 7, 1, 12, 0, 0, 5, tzinfo=PARIS),
            {TAG: "datetime", PAYLOAD: "2026-07-01T12:00:00.000005+02:00"},
        ),
        (dt.date(2026, 2, 3), {TAG: "date", PAYLOAD: "2026-02-03"}),
        (dt.time(4, 5, 6), {TAG: "time", PAYLOAD: "04:05:06"}),
        (
            dt.time(4, 5, tzinfo=dt.timezone(dt.timedelta(hours=-3, minutes=-30))),
            {TAG: "time", PAYLOAD: "04:05:00-03:30"},
        ),
        (dt.timedelta(days=-1, seconds=5, microseconds=7), {TAG: "timedelta", PAYLOAD: [-1, 5, 7]}),
        (Decimal("1.10"), {TAG: "decimal", PAYLOAD: "1.10"}),
        (Decimal("-0"), {TAG: "decimal", PAYLOAD: "-0"}),
        (Decimal("1E+3"), {TAG: "decimal", PAYLOAD: "1E+3"}),
        (
            uuid.UUID("12345678-1234-5678-1234-567812345678"),
            {TAG: "uuid", PAYLOAD: "12345678-1234-5678-1234-567812345678"},
        ),
        ({TAG: 1, "b": (2,)}, {TAG: "dict", PAYLOAD: [[TAG, 1], ["b", {TAG: "tuple", "v": [2]}]]}),
        ({PAYLOAD: 1}, {PAYLOAD: 1}),
        ([1, (2,)], [1, {TAG: "tuple", PAYLOAD: [2]}]),
        ({"a": None, "b": [True, 1.5]}, {"a": None, "b": [True, 1.5]}),
        (2**100, 2**100),
    ],
    ids=repr,
)
def test_stored_form(value, stored):
    assert to_json(value, "x") == stored
    assert_same(value, round_trip(value))


def test_tuples_are_preserved_and_lists_stay_lists():
    args, kwargs = encode_call((1, (2, 3), [4]), {"k": (4,)})
    assert args == [1, {TAG: "tuple", PAYLOAD: [2, 3]}, [4]]
    assert kwargs == {"k": {TAG: "tuple", PAYLOAD: [4]}}
    assert decode_call(args, kwargs) == ([1, (2, 3), [4]], {"k": (4,)})
    assert type(decode_call(args, kwargs)[0][1]) is tuple


def test_zoneinfo_datetimes_keep_their_offset_and_instant():
    summer = dt.datetime(2026, 7, 1, 12, tzinfo=PARIS)
    winter = dt.datetime(2026, 1, 1, 12, tzinfo=PARIS)
    for value in (summer, winter):
        back = round_trip(value)
        assert_same(value, back)
        assert back.tzinfo == dt.timezone(value.utcoffset())


def test_ambiguous_zoneinfo_datetime_keeps_instant_and_offset():
    # 02:30 on 2026-10-25 happens twice in Paris; fold=1 is the second (UTC+1) one.
    # Python's == never equates such a time with another zone (PEP 495), so compare the
    # instant and the offset instead.
    value = dt.datetime(2026, 10, 25, 2, 30, fold=1, tzinfo=PARIS)
    back = round_trip(value)
    assert back.utcoffset() == dt.timedelta(hours=1)
    assert back.timestamp() == value.timestamp()


def test_naive_and_aware_are_not_confused():
    naive = round_trip(dt.datetime(2026, 1, 1))
    aware = round_trip(dt.datetime(2026, 1, 1, tzinfo=dt.UTC))
    assert naive.tzinfo is None
    assert aware.utcoffset() == dt.timedelta(0)
    assert round_trip(dt.time(1)).tzinfo is None


def test_extreme_datetimes_and_timedeltas_round_trip():
    for value in (
        dt.datetime.min,
        dt.datetime.max,
        dt.datetime.min.replace(tzinfo=dt.timezone(dt.timedelta(hours=23, minutes=59))),
        dt.timedelta.min,
        dt.timedelta.max,
        dt.date.min,
        dt.time.max,
    ):
        assert_same(value, round_trip(value))


@pytest.mark.parametrize("micros", [1, -1, 999999, -500000])
def test_sub_second_utc_offsets_survive(micros):
    # CPython's fromisoformat reads "+00:00:00.000001" as UTC; the codec corrects that.
    zone = dt.timezone(dt.timedelta(microseconds=micros))
    for value in (dt.datetime(2026, 1, 1, tzinfo=zone), dt.time(1, tzinfo=zone)):
        assert_same(value, round_trip(value))


class Colour(enum.IntEnum):
    RED = 1


class Name(enum.StrEnum):
    ADA = "ada"


class Point(NamedTuple):
    x: int
    y: int


class Stamp(dt.datetime):
    pass


def test_subclasses_are_stored_as_their_base_type():
    stored = to_json(
        [
            Colour.RED,
            Name.ADA,
            Point(1, 2),
            collections.OrderedDict(a=1),
            Stamp(2026, 1, 1),
            {Name.ADA: 1},
        ],
        "x",
    )
    assert dumps(stored) == dumps(
        [
            1,
            "ada",
            {TAG: "tuple", PAYLOAD: [1, 2]},
            {"a": 1},
            {TAG: "datetime", PAYLOAD: "2026-01-01T00:00:00"},
            {"ada": 1},
        ]
    )
    assert type(stored[0]) is int
    assert type(stored[1]) is str
    assert type(stored[5]) is dict
    assert [type(key) for key in stored[5]] == [str]
    assert from_json(stored) == [1, "ada", (1, 2), {"a": 1}, dt.datetime(2026, 1, 1), {"ada": 1}]


def test_encode_call_stores_a_list_and_a_dict():
    assert encode_call((1, "x", {"a": [1, 2]}), {"k": 3}) == ([1, "x", {"a": [1, 2]}], {"k": 3})
    # A keyword argument named like the tag key does not turn kwargs into a tag.
    args, kwargs = encode_call((), {TAG: "set", PAYLOAD: [1]})
    assert kwargs == {TAG: "set", PAYLOAD: [1]}
    assert decode_call(args, kwargs) == ([], {TAG: "set", PAYLOAD: [1]})
    assert display_call(args, kwargs) == ([], {TAG: "set", PAYLOAD: [1]})


def test_loads_none():
    assert loads(None) is None


# Texts that stored columns may hold: JSON as enqueue writes it, and what a hostile or
# hand-edited row could hold (whitespace, a BOM, trailing data, NaN, huge numbers, lone
# surrogates, malformed text).
stored_texts = st.one_of(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    ).map(json.dumps),
    st.text(alphabet=' \t\n\ufeff[]{}",:0123456789.eE+-NaInfityrulsx\\ud800', max_size=12),
)


@given(stored_texts, st.sampled_from(["", " ", "\n", "\ufeff"]), st.sampled_from(["", " ", "x"]))
def test_loads_reads_stored_text_exactly_as_json_loads(text, before, after):
    """``loads`` calls json's scanner directly for speed; its value, or its error, is
    ``json.loads``'s for every text."""
    text = before + text + after

    def outcome(parse):
        try:
            return ("value", repr(parse(text)))
        except ValueError as exc:
            return (type(exc).__name__, str(exc))

    assert outcome(loads) == outcome(json.loads)


def test_dumps_is_compact_and_keeps_unicode():
    assert dumps({"a": ["é", 1]}) == '{"a":["é",1]}'


# --------------------------------------------------------------------------- refusals


class Opaque:
    pass


OPAQUE = f"is a {Opaque.__module__}.Opaque"


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        (object(), "x", "is a builtins.object, which cannot be stored"),
        (Opaque(), "x", OPAQUE),
        ({"a": [1, object()]}, "x['a'][1]", "is a builtins.object"),
        ((1, [2, Opaque()]), "x[1][1]", OPAQUE),
        (bytearray(b"a"), "x", "is a builtins.bytearray"),
        (1j, "x", "is a builtins.complex"),
        ({1: 2}, "x", "has the key 1 (int); only str keys can be stored."),
        ({"a": {(1,): 2}}, "x['a']", "has the key (1,) (tuple)"),
        (float("inf"), "x", "is inf; only finite numbers can be stored."),
        ([float("-inf")], "x[0]", "only finite numbers"),
        ({"a": float("nan")}, "x['a']", "is nan; only finite numbers"),
        (Decimal("NaN"), "x", "is Decimal('NaN'); only finite numbers can be stored."),
        (Decimal("sNaN"), "x", "only finite numbers"),
        ((Decimal("Infinity"),), "x[0]", "is Decimal('Infinity')"),
        (Decimal("-Infinity"), "x", "only finite numbers"),
        ("nul\x00", "x", "contains a NUL character"),
        ({"k\x00": 1}, "x key", "NUL character"),
        ({"a": {"k\x00": 1}}, "x['a'] key", "NUL character"),
        ({"a\x00"}, "x member", "NUL character"),
        ([frozenset({(1, Opaque())})], "x[0] member[1]", OPAQUE),
        ({TAG: object()}, f"x[{TAG!r}]", "is a builtins.object"),
        (("ok", {"when": "\x00"}), "x[1]['when']", "NUL character"),
    ],
    ids=repr,
)
def test_unstorable_values_name_their_path(value, path, problem):
    with pytest.raises(EncodeError) as info:
        to_json(value, "x")
    assert info.value.path == path
    assert problem in info.value.problem
    assert str(info.value) == f"{path} {info.value.problem}"


def test_unknown_type_message_lists_supported_types():
    with pytest.raises(EncodeError) as info:
        to_json(Opaque(), "x")
    for name in ("tuple", "set", "bytes", "datetime.datetime", "decimal.Decimal", "uuid.UUID"):
        assert name in info.value.problem


@pytest.mark.parametrize(
    ("args", "kwargs", "path"),
    [
        ((1, {"when": object()}), {}, "args[1]['when']"),
        ((), {"when": {"a": object()}}, "kwargs['when']['a']"),
        ((), {1: 2}, "kwargs"),
        ((), {"k\x00": 2}, "kwargs key"),
        (("\x00",), {}, "args[0]"),
    ],
)
def test_encode_call_names_the_argument(args, kwargs, path):
    with pytest.raises(EncodeError) as info:
        encode_call(args, kwargs)
    assert info.value.path == path


def test_return_value_path():
    with pytest.raises(EncodeError, match=r"^return value\[0\] is a builtins.object"):
        to_json([object()], "return value")


def test_encode_error_is_a_type_error():
    assert issubclass(EncodeError, TypeError)


def test_self_containing_values_are_refused():
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(EncodeError, match="nested too deeply") as info:
        to_json(loop, "x")
    assert info.value.path == "x"


@given(st.text(st.characters(categories=["Cs"]), min_size=1, max_size=3), json_values)
def test_a_lone_surrogate_anywhere_is_refused(surrogates, value):
    # UTF-8 cannot encode a lone surrogate, so no database can store it.
    for wrapped, path in (
        ([value, {"k": ("a" + surrogates,)}], "x[1]['k'][0]"),
        ({"ok": value, surrogates: 1}, "x key"),
    ):
        with pytest.raises(EncodeError, match="contains the lone surrogate") as info:
            to_json(wrapped, "x")
        assert info.value.path == path


WRAPPERS = {
    "list": lambda value: [value],
    "tuple": lambda value: (value,),
    "dict": lambda value: {"k": value},
    "escaped dict": lambda value: {TAG: value},
}


@given(st.lists(st.sampled_from(sorted(WRAPPERS)), min_size=MAX_DEPTH - 2, max_size=MAX_DEPTH + 2))
def test_encoding_and_decoding_refuse_exactly_the_same_depth(kinds):
    value: Any = 1
    for kind in kinds:
        value = WRAPPERS[kind](value)
    if len(kinds) > MAX_DEPTH:
        with pytest.raises(EncodeError, match="nested too deeply"):
            to_json(value, "x")
        with pytest.raises(EncodeError, match="nested too deeply"):
            encode_call((value,), {})
        return
    assert round_trip(value) == value
    assert decode_call(*loads(dumps(list(encode_call((), {"v": value})))))[1] == {"v": value}


# --------------------------------------------------------------------------- decoding errors


def tag(name: Any, payload: Any) -> dict[str, Any]:
    return {TAG: name, PAYLOAD: payload}


@pytest.mark.parametrize(
    ("stored", "path", "problem"),
    [
        (tag("nope", 1), "value", "has an unknown tag 'nope'."),
        (tag(3, 1), "value", "has an unknown tag 3."),
        (tag(["set"], 1), "value", "unknown tag"),
        ({TAG: "tuple"}, "value", "is a malformed tag"),
        ({TAG: "tuple", PAYLOAD: [], "extra": 1}, "value", "is a malformed tag"),
        (tag("tuple", "ab"), "value", "'tuple' tag whose payload is a str, not a list"),
        (tag("set", "abc"), "value", "'set' tag whose payload is a str, not a list"),
        (tag("frozenset", {"a": 1}), "value", "payload is a dict, not a list"),
        (tag("set", [[1]]), "value", "'set' tag with an unhashable member"),
        (tag("set", [1, tag("nope", 1)]), "value member", "unknown tag"),
        (tag("datetime", "not a date"), "value", "'datetime' tag with the invalid value"),
        (tag("datetime", 5), "value", "payload is a int, not a str"),
        (tag("date", "2026-13-01"), "value", "'date' tag with the invalid value"),
        (tag("time", "25:00"), "value", "'time' tag with the invalid value"),
        (tag("timedelta", [1, 2]), "value", "is not [days, seconds, microseconds]"),
        (tag("timedelta", [1, 2, 3.5]), "value", "is not [days, seconds, microseconds]"),
        (tag("timedelta", [1, True, 3]), "value", "is not [days, seconds, microseconds]"),
        (tag("timedelta", [10**10, 0, 0]), "value", "out of range"),
        (tag("decimal", "abc"), "value", "'decimal' tag with the invalid value 'abc'"),
        (tag("decimal", "NaN"), "value", "invalid value 'NaN'"),
        (tag("decimal", 1.5), "value", "payload is a float, not a str"),
        (tag("uuid", "xyz"), "value", "'uuid' tag with the invalid value"),
        (tag("bytes", "!!"), "value", "'bytes' tag with invalid base64"),
        (tag("bytes", "é"), "value", "'bytes' tag with invalid base64"),
        (tag("dict", [[1, 2]]), "value", "is not a [str, value] pair"),
        (tag("dict", [["a"]]), "value", "is not a [str, value] pair"),
        (tag("dict", {"a": 1}), "value", "payload is a dict, not a list"),
        (tag("dict", [["a", tag("nope", 0)]]), "value['a']", "unknown tag"),
        ({"a": [1, tag("nope", 0)]}, "value['a'][1]", "unknown tag"),
        (tag("tuple", [0, [tag("uuid", 1)]]), "value[1][0]", "payload is a int"),
    ],
    ids=repr,
)
def test_malformed_stored_data_is_refused(stored, path, problem):
    with pytest.raises(DecodeError) as info:
        from_json(stored)
    assert info.value.path == path
    assert problem in info.value.problem
    assert isinstance(info.value, ValueError)


def test_from_json_uses_the_given_path():
    with pytest.raises(DecodeError) as info:
        from_json([tag("nope", 0)], "return value")
    assert info.value.path == "return value[0]"


@pytest.mark.parametrize(
    ("args", "kwargs", "path"),
    [
        ([1, tag("nope", 0)], {}, "args[1]"),
        ([], {"k": [tag("date", "x")]}, "kwargs['k'][0]"),
        ("x", {}, "args"),
        ([], [], "kwargs"),
    ],
)
def test_decode_call_names_the_argument(args, kwargs, path):
    with pytest.raises(DecodeError) as info:
        decode_call(args, kwargs)
    assert info.value.path == path


def test_plain_data_decodes_to_copies():
    stored = {"a": [1, {"b": 2}]}
    decoded = from_json(stored)
    assert decoded == stored
    decoded["a"][1]["b"] = 3
    assert stored == {"a": [1, {"b": 2}]}


# --------------------------------------------------------------------------- display


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC), "2026-01-01T12:00:00+00:00"),
        (dt.datetime(2026, 1, 1, 12), "2026-01-01T12:00:00"),
        (dt.date(2026, 1, 2), "2026-01-02"),
        (dt.time(3, 4, 5, 6), "03:04:05.000006"),
        (dt.timedelta(minutes=1, microseconds=500000), 60.5),
        (Decimal("1.10"), "1.10"),
        (
            uuid.UUID("12345678-1234-5678-1234-567812345678"),
            "12345678-1234-5678-1234-567812345678",
        ),
        ((1, (2, b"a")), [1, [2, "YQ=="]]),
        ({2, 1}, [1, 2]),
        (frozenset({"a"}), ["a"]),
        (b"hi", "aGk="),
        ({TAG: 1, "d": dt.date(2026, 1, 1)}, {TAG: 1, "d": "2026-01-01"}),
        ({"a": [Decimal("2")]}, {"a": ["2"]}),
        ([1, "x", None, 1.5, True], [1, "x", None, 1.5, True]),
    ],
    ids=repr,
)
def test_display_shows_plain_json(value, shown):
    result = display(to_json(value, "x"))
    assert result == shown
    assert_plain(result)


@pytest.mark.parametrize(
    "stored",
    [
        tag("nope", 1),
        {TAG: "tuple"},
        tag("datetime", "not a date"),
        tag("set", "abc"),
        tag("dict", [[1, 2]]),
        tag("timedelta", [1]),
        tag("decimal", "NaN"),
    ],
    ids=repr,
)
def test_display_returns_malformed_tags_unchanged(stored):
    assert display(stored) == stored
    assert display([1, stored, tag("date", "2026-01-01")]) == [1, stored, "2026-01-01"]


def test_display_call():
    args, kwargs = encode_call((dt.date(2026, 1, 1), (1,)), {"k": {1, 2}})
    assert display_call(args, kwargs) == (["2026-01-01", [1]], {"k": [1, 2]})


def test_display_call_given_tagless_texts_returns_the_encoded_call_itself():
    # What a bulk enqueue does: the texts show no tag, so there is nothing to walk.
    args, kwargs = encode_call((1, "x", [2.5, None]), {"k": {"n": True}})
    shown = display_call(args, kwargs, dumps(args), dumps(kwargs))
    assert shown == ([1, "x", [2.5, None]], {"k": {"n": True}})
    assert shown[0] is args and shown[1] is kwargs


@pytest.mark.parametrize(
    ("call", "expected"),
    [
        (((dt.date(2026, 1, 1),), {}), (["2026-01-01"], {})),
        (((), {"k": {1, 2}}), ([], {"k": [1, 2]})),
        # User data holding the tag key: escaped as a "dict" tag, shown as the user's dict.
        (((), {"k": {TAG: 1}}), ([], {"k": {TAG: 1}})),
    ],
    ids=["tag-in-args", "tag-in-kwargs", "escaped-dict"],
)
def test_display_call_given_texts_with_a_tag_walks_the_call(call, expected):
    args, kwargs = encode_call(*call)
    assert display_call(args, kwargs, dumps(args), dumps(kwargs)) == expected


def test_decimal_context_does_not_change_values():
    value = Decimal("3.14159265358979323846264338327950288419716939937510")
    with decimal.localcontext() as context:
        context.prec = 3
        assert_same(value, round_trip(value))


def test_display_shows_the_deepest_value_an_enqueue_writes_and_refuses_deeper():
    """The depth ``display`` accepts does not depend on the interpreter's recursion limit:
    whatever an enqueue writes is shown, anything deeper raises on every Python alike."""
    from django_tasks_plus.codec import MAX_DEPTH, MAX_STORED_DEPTH, DecodeError, display_call

    deepest: object = 1
    for _ in range(MAX_DEPTH):
        deepest = {"__dtp__": 1, "x": deepest}  # escaped dicts: the deepest stored shape
    args, kwargs = encode_call((deepest,), {})
    assert display_call(args, kwargs)[0][0]["x"]["__dtp__"] == 1
    too_deep: list[object] = []
    for _ in range(MAX_STORED_DEPTH):
        too_deep = [too_deep]
    with pytest.raises(DecodeError, match="nested more than"):
        display_call([too_deep], {})
