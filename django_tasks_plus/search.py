"""The admin task lists' search box: what an operator types, read into terms.

Terms are separated by spaces and all must match. Each is ``kind:rest`` or plain text:

- ``id:PREFIX`` or a plain id: a whole task id or its first 8+ hex digits (the short-id
  rules of ``selection.id_prefix``);
- ``task:TEXT`` or any other plain text: a substring of the task path;
- ``arg:VALUE``: a positional argument equal to the JSON ``VALUE``;
- ``kwarg:NAME=VALUE``: the keyword argument ``NAME`` equal to the JSON ``VALUE``;
- ``meta:KEY=VALUE``: the metadata key ``KEY`` equal to the JSON ``VALUE``;
- ``dedup:KEY``: the task's dedup key, exactly.

Values are JSON, so ``42`` is a number and ``"42"`` a string, never a guess; a double-quoted
part may hold spaces. Nothing here touches the database (``selection.with_search`` turns
terms into a query), and every refusal is a ``BadSearch`` saying what to write instead.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .selection import BadFilter, id_prefix

MAX_TERMS = 10  # each term is one more condition on a large table
MAX_DEPTH = 20  # a value's nesting: SQLite's JSON functions refuse deep ones
_INT64 = -(2**63)
_KIND = re.compile(r"^([A-Za-z_]+):(.*)$", re.DOTALL)
_NAME = re.compile(r"^[^=\s\"]+$")


class BadSearch(BadFilter):
    """A search the lists cannot apply; the message names the term and the fix."""


class Kind(StrEnum):
    ID = "id"
    TASK = "task"
    ARG = "arg"
    KWARG = "kwarg"
    META = "meta"
    DEDUP = "dedup"


SYNTAX = (
    "id:PREFIX, task:TEXT, arg:VALUE, kwarg:NAME=VALUE, meta:KEY=VALUE, dedup:KEY "
    '(VALUE is JSON: "text" in double quotes, 42, 1.5, true, false, null)'
)


@dataclass(frozen=True)
class Term:
    """One condition: ``key`` is the keyword argument's or metadata key's name (else
    None); ``value`` is the id prefix, the text, or the decoded JSON value."""

    kind: Kind
    value: Any
    key: str | None = None


def split_terms(text: str) -> list[str]:
    """``text`` cut at spaces outside double quotes and JSON brackets (quotes and
    backslash escapes are kept, for the JSON reader)."""
    terms: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    depth = 0
    for char in text:
        if quoted:
            current.append(char)
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                quoted = False
            continue
        if char.isspace() and depth <= 0:
            if current:
                terms.append("".join(current))
                current = []
            continue
        current.append(char)
        if char == '"':
            quoted = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
    if quoted:
        raise BadSearch(f"{text.strip()!r}: a double quote is not closed.")
    if current:
        terms.append("".join(current))
    return terms


def _storable(term: str, value: Any, depth: int = 0) -> Any:
    """``value`` if a stored argument could equal it: no NUL (neither database stores
    one in text) or lone surrogate, no number beyond 64 bits (SQLite's limit) or infinite
    (``1e400``), nested at most ``MAX_DEPTH`` deep."""
    if isinstance(value, str) and "\x00" in value:
        raise BadSearch("A search term holds a NUL character, which no stored task holds.")
    if isinstance(value, str) and not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate ("\ud800"), as codec.py refuses
            raise BadSearch(f"{term!a}: holds text that is not valid Unicode.") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise BadSearch(f"{term}: the number is too large.")
    if isinstance(value, int) and not isinstance(value, bool) and not _INT64 <= value < -_INT64:
        raise BadSearch(f"{term}: the number is beyond 64 bits, which the search cannot match.")
    if isinstance(value, dict | list) and depth >= MAX_DEPTH:
        raise BadSearch(f"{term}: the value is nested more than {MAX_DEPTH} deep.")
    if isinstance(value, dict):
        for key, item in value.items():
            _storable(term, key, depth + 1)
            _storable(term, item, depth + 1)
    if isinstance(value, list):
        for item in value:
            _storable(term, item, depth + 1)
    return value


def _json(term: str, text: str) -> Any:
    def refuse(constant: str) -> Any:
        raise ValueError(constant)

    try:
        value = json.loads(text, parse_constant=refuse)
    except RecursionError:
        raise BadSearch(f"{term}: the value is nested more than {MAX_DEPTH} deep.") from None
    except ValueError:
        if text[:1] in ('"', "[", "{"):
            raise BadSearch(
                f"{term}: {text!r} is not valid JSON; check its quotes, brackets and commas."
            ) from None
        raise BadSearch(
            f"{term}: {text!r} is not a JSON value; write text in double quotes "
            f'("{text.strip(chr(34))}"), or a number, true, false or null.'
        ) from None
    return _storable(term, value)


def _text(term: str, text: str, what: str) -> str:
    """A plain word, or a JSON string in double quotes (for spaces)."""
    value = _json(term, text) if text.startswith('"') else text
    if not isinstance(value, str) or not value:
        raise BadSearch(f"{term}: give the {what} after the colon.")
    return value


def _keyed(term: str, kind: Kind, rest: str, what: str) -> Term:
    name, equals, value = rest.partition("=")
    if not equals or not _NAME.match(name):
        raise BadSearch(
            f"{term}: write {kind}:{what.upper()}=VALUE, the {what} (no spaces or quotes), "
            '"=", then a JSON value, as in '
            + ("kwarg:user_id=42." if kind is Kind.KWARG else 'meta:tenant="acme".')
        )
    if not value:
        raise BadSearch(f"{term}: give a JSON value after '='.")
    return Term(kind, _json(term, value), key=name)


def parse_term(term: str) -> Term:
    """One term, as ``split_terms`` cut it."""
    _storable(term, term)
    try:
        return Term(Kind.ID, id_prefix(term))  # a plain id (its hyphens, urn:uuid: too)
    except BadFilter:
        pass
    found = _KIND.match(term)
    if found is None:
        return Term(Kind.TASK, _text(term, term, "task path text"))
    name, rest = found.group(1).lower(), found.group(2)
    if name not in Kind.__members__.values():
        raise BadSearch(f"{term}: {name}: is not a search term; use {SYNTAX}.")
    kind = Kind(name)
    if kind is Kind.ID:
        try:
            return Term(kind, id_prefix(rest))
        except BadFilter as exc:
            raise BadSearch(f"{term}: {exc}") from None
    if kind is Kind.TASK:
        return Term(kind, _text(term, rest, "task path text"))
    if kind is Kind.DEDUP:
        return Term(kind, _text(term, rest, "dedup key"))
    if kind is Kind.ARG:
        if not rest:
            raise BadSearch(f"{term}: give a JSON value after the colon, as in arg:42.")
        return Term(kind, _json(term, rest))
    return _keyed(term, kind, rest, "name" if kind is Kind.KWARG else "key")


def parse_search(text: str) -> tuple[Term, ...]:
    """Every term of the search box's ``text`` (none for blank text)."""
    terms = split_terms(text)
    if len(terms) > MAX_TERMS:
        raise BadSearch(f"{len(terms)} search terms: give at most {MAX_TERMS}.")
    return tuple(parse_term(term) for term in terms)
