"""Config dataclasses from JSON and ``key.path=value`` overrides: what ``kunlunlab train --config/--set``,
``kunlunlab eval --config/--set`` and the notebooks' parameters share (TRL-style: typed configs, nested
where a part of the system has its own config, e.g. ``EvalConfig.rollout`` or ``TrainConfig.sft``)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any


def build_dataclass(cls, data: dict, where: str = "config"):
    """A config dataclass, nested ones included, from a plain dict; an unknown key is an error naming where it
    is and what is known (a typo must not be silently ignored)."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(fields)}")
    kwargs = {}
    for name, value in data.items():
        f = fields[name]
        sub = f.default_factory if f.default_factory is not dataclasses.MISSING else None
        if sub is not None and dataclasses.is_dataclass(sub) and not dataclasses.is_dataclass(value):
            kwargs[name] = build_dataclass(sub, value, f"{where}.{name}")
        elif isinstance(value, list) and isinstance(f.default, tuple):  # JSON has no tuples
            kwargs[name] = tuple(value)
        else:
            kwargs[name] = value
    return cls(**kwargs)


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
    """A ``--set`` value: JSON when it parses (numbers, booleans, lists, null), else the string itself."""
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
                raise ValueError(f"override {item!r} must look like key.path=value")
            key, value = item.split("=", 1)
            pairs[key] = parse_value(value)
        overrides = pairs
    for key, value in overrides.items():
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise ValueError(f"override {key!r}: {p!r} is a value, not a section")
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
