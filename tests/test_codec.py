"""Argument and return-value encoding: JSON that every database stores the same way."""

from __future__ import annotations

import datetime as dt
import decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from django_tasks_plus.codec import EncodeError, dumps, encode_call, loads, to_json

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text().filter(lambda s: "\x00" not in s),
    lambda children: (
        st.lists(children, max_size=5)
        | st.dictionaries(
            st.text(max_size=5).filter(lambda s: "\x00" not in s), children, max_size=5
        )
    ),
    max_leaves=20,
)


@given(json_values)
def test_json_values_round_trip(value):
    assert loads(dumps(to_json(value, "x"))) == value


def test_tuples_become_lists():
    assert encode_call((1, (2, 3)), {"k": (4,)}) == ([1, [2, 3]], {"k": [4]})


@pytest.mark.parametrize(
    ("value", "path", "problem"),
    [
        (dt.date(2020, 1, 1), "x", "is a datetime.date"),
        (decimal.Decimal("1.5"), "x", "is a decimal.Decimal"),
        ({"a": [1, {2}]}, "x['a'][1]", "is a builtins.set"),
        ({1: 2}, "x", "has the key 1 (int)"),
        (float("inf"), "x", "only finite numbers"),
        ("nul\x00", "x", "NUL character"),
        (b"bytes", "x", "is a builtins.bytes"),
    ],
)
def test_unstorable_values_name_their_path(value, path, problem):
    with pytest.raises(EncodeError) as info:
        to_json(value, "x")
    assert info.value.path == path
    assert problem in str(info.value)


def test_loads_none():
    assert loads(None) is None
