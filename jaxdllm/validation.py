"""Checks shared by every config dataclass: field types (from the annotations) and positive ints.

Values come from Python, TOML recipes and `--set KEY=VALUE` on the command line, so a wrong type
(`steps = "1000"`, `threshold=abc`) must be an error naming the setting, not a `TypeError` deep
in a comparison. `check_fields` reads each dataclass field's annotation and raises `ConfigError`
for a value of the wrong type. It also normalises what is unambiguous: an int where a float is
expected becomes a float, a list where a tuple is expected becomes a tuple, and a single string
where a tuple of strings is expected becomes a one-element tuple.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from typing import Any, Literal, Union

from jaxdllm.errors import ConfigError


def require_positive_int(value, name: str, error: type[Exception] = ConfigError) -> None:
    """Raise `error` naming `name` unless `value` is an int > 0 (bools are not ints here)."""
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise error(f"{name} must be a positive integer, got {value!r}")


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    try:
        hints = typing.get_type_hints(cls)
    except Exception:  # annotations naming local types (a class defined in a function): not checked
        return {}
    return {f.name: hints[f.name] for f in dataclasses.fields(cls) if f.init or f.name in hints}


_NO_MATCH = object()


def _conform(value: Any, tp: Any) -> Any:
    """`value` as type `tp` (normalised as the module docstring says), or `_NO_MATCH`."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value
    if origin in (Union, types.UnionType):
        for arg in args:
            out = _conform(value, arg)
            if out is not _NO_MATCH:
                return out
        return _NO_MATCH
    if origin is Literal:
        return value if isinstance(value, str | int) and not isinstance(value, bool) and value in args \
            else _NO_MATCH
    if tp is type(None):
        return value if value is None else _NO_MATCH
    if tp is bool:
        return value if isinstance(value, bool) else _NO_MATCH
    if tp is int:
        return value if isinstance(value, int) and not isinstance(value, bool) else _NO_MATCH
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return _NO_MATCH
        return float(value)
    if origin is tuple:
        if isinstance(value, str) and args and args[0] is str:
            value = (value,)
        if not isinstance(value, tuple | list):
            return _NO_MATCH
        if len(args) == 2 and args[1] is Ellipsis:
            items = [_conform(v, args[0]) for v in value]
        elif args:  # fixed length: tuple[float, float, float]
            if len(value) != len(args):
                return _NO_MATCH
            items = [_conform(v, a) for v, a in zip(value, args)]
        else:
            items = list(value)
        return _NO_MATCH if any(v is _NO_MATCH for v in items) else tuple(items)
    if origin is dict or tp is dict:
        return value if isinstance(value, dict) else _NO_MATCH
    if isinstance(tp, type):
        return value if isinstance(value, tp) else _NO_MATCH
    return value  # an annotation we do not model: accept


def describe(tp: Any) -> str:
    """Words for a type annotation, for error messages (`int | None` -> "an integer or none")."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a list of {describe(args[0]).removeprefix('a ').removeprefix('an ')}s"
        return f"a list of {len(args)} ({', '.join(describe(a) for a in args)})" if args else "a list"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string",
            type(None): "none (omitted)", dict: "a table"}.get(tp, getattr(tp, "__name__", str(tp)))


def check_fields(obj: Any, where: str = "") -> None:
    """Raise `ConfigError` for the first dataclass field of `obj` whose value has the wrong type.

    `where` prefixes the setting's name in the message (e.g. "[train] " gives
    "[train] steps must be an integer, got '1000'"). Normalised values are written back
    (frozen dataclasses included).
    """
    for name, tp in _field_types(type(obj)).items():
        value = getattr(obj, name)
        out = _conform(value, tp)
        if out is _NO_MATCH:
            raise ConfigError(f"{where}{name} must be {describe(tp)}, got {value!r}")
        if out is not value:
            object.__setattr__(obj, name, out)


def check_overrides(cls: type, values: dict, where: str, exclude: tuple[str, ...] = ()) -> None:
    """Raise `ConfigError` unless every key of `values` is a field of dataclass `cls` (not in
    `exclude`) holding a value of that field's type; `where` names the section in the message."""
    types_ = {k: v for k, v in _field_types(cls).items() if k not in exclude}
    unknown = sorted(set(values) - set(types_))
    if unknown:
        raise ConfigError(f"{where} has unknown key(s) {unknown}; known: {sorted(types_)}")
    for name, value in values.items():
        if _conform(value, types_[name]) is _NO_MATCH:
            raise ConfigError(f"{where} {name} must be {describe(types_[name])}, got {value!r}")
