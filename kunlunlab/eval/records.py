"""Evaluation records on disk and resuming: what :func:`kunlunlab.eval.harness.evaluate` writes and reads back.

Each finished question's record is one JSON line of ``out``, flushed as it is written and synced after each batch
(:class:`RecordWriter`), so a fault or Ctrl-C loses only the batch in flight. What the records measure is kept
beside them in ``<out>.config.json`` (:func:`evaluation_identity`: the config less how and where it runs, i.e.
batch size, device and the services' URLs, and the searched service's index). A rerun keeps the complete records
(:func:`kept_records`) only when that identity and the questions match, else :class:`RecordsConflict`; a last
line cut short by a crash is dropped and redone (:func:`read_records`). :func:`records_of_same_evaluation` takes a
finished file's records for a subset of its questions (notebook 08 reuses notebook 06's prompt baselines).

A module of its own because the harness and the training pipeline
(:func:`kunlunlab.training.evaluation.evaluate_baselines`) both write and resume records, and neither needs the
other's wiring to do it.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from kunlunlab.agent.methods import METHODS, TURN_LOOP_FIELDS
from kunlunlab.configs import leaf_values
from kunlunlab.data.types import QAExample

if TYPE_CHECKING:  # the harness imports this module: the config's type is named for readers only
    from kunlunlab.eval.harness import EvalConfig

RECORDS_CONFIG_SUFFIX = ".config.json"
# EvalConfig fields that say how fast and where an evaluation runs, not what it measures: a rerun may change them
# (a smaller batch after running out of memory, another GPU)
RUNTIME_FIELDS = ("batch_size", "device", "judge_key_env")
# services that a restart may bring back elsewhere (another port, another node): only whether each is used counts
ENDPOINT_FIELDS = ("llm_url", "judge_url", "retriever_url", "network_url")


class RecordsConflict(ValueError):
    """``out`` holds records that this evaluation cannot continue: another configuration, other questions, a
    damaged line, or no saved configuration to compare with. Appending there would mix two evaluations."""


def records_config_path(out: str | Path) -> Path:
    """The sidecar beside a records file that says what its records measure (:func:`evaluation_identity`)."""
    return Path(str(out) + RECORDS_CONFIG_SUFFIX)


def evaluation_identity(config: EvalConfig, retriever=None) -> dict:
    """What an evaluation measures, as JSON: ``config`` less :data:`RUNTIME_FIELDS`, each of
    :data:`ENDPOINT_FIELDS` as whether it is used, and with a retrieval service (``retriever``, a
    :class:`~kunlunlab.eval.harness.ServiceSearch`, whose ``service_index`` is what the service reports on
    ``/health``: kind, passages, embedder) that index in place of its URL."""
    identity = json.loads(json.dumps(asdict(config), default=str))
    for name in RUNTIME_FIELDS:
        identity.pop(name)
    for name in ENDPOINT_FIELDS:
        identity[name] = identity[name] is not None
    index = getattr(retriever, "service_index", None)  # a local index has none: its config says what it is
    if index is not None:
        identity["retriever_index"] = index
    return identity


def read_records(path: str | Path) -> tuple[list[dict], int]:
    """(the complete records of a records file, the bytes they take). A record is complete when its line ends
    in a newline and holds a JSON object with an ``id``; a last line that does not is a write cut short and is
    left out, to be redone. A damaged line before the last is no crash's doing: :class:`RecordsConflict`."""
    path = Path(path)
    if not path.is_file():
        return [], 0
    with path.open("rb") as f:
        lines = f.readlines()
    records, size = [], 0
    for i, line in enumerate(lines):
        try:
            record = json.loads(line) if line.endswith(b"\n") else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            record = None  # judged below: a torn last line, or a damaged one
        if not isinstance(record, dict) or "id" not in record:
            if i == len(lines) - 1:
                break
            raise RecordsConflict(f"{path}: line {i + 1} of {len(lines)} is not a record (damaged, not a write cut "
                                  f"short); pass another --out, or delete {path} to start over")
        records.append(record)
        size += len(line)
    return records, size


def _differences(saved: dict, wanted: dict, shown: int = 4) -> str:
    """The dotted paths where two identities differ, the first ``shown`` with both values."""
    have, want = leaf_values(saved), leaf_values(wanted)
    changed = sorted(k for k in set(have) | set(want) if have.get(k, "(absent)") != want.get(k, "(absent)"))
    parts = [f"{k}: {have.get(k, '(absent)')!r} there, {want.get(k, '(absent)')!r} now" for k in changed[:shown]]
    return "; ".join(parts) + (f"; and {len(changed) - shown} more" if len(changed) > shown else "")


def _records(n: int) -> str:
    return f"{n} record" + ("s" if n != 1 else "")


def saved_identity(out: str | Path) -> dict | None:
    """The evaluation identity the sidecar of records file ``out`` saved (``{}`` when it holds none); None when there
    is no sidecar. An unreadable one raises :class:`RecordsConflict`."""
    sidecar = records_config_path(out)
    if not sidecar.is_file():
        return None
    try:
        saved = json.loads(sidecar.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise RecordsConflict(f"{sidecar} is not readable JSON ({err})") from err
    identity = saved.get("identity") if isinstance(saved, dict) else None
    return identity if isinstance(identity, dict) else {}


def kept_records(config: EvalConfig, out: str | Path, examples: list[QAExample],
                 retriever=None) -> tuple[list[dict], int]:
    """(the records of ``out`` that a rerun of ``config`` over ``examples`` keeps, the bytes they take): the
    complete ones, once their sidecar shows they measure what ``config`` does and their ids are ``examples``'
    first. Anything else raises :class:`RecordsConflict`; nothing is written. ``kunlunlab eval`` calls it before
    any model loads, so a refusal costs no loading."""
    records, size = read_records(out)
    if not records:
        return [], 0
    hint = f"pass another --out, or delete {out} to start over"
    try:
        saved = saved_identity(out)
    except RecordsConflict as err:
        raise RecordsConflict(f"{err}; {hint}") from err
    if saved is None:
        raise RecordsConflict(f"{out} holds {_records(len(records))} but no {records_config_path(out).name} saying what "
                              f"they measure (an older version's or a non-resumable run's file); {hint}")
    wanted = evaluation_identity(config, retriever)
    if saved != wanted:
        raise RecordsConflict(f"{out} holds {_records(len(records))} of another evaluation config "
                              f"({_differences(saved, wanted)}); {hint}")
    ids = [r["id"] for r in records]
    expected = [ex.id for ex in examples[:len(records)]]
    if ids != expected:
        i = next((i for i, (a, b) in enumerate(zip(ids, expected)) if a != b), len(expected))
        this = f"this run's is {expected[i]!r}" if i < len(expected) else f"this run has {len(examples)} questions"
        raise RecordsConflict(f"{out} holds records of other questions (record {i + 1} is {ids[i]!r}, {this}); {hint}")
    return records, size


def _measured(identity: dict) -> dict:
    """What of an evaluation identity a record depends on beyond its question: all but ``limit``, and for a method
    without a turn loop (``Method.turn_loop``: the prompt baselines but Search-o1) all but the rollout's
    :data:`~kunlunlab.agent.methods.TURN_LOOP_FIELDS`, which it never reads."""
    measured = {**identity, "limit": None}
    method = METHODS.get(identity.get("method"))
    if method is not None and not method.turn_loop and isinstance(measured.get("rollout"), dict):
        measured["rollout"] = {k: v for k, v in measured["rollout"].items() if k not in TURN_LOOP_FIELDS}
    return measured


def records_of_same_evaluation(config: EvalConfig, source: str | Path, examples: list[QAExample]) -> list[dict] | None:
    """``examples``' records taken from ``source``, a finished records file of the same evaluation over more or other
    questions (greedy answers: a question's record depends on it and the configuration, the batch it shared
    aside), in ``examples``' order; None when its sidecar shows another configuration (anything but ``limit``
    differing, or for a method without a turn loop the budgets it does not read: :func:`_measured`) or a question
    is missing or differs. Notebook 08 reuses notebook 06's prompt baselines this way (its 256-token budget is
    not 06's 1,024: the four without a turn loop are reused, Search-o1 runs again)."""
    records, _ = read_records(source)
    try:  # an unreadable sidecar vouches for nothing: the questions are answered again
        saved = saved_identity(source) if records else None
    except RecordsConflict:
        return None
    if saved is None or _measured(saved) != _measured(evaluation_identity(config)):
        return None
    by_id = {r["id"]: r for r in records}
    chosen = [by_id.get(ex.id) for ex in examples]
    if any(r is None or r["question"] != ex.question or r["golds"] != list(ex.answers)
           for r, ex in zip(chosen, examples)):
        return None
    return chosen


class RecordWriter:
    """Appends an evaluation's records to ``out`` as they finish: each line flushed, each batch synced to disk.
    The file (and, with ``identity``, its sidecar; without, a stale sidecar goes) is created with the first
    record, so a run that finishes nothing leaves an earlier file as it was. ``append``: continue after the
    kept records instead of starting the file over."""

    def __init__(self, out: Path, identity: dict | None, append: bool):
        self.out, self.identity, self.append = out, identity, append
        self.file = None

    def _open(self) -> None:
        self.out.parent.mkdir(parents=True, exist_ok=True)
        sidecar = records_config_path(self.out)
        if not self.append:
            if self.identity is None:
                sidecar.unlink(missing_ok=True)  # it described records this run replaces
            else:  # written before the first record: a record on disk always has its sidecar
                tmp = sidecar.with_name(sidecar.name + ".tmp")
                tmp.write_text(json.dumps({"identity": self.identity}, indent=1), encoding="utf-8")
                tmp.replace(sidecar)
        self.file = self.out.open("a" if self.append else "w", encoding="utf-8")

    def write(self, lines: list[str]) -> None:
        if self.file is None:
            self._open()
        for line in lines:
            self.file.write(line + "\n")
            self.file.flush()
        os.fsync(self.file.fileno())

    def finish(self) -> None:
        """The run completed: a run that wrote nothing still leaves its (empty) file, as callers read it."""
        if self.file is None and not self.append:
            self._open()
        self.close()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
