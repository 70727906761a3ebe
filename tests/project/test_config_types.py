"""Typed configs at load: every field of every config dataclass reachable from the top-level configs
(TrainConfig, EvalConfig, SuiteConfig) and every notebook parameter refuses a value of the wrong type in one
line naming its key, and every declared range refuses the values just outside it. The cases are generated from
the dataclass fields and the notebooks' parameters cells, not listed here: a new field or parameter is checked
as soon as it exists. The wrong values are chosen from the annotation by this file, not by the checker."""
from __future__ import annotations

import dataclasses
import json
import types
import typing
from typing import Literal

import pytest

from kunlunlab import runner
from kunlunlab.configs import ConfigError, build_dataclass, config_classes, field_types
from kunlunlab.eval.harness import EvalConfig
from kunlunlab.studies.suite import SuiteConfig
from kunlunlab.training.config import TrainConfig

ROOTS = (TrainConfig, EvalConfig, SuiteConfig)


def _members(annotation) -> tuple:
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return typing.get_args(annotation)
    return (annotation,)


def _accepts(annotation) -> set[str]:
    """The JSON kinds an annotation takes, as this test reads it."""
    kinds = set()
    for m in _members(annotation):
        origin = typing.get_origin(m)
        if m is bool:
            kinds.add("bool")
        elif m is int:
            kinds.add("int")
        elif m is float:
            kinds |= {"int", "float"}
        elif m is str or origin is Literal:
            kinds.add("str")
        elif m is type(None):
            kinds.add("null")
        elif origin in (list, tuple) or m in (list, tuple):
            kinds.add("list")
        elif origin is dict or m is dict or dataclasses.is_dataclass(m):
            kinds.add("object")
        else:
            kinds.add("other")
    return kinds


def wrong_value(annotation):
    """A JSON value of a kind the annotation does not take."""
    kinds = _accepts(annotation)
    for value, kind in (("abc", "str"), (1.5, "float"), ({"nested": 1}, "object"), (True, "bool")):
        if kind not in kinds:
            return value
    raise AssertionError(f"no wrong value for {annotation}")


def _paths(root) -> list[tuple[str, type, dataclasses.Field]]:
    """(dotted path from ``root``, the dataclass, the field) of every field under ``root``."""
    found = []

    def walk(cls, prefix: str) -> None:
        for f in dataclasses.fields(cls):
            found.append((prefix + f.name, cls, f))
            for m in _members(field_types(cls)[f.name]):
                if dataclasses.is_dataclass(m):
                    walk(m, prefix + f.name + ".")

    walk(root, "")
    return found


def _nested(path: str, value) -> dict:
    data: dict = {}
    node = data
    *sections, leaf = path.split(".")
    for s in sections:
        node = node.setdefault(s, {})
    node[leaf] = value
    return data


def _refused(root, path: str, value, where: str = "test") -> str:
    with pytest.raises(ConfigError) as refused:
        build_dataclass(root, _nested(path, value), where)
    message = str(refused.value)
    assert "\n" not in message and "expected" in message, message
    assert f"{where}: {path}=" in message or f"{where}: {path}[" in message, message  # the key, or its item
    return message


CASES = [(root, path, cls, f) for root in ROOTS for path, cls, f in _paths(root)]
IDS = [f"{root.__name__}.{path}" for root, path, _, _ in CASES]


def test_the_walk_reaches_every_nested_config():
    reached = {cls for _, _, cls, _ in CASES}
    assert set(config_classes(*ROOTS)) == reached
    assert len(reached) >= 18 and len(CASES) >= 250  # TrainConfig alone nests 15 configs


@pytest.mark.parametrize("root, path, cls, f", CASES, ids=IDS)
def test_a_wrongly_typed_value_is_refused_in_one_line_naming_its_key(root, path, cls, f):
    annotation = field_types(cls)[f.name]
    _refused(root, path, wrong_value(annotation))
    kinds = _accepts(annotation)
    if kinds & {"bool"} and not kinds & {"int", "str"}:  # 1 and "true" are no booleans
        _refused(root, path, 1)
        _refused(root, path, "true")
    if "int" in kinds and "float" not in kinds:
        _refused(root, path, 2.5)
        if "bool" not in kinds:
            _refused(root, path, True)


def _outside(rng, integer: bool) -> list:
    step = 1 if integer else 0.5
    values = []
    if rng.low is not None:
        values.append(rng.low if rng.low_open else rng.low - step)
    if rng.high is not None:
        values.append(rng.high if rng.high_open else rng.high + step)
    return [int(v) if integer else float(v) for v in values if v not in rng.also]


RANGED = [case for case in CASES if "range" in case[3].metadata]
CHOICES = [case for case in CASES if "choices" in case[3].metadata]


@pytest.mark.parametrize("root, path, cls, f", RANGED, ids=[f"{r.__name__}.{p}" for r, p, _, _ in RANGED])
def test_a_declared_range_refuses_the_values_just_outside_it(root, path, cls, f):
    rng = f.metadata["range"]
    integer = "float" not in _accepts(field_types(cls)[f.name])
    for value in _outside(rng, integer):
        message = _refused(root, path, value)
        assert rng.describe() in message
    for value in rng.also:  # a sentinel (-1: one pass) is accepted
        build_dataclass(root, _nested(path, value), "test")


@pytest.mark.parametrize("root, path, cls, f", CHOICES, ids=[f"{r.__name__}.{p}" for r, p, _, _ in CHOICES])
def test_a_declared_choice_set_refuses_an_unknown_name(root, path, cls, f):
    is_list = "list" in _accepts(field_types(cls)[f.name])
    message = _refused(root, path, ["no_such_choice"] if is_list else "no_such_choice")
    assert "'no_such_choice'" in message and "one of" in message


def test_every_numeric_field_declares_its_range():
    """Sizes > 0, counts and weights >= 0, shares and probabilities in [0, 1], learning rates > 0: a new
    numeric field says which, next to its default (kunlunlab.configs.positive, non_negative, probability...)."""
    missing = sorted({f"{cls.__name__}.{f.name}" for _, _, cls, f in CASES
                      if _accepts(field_types(cls)[f.name]) & {"int", "float"} and "range" not in f.metadata})
    assert missing == []


@pytest.mark.parametrize("root", ROOTS)
def test_the_defaults_and_their_json_load_back_unchanged(root):
    """What a run writes (train_config.json, suite_summary.json's config) loads as the same config."""
    default = root()
    assert build_dataclass(root, json.loads(json.dumps(dataclasses.asdict(default))), "test") == default
    for path, cls, f in _paths(root):  # every default lies inside its own field's range and choices
        if f.default is not dataclasses.MISSING:
            build_dataclass(cls, {f.name: f.default}, "test")


def test_set_values_are_typed_as_the_field_wants():
    from kunlunlab.training.config import load_config

    cfg = load_config(None, ["sft.learning_rate=1", "report_to=tensorboard", "bf16=auto", "sft.max_steps=-1",
                             "model=null", "mixing.noise_kinds=[\"distractor\"]"])
    assert cfg.sft.learning_rate == 1.0 and isinstance(cfg.sft.learning_rate, float)  # an int for a float
    assert cfg.report_to == ["tensorboard"] and cfg.bf16 == "auto" and cfg.sft.max_steps == -1
    assert cfg.model is None and cfg.mixing.noise_kinds == ("distractor",)  # a JSON list for a tuple field
    for item, message in (("dapo.learning_rate=abc", "dapo.learning_rate='abc': expected a number > 0"),
                          ("sft.batch_size=-4", "sft.batch_size=-4: expected an integer > 0"),
                          ("hotpot=1", "hotpot=1: expected true or false"),
                          ("dapo.learning_rate=NaN", "dapo.learning_rate=nan: expected a number > 0"),
                          ("agent.method=magic", "agent.method='magic': expected one of 'kunlun', 'agent'"),
                          ("mixing.noise_kinds=[\"x\"]", "mixing.noise_kinds[0]='x': expected one of"),
                          ("sft.micro_batch_size=3", "sft: sft.micro_batch_size=3 must be a positive divisor")):
        with pytest.raises(ConfigError) as refused:
            load_config(None, [item])
        assert message in str(refused.value) and "\n" not in str(refused.value)


# ---------------------------------------------------------------------------- the notebooks' parameters
NOTEBOOKS = runner.notebooks()
PARAMS = [(path, name, annotation) for path in NOTEBOOKS
          for name, (annotation, _) in runner.parameter_cell(path).items() if annotation is not typing.Any]


def test_every_notebook_has_typed_parameters():
    assert len(NOTEBOOKS) == 8
    assert {path.stem for path, _, _ in PARAMS} == {p.stem for p in NOTEBOOKS}
    cell = runner.parameter_cell(next(p for p in NOTEBOOKS if p.stem.startswith("05")))
    assert cell["rounds"] == (int, 5)  # papermill's own parser drops this line (its comment holds "=")


@pytest.mark.parametrize("path, name, annotation", PARAMS, ids=[f"{p.stem}.{n}" for p, n, _ in PARAMS])
def test_a_notebook_parameter_of_the_wrong_type_is_refused_before_the_run(path, name, annotation):
    with pytest.raises(ConfigError) as refused:
        runner.check_params([path], {path.stem: {name: wrong_value(annotation)}})
    message = str(refused.value)
    assert message.startswith(f"notebook {path.stem}: {name}=") and "expected" in message and "\n" not in message


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_a_notebook_refuses_an_unknown_parameter_and_takes_its_own_defaults(path):
    with pytest.raises(ConfigError, match=rf"notebook {path.stem}: unknown keys \['no_such_parameter'\]"):
        runner.check_params([path], {path.stem: {"no_such_parameter": 1}})
    defaults = {name: default for name, (_, default) in runner.parameter_cell(path).items()}
    runner.check_params([path], {path.stem: defaults})
