"""Binding a task call to its payload, and the payload back to a call.

A task with a schema stores its call as a *payload*: the arguments by parameter name,
defaults filled in, ``**kwargs`` merged in and the ``context`` parameter left out. This
module owns that mapping (and refuses, at definition time, functions whose calls cannot be
named); ``schema.py`` owns checking the payload's values.
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping, Sequence
from functools import lru_cache
from typing import Any

from .exceptions import InvalidTaskArguments, InvalidTaskOptions


def _error(where: str, field_path: tuple[Any, ...], text: str) -> InvalidTaskArguments:
    return InvalidTaskArguments(f"{where}(): {text}", field_path=field_path)


@dataclasses.dataclass(frozen=True)
class _Shape:
    """What a schema needs to know about a task function's parameters."""

    path: str
    signature: inspect.Signature | None
    context: str | None  # name of the context parameter of a takes_context task
    named: tuple[str, ...]
    required: tuple[str, ...]
    var_keyword: str | None
    problem: str | None  # why this function cannot take a schema, if it cannot


def _func_path(func: Callable[..., Any]) -> str:
    qualname = getattr(func, "__qualname__", None) or repr(func)
    return f"{getattr(func, '__module__', '?')}.{qualname}"


@lru_cache(maxsize=1024)
def _shape(func: Callable[..., Any], takes_context: bool) -> _Shape:
    path = _func_path(func)
    try:
        signature = inspect.signature(func)
    except (TypeError, ValueError) as exc:
        return _Shape(path, None, None, (), (), None, f"its signature cannot be read: {exc}")
    params = list(signature.parameters.values())
    context = None
    if takes_context:
        if not params or params[0].kind not in (
            inspect.Parameter.POSITIONAL_ONLY,
            inspect.Parameter.POSITIONAL_OR_KEYWORD,
        ):
            needs = "takes_context=True needs a first positional parameter for the context."
            return _Shape(path, signature, None, (), (), None, needs)
        context = params.pop(0).name
    problem = None
    named: list[str] = []
    required: list[str] = []
    var_keyword = None
    for param in params:
        if param.kind is inspect.Parameter.POSITIONAL_ONLY:
            problem = (
                f"a task with a schema cannot have positional-only parameters ({param.name!r}): "
                "the payload names every argument."
            )
            break
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            problem = (
                f"a task with a schema cannot take *{param.name}: the payload names every "
                "argument, so use a list parameter instead."
            )
            break
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            var_keyword = param.name
            continue
        named.append(param.name)
        if param.default is inspect.Parameter.empty:
            required.append(param.name)
    return _Shape(path, signature, context, tuple(named), tuple(required), var_keyword, problem)


def check_schema_signature(func: Callable[..., Any], *, takes_context: bool, where: str) -> None:
    """Refuse, at definition time, functions whose calls cannot be named as a payload
    (``*args``, positional-only parameters)."""
    problem = _shape(func, takes_context).problem
    if problem:
        raise InvalidTaskOptions(f"{where}: {problem}")


def bind_payload(
    func: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    *,
    takes_context: bool,
) -> dict[str, Any]:
    """The payload of a call: parameter name -> value, defaults applied, ``**kwargs``
    merged in, the context parameter left out. Raises ``InvalidTaskArguments`` if the call
    does not fit the signature."""
    shape = _shape(func, takes_context)
    if shape.problem or shape.signature is None:
        raise InvalidTaskOptions(f"{shape.path}: {shape.problem}")
    leading = (None,) if takes_context else ()
    try:
        bound = shape.signature.bind(*leading, *args, **kwargs)
    except TypeError as exc:
        raise InvalidTaskArguments(
            f"{shape.path}() cannot be called with these arguments: {exc}"
        ) from exc
    bound.apply_defaults()
    payload: dict[str, Any] = {}
    for name, value in bound.arguments.items():
        if name == shape.context:
            continue
        if name == shape.var_keyword:
            payload.update(value)
        else:
            payload[name] = value
    return payload


def payload_to_call(
    func: Callable[..., Any], payload: dict[str, Any], *, takes_context: bool
) -> dict[str, Any]:
    """The keyword arguments to call ``func`` with (the context, if any, is passed first by
    the caller). Keys that fit no parameter are refused unless ``func`` takes ``**kwargs``."""
    shape = _shape(func, takes_context)
    if shape.problem:
        raise InvalidTaskOptions(f"{shape.path}: {shape.problem}")
    call: dict[str, Any] = {}
    for key, value in payload.items():
        if key in shape.named or (shape.var_keyword is not None and key != shape.context):
            call[key] = value
        else:
            raise _error(shape.path, (key,), f"payload has unknown field {key!r}")
    for name in shape.required:
        if name not in call:
            raise _error(shape.path, (name,), f"payload is missing required field {name!r}")
    return call


__all__ = ["bind_payload", "check_schema_signature", "payload_to_call"]
