"""Config dataclasses from JSON and ``key.path=value`` overrides: what ``kunlunlab train --config/--set``,
``kunlunlab eval --config/--set`` and the notebooks' parameters share (TRL-style: typed configs, nested
where a part of the system has its own config, e.g. ``EvalConfig.rollout`` or ``TrainConfig.sft``).

Every value is checked against its field's annotation when a config is built from a dict (:func:`build_dataclass`),
and against the range or choice set a field declares with :func:`positive`, :func:`non_negative`,
:func:`probability`, :func:`within`, :func:`positive_or` or :func:`choice`: a run then never starts with a
learning rate of ``"abc"`` or a batch of ``-4`` and fails minutes later, ``--dry-run`` refuses it first. A
refused value is one :class:`ConfigError` line naming the key, the value and what is expected."""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import types
import typing
from pathlib import Path
from typing import Any, Collection, Literal


class ConfigError(ValueError):
    """A config value of the wrong type, out of its range or not among its choices (one line: where, key,
    value, what is expected), an unknown key, or a check of the dataclass itself that failed."""


# ---------------------------------------------------------------------------- declared ranges and choices
@dataclasses.dataclass(frozen=True)
class Range:
    """The numbers a field accepts: ``low``/``high`` bounds (open or closed; None: unbounded) and ``also``,
    sentinel values outside them that mean something (``-1``: one pass over the data)."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    also: tuple = ()

    def __contains__(self, value) -> bool:
        if value in self.also:
            return True
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return not (self.high is not None and (value >= self.high if self.high_open else value > self.high))

    def describe(self) -> str:
        if self.low is not None and self.high is not None:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        else:
            text = f"{'<' if self.high_open else '<='} {self.high:g}"
        return " or ".join([text, *(repr(v) for v in self.also)])


def _declared(default, factory, **metadata):
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def within(default=None, low: float | None = None, high: float | None = None, *, low_open: bool = False,
           high_open: bool = False, also: tuple = (), factory=None):
    """A field whose numbers must lie in the given bounds (``None`` passes where the type allows it)."""
    return _declared(default, factory, range=Range(low, high, low_open, high_open, tuple(also)))


def positive(default=None):
    """A size, a count or a rate that must be > 0."""
    return within(default, 0, low_open=True)


def non_negative(default=None):
    """A count or a weight that may be 0 (off) but not below."""
    return within(default, 0)


def probability(default=None, *, high_open: bool = False):
    """A share or a probability: in [0, 1] (``high_open``: [0, 1))."""
    return within(default, 0, 1, high_open=high_open)


def positive_or(default, *sentinels):
    """A count that must be > 0 unless it is one of ``sentinels`` (e.g. ``-1``: one pass over the data)."""
    return within(default, 0, low_open=True, also=sentinels)


def choice(default=None, values: Collection = (), factory=None):
    """A string field (or each string of a list field) that must be one of ``values``: a registry or a tuple
    the module already keeps (``METHODS``, ``INDEX_KINDS``), read when a value is checked."""
    return _declared(default, factory, choices=values)


# ---------------------------------------------------------------------------- type checking
@functools.lru_cache(maxsize=None)
def field_types(cls) -> dict[str, Any]:
    """The resolved annotations of a config dataclass (modules use ``from __future__ import annotations``)."""
    return typing.get_type_hints(cls)


def _members(annotation) -> tuple:
    """The alternatives of a union (``int | None`` -> ``(int, NoneType)``), else the annotation alone."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def describe_type(annotation) -> str:
    """What a value of ``annotation`` looks like, in the words of a JSON file."""
    parts = []
    for member in _members(annotation):
        origin, args = typing.get_origin(member), typing.get_args(member)
        if member is type(None):
            parts.append("null")
        elif member is Any:
            parts.append("any value")
        elif origin is Literal:
            parts.append(repr(args[0]) if len(args) == 1 else "one of " + ", ".join(repr(a) for a in args))
        elif member is bool:
            parts.append("true or false")
        elif member is int:
            parts.append("an integer")
        elif member is float:
            parts.append("a number")
        elif member is str:
            parts.append("a string")
        elif origin in (list, tuple) or member in (list, tuple):
            inner = [a for a in args if a is not Ellipsis]
            parts.append("a list" + (f" of {describe_type(inner[0])}" if len(inner) == 1 else ""))
        elif origin is dict or member is dict:
            parts.append("an object")
        elif dataclasses.is_dataclass(member):
            parts.append(f"an object of {member.__name__} fields")
        else:
            parts.append(getattr(member, "__name__", str(member)))
    return " or ".join(parts)


class _Refused(Exception):
    """Internal: a value does not fit; :func:`check_value` turns it into one :class:`ConfigError` line."""

    def __init__(self, path: str, value, expected: str):
        super().__init__(path)
        self.path, self.value, self.expected = path, value, expected


def _coerce(annotation, value, path: str, where: str):
    """``value`` as ``annotation`` wants it (an int for a float field becomes a float, a JSON list a tuple
    for a tuple field, a dict the nested dataclass), or :class:`_Refused`."""
    if annotation is Any:
        return value
    for member in _members(annotation):
        try:
            return _coerce_one(member, value, path, where)
        except _Refused as err:
            if err.path != path:  # an item of a list or a field of a nested object is wrong: name that one
                raise
    raise _Refused(path, value, describe_type(annotation))


def _coerce_one(member, value, path: str, where: str):
    origin, args = typing.get_origin(member), typing.get_args(member)
    if member is type(None):
        if value is None:
            return None
    elif origin is Literal:
        if any(value == a and type(value) is type(a) for a in args):
            return value
    elif member is bool:
        if isinstance(value, bool):
            return value
    elif member is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif member is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise _Refused(path, value, "a finite number")
            return float(value)
    elif member is str:
        if isinstance(value, str):
            return value
    elif origin in (list, tuple) or member in (list, tuple):
        if isinstance(value, (list, tuple)):
            inner = [a for a in args if a is not Ellipsis]
            if len(inner) == 1 or (origin is tuple and Ellipsis in args):
                items = [_coerce(inner[0], v, f"{path}[{i}]", where) for i, v in enumerate(value)]
            else:
                items = list(value)
            return tuple(items) if (origin or member) is tuple else items
    elif origin is dict or member is dict:
        if isinstance(value, dict):
            if len(args) == 2:
                return {k: _coerce(args[1], v, f"{path}.{k}", where) for k, v in value.items()}
            return value
    elif dataclasses.is_dataclass(member):
        if isinstance(value, member):
            return value
        if isinstance(value, dict):
            return build_dataclass(member, value, where, _path=path)
    elif isinstance(member, type):
        if isinstance(value, member):
            return value
    else:
        return value  # an annotation this checker does not know (a Protocol, a TypeVar): left to the class
    raise _Refused(path, value, describe_type(member))


def _expected(annotation, rng: Range) -> str:
    """``"an integer > 0 or null"``: the type, its declared range, and null where it is allowed."""
    members = _members(annotation)
    typed = " or ".join(describe_type(m) for m in members if m is not type(None))
    return f"{typed} {rng.describe()}" + (" or null" if type(None) in members else "")


def _accepted(f: dataclasses.Field, annotation) -> str | None:
    """Everything a field with a declared range or choice set accepts (None: its type says it all)."""
    rng, choices = f.metadata.get("range"), f.metadata.get("choices")
    if rng is not None:
        return _expected(annotation, rng)
    if choices is not None:
        members = _members(annotation)
        if any(typing.get_origin(m) in (list, tuple) or m in (list, tuple) for m in members):
            return None  # a list field: the item that is not a choice is named instead
        return "one of " + ", ".join(repr(c) for c in choices) + (" or null" if type(None) in members else "")
    return None


def _check_declared(f: dataclasses.Field, annotation, value, path: str) -> None:
    """The range or choice set ``f`` declares, on the value or on each item of a list (``None`` and values of
    other types were the type check's business)."""
    rng, choices = f.metadata.get("range"), f.metadata.get("choices")
    items = list(enumerate(value)) if isinstance(value, (list, tuple)) else [(None, value)]
    for i, v in items:
        where = path if i is None else f"{path}[{i}]"
        if rng is not None and isinstance(v, (int, float)) and not isinstance(v, bool) and v not in rng:
            raise _Refused(where, v, _expected(annotation, rng) if i is None else f"a number {rng.describe()}")
        if choices is not None and isinstance(v, str) and v not in choices:
            raise _Refused(where, v, "one of " + ", ".join(repr(c) for c in choices))


def check_value(cls, name: str, value, where: str = "config", path: str | None = None):
    """``value`` for field ``name`` of ``cls``, typed (see :func:`build_dataclass`), or a :class:`ConfigError`."""
    f = {f.name: f for f in dataclasses.fields(cls)}[name]
    annotation = field_types(cls)[name]
    path = path or name
    try:
        typed = _coerce(annotation, value, path, where)
        _check_declared(f, annotation, typed, path)
    except _Refused as err:
        expected = err.expected
        if err.path == path:  # the field itself: say everything it accepts, in the value's own spelling
            expected, shown = _accepted(f, annotation) or expected, value
        else:
            shown = err.value
        raise ConfigError(f"{where}: {err.path}={shown!r}: expected {expected}") from None
    return typed


def build_dataclass(cls, data: dict, where: str = "config", _path: str = ""):
    """A config dataclass, nested ones included, from a plain dict, each value checked against its field's
    annotation and declared range or choices. An unknown key is an error naming where it is and what is known
    (a typo must not be silently ignored); a check in the class's own ``__post_init__`` that fails is the
    same one-line :class:`ConfigError`. ``where`` names the source (a file, ``"eval config"``)."""
    if not isinstance(data, dict):
        if _path:
            raise ConfigError(f"{where}: {_path}={data!r}: expected an object of {cls.__name__} fields")
        raise ConfigError(f"{where}: expected an object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = set(data) - set(fields)
    if unknown:
        raise ConfigError(f"{where}: unknown keys {sorted(unknown)}" + (f" in {_path}" if _path else "")
                          + f"; known: {sorted(fields)}")
    missing = [name for name, f in fields.items() if name not in data and f.default is dataclasses.MISSING
               and f.default_factory is dataclasses.MISSING]
    if missing:
        raise ConfigError(f"{where}: missing keys {missing}" + (f" in {_path}" if _path else ""))
    kwargs = {name: check_value(cls, name, value, where, f"{_path}.{name}" if _path else name)
              for name, value in data.items()}
    try:
        return cls(**kwargs)
    except ValueError as err:  # the class's own cross-field checks: one line, with the section they are in
        if isinstance(err, ConfigError):
            raise
        raise ConfigError(f"{where}: " + (f"{_path}: " if _path else "") + " ".join(str(err).split())) from err


def read_config_file(path: str | Path, what: str = "config") -> dict:
    """A JSON config file as a dict (its ``_comment`` dropped); a missing or malformed file is a clear error."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: invalid JSON: {err}") from err
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object of {what} fields, got {type(data).__name__}")
    data.pop("_comment", None)
    return data


def parse_value(text: str) -> Any:
    """A ``--set`` value: JSON when it parses (numbers, booleans, lists, null), else the string itself; the
    field's type then decides whether it fits (``1`` is no boolean, ``"abc"`` no learning rate)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(data: dict, overrides: dict | list[str] | None) -> dict:
    """``{"sft.learning_rate": 1e-4}`` or ``["sft.learning_rate=1e-4"]`` onto a nested config dict (in place)."""
    if not overrides:
        return data
    if isinstance(overrides, list):
        pairs = {}
        for item in overrides:
            if "=" not in item:
                raise ConfigError(f"override {item!r} must look like key.path=value")
            key, value = item.split("=", 1)
            pairs[key] = parse_value(value)
        overrides = pairs
    for key, value in overrides.items():
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ConfigError(f"override {key!r}: {p!r} is a value, not a section")
        node[parts[-1]] = value
    return data


def leaf_paths(values: dict, prefix: str = "") -> set[str]:
    """The dotted paths of a nested dict's values (``{"rollout": {"top_k": 1}}`` → ``{"rollout.top_k"}``)."""
    return set(leaf_values(values, prefix))


def leaf_values(values: dict, prefix: str = "") -> dict[str, Any]:
    """A nested dict's values by dotted path (``{"rollout": {"top_k": 1}}`` → ``{"rollout.top_k": 1}``)."""
    out = {}
    for key, value in values.items():
        path = prefix + key
        if isinstance(value, dict) and value:
            out.update(leaf_values(value, path + "."))
        else:
            out[path] = value
    return out


def config_classes(*roots) -> list[type]:
    """Every config dataclass reachable from ``roots`` through their fields' annotations, roots first (what
    the config-typing test walks, so a new nested config is checked without being listed)."""
    found: list[type] = []

    def visit(cls) -> None:
        if cls in found:
            return
        found.append(cls)
        for annotation in field_types(cls).values():
            for member in _members(annotation):
                for part in (member, *typing.get_args(member)):
                    if dataclasses.is_dataclass(part) and isinstance(part, type):
                        visit(part)

    for root in roots:
        visit(root)
    return found
