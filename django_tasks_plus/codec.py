"""Turns task arguments and return values into JSON that every supported database stores.

The rule is strict on purpose: a value that would not come back unchanged is refused at
enqueue time, with the path of the offending value, instead of failing in a worker later.
Tuples become lists (as Django's own ``TaskResult`` shows them). NaN/Infinity and NUL
characters are refused because PostgreSQL's ``jsonb`` cannot hold them, and a queue
should behave the same on every database.
"""

from __future__ import annotations

import json
import math
from typing import Any

JsonValue = None | bool | int | float | str | list["JsonValue"] | dict[str, "JsonValue"]


class EncodeError(TypeError):
    """A value that cannot be stored; ``path`` says where it sits (``args[0]['when']``)."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path = path
        self.problem = problem


def to_json(value: Any, path: str) -> JsonValue:
    """Return ``value`` as plain JSON types, or raise ``EncodeError`` naming ``path``."""
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, str):
        if "\x00" in value:
            raise EncodeError(path, "contains a NUL character, which databases cannot store.")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise EncodeError(path, f"is {value!r}; only finite numbers can be stored.")
        return value
    if isinstance(value, list | tuple):
        return [to_json(item, f"{path}[{index}]") for index, item in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, JsonValue] = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise EncodeError(
                    path,
                    f"has the key {key!r} ({type(key).__name__}); only str keys can be stored.",
                )
            out[to_json(key, f"{path} key")] = to_json(item, f"{path}[{key!r}]")  # type: ignore[index]
        return out
    raise EncodeError(
        path,
        f"is a {type(value).__module__}.{type(value).__qualname__}, which is not JSON-serializable "
        "(use str, int, float, bool, None, list, tuple or dict).",
    )


def encode_call(args: Any, kwargs: Any) -> tuple[list[JsonValue], dict[str, JsonValue]]:
    """Validate and convert a call's positional and keyword arguments."""
    encoded_args = to_json(list(args), "args")
    encoded_kwargs = to_json(dict(kwargs), "kwargs")
    return encoded_args, encoded_kwargs  # type: ignore[return-value]


def dumps(value: JsonValue) -> str:
    """Compact JSON text of an already-converted value."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def loads(text: str | bytes | None) -> Any:
    """Parse stored JSON text; ``None`` stays ``None``."""
    return None if text is None else json.loads(text)
