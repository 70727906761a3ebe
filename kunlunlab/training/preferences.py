"""Step-level preference pairs for DPO (:mod:`kunlunlab.training.dpo`) from the process-reward trees of
:mod:`kunlunlab.training.process_rewards` (ReasonRAG, arXiv 2505.14069), their files, and the ``prl`` stage's
data collection (:func:`collect_preferences`).

**Preference pairs.** Under every expanded node, sibling steps whose values differ by at least ``min_gap``
(0.01) and whose contents differ form a pair; pairs across actions (answer now vs search more) are kept. The
prompt is the parent's prefix ids (question + path so far, results included as context); chosen and rejected
are the two steps' sampled ids. :func:`write_preferences` writes ``preferences.jsonl`` and :func:`write_trees`
``trees.jsonl`` (every tree as nested dicts).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

from kunlunlab.agent.backends import Backend
from kunlunlab.agent.rollout import RolloutConfig, SearchFn
from kunlunlab.training.process_rewards import MCTSConfig, SearchTree, build_trees


@dataclass
class PreferencePair:
    """One step-level preference: under the same prefix, the step with the higher SPRE value is chosen."""

    tree_id: str
    question: str
    prompt_ids: list[int]
    chosen_ids: list[int]
    rejected_ids: list[int]
    prompt_text: str
    chosen_text: str
    rejected_text: str
    chosen_action: str
    rejected_action: str
    depth: int                    # depth of the two steps (their parent's depth + 1)
    chosen_value: float
    rejected_value: float
    chosen_estimated: bool        # the value is a leaf's value-source estimate (no answer below it yet)
    rejected_estimated: bool

    @property
    def cross_action(self) -> bool:
        return self.chosen_action != self.rejected_action

    @property
    def gap(self) -> float:
        return self.chosen_value - self.rejected_value

    def to_dict(self) -> dict:
        return {**asdict(self), "cross_action": self.cross_action, "gap": round(self.gap, 6)}


def preference_pairs(trees: Iterable[SearchTree], min_gap: float = 0.01, cross_action: bool = True
                     ) -> list[PreferencePair]:
    """Sibling steps with a value gap ≥ ``min_gap`` and different contents, every such pair under every expanded
    node; ``cross_action=False`` keeps only pairs of the same action."""
    pairs = []
    for tree in trees:
        for parent in tree.nodes():
            kids = [c for c in parent.children if c.visits > 0]
            if len(kids) < 2:
                continue
            prompt_text = tree.prompt_text + parent.path_text()
            for i, a in enumerate(kids):
                for b in kids[i + 1:]:
                    if a.step_ids == b.step_ids or a.text.strip() == b.text.strip():
                        continue
                    if abs(a.value - b.value) < min_gap - 1e-12:
                        continue
                    if not cross_action and a.action != b.action:
                        continue
                    hi, lo = (a, b) if a.value >= b.value else (b, a)
                    pairs.append(PreferencePair(
                        tree.id, tree.question, list(parent.prefix_ids), list(hi.step_ids), list(lo.step_ids),
                        prompt_text, hi.text, lo.text, hi.action, lo.action, parent.depth + 1, hi.value, lo.value,
                        hi.estimate is not None and not hi.children, lo.estimate is not None and not lo.children))
    return pairs


def _write_jsonl(path: str | Path, rows: Iterable[dict]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")
            n += 1
    return n


def write_preferences(path: str | Path, pairs: Iterable[PreferencePair]) -> int:
    return _write_jsonl(path, (p.to_dict() for p in pairs))


def read_preferences(path: str | Path) -> list[dict]:
    """``preferences.jsonl`` rows (dicts with ``prompt_ids``, ``chosen_ids``, ``rejected_ids`` …), as
    :func:`kunlunlab.training.dpo.run_dpo` accepts them."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def write_trees(path: str | Path, trees: Iterable[SearchTree]) -> int:
    return _write_jsonl(path, (t.to_dict() for t in trees))


def tree_stats(trees: Sequence[SearchTree], pairs: Sequence[PreferencePair]) -> dict:
    """Counts for logs and notebooks: nodes, answers, their mean F1, pairs by kind."""
    nodes = [n for t in trees for n in t.nodes() if n.action != "root"]
    answers = [n for n in nodes if n.action == "answer"]
    return {"trees": len(trees), "steps": len(nodes), "answers": len(answers),
            "answer_f1": sum(n.f1 or 0.0 for n in answers) / len(answers) if answers else None,
            "dead_ends": sum(1 for n in nodes if n.terminal and n.action != "answer"),
            "root_value": sum(t.root.value for t in trees) / len(trees) if trees else None,
            "pairs": len(pairs), "cross_action_pairs": sum(p.cross_action for p in pairs),
            "pairs_on_estimates": sum(p.chosen_estimated or p.rejected_estimated for p in pairs)}


def collect_preferences(backend: Backend, search: SearchFn | None, examples: Sequence, out_dir: str | Path,
                        rollout: RolloutConfig | None = None, config: MCTSConfig | None = None,
                        progress: Callable[[str], None] | None = None, **build_kwargs) -> list[dict]:
    """The data half of the ``prl`` stage: trees for ``examples``, then ``trees.jsonl``, ``preferences.jsonl`` and
    ``mcts_stats.json`` in ``out_dir``; returns the pairs as ``preferences.jsonl`` rows (what
    :func:`~kunlunlab.training.dpo.run_dpo` takes). Resumable: an existing ``preferences.jsonl`` (written last,
    atomically) is read back instead of searching again. ``build_kwargs`` go to :func:`build_trees`."""
    out_dir = Path(out_dir)
    prefs = out_dir / "preferences.jsonl"
    if prefs.is_file():
        return read_preferences(prefs)
    config = config or MCTSConfig()
    trees, stats = build_trees(backend, search, examples, rollout, config, progress=progress, **build_kwargs)
    pairs = preference_pairs(trees, config.min_gap)
    write_trees(out_dir / "trees.jsonl", trees)
    (out_dir / "mcts_stats.json").write_text(json.dumps({**tree_stats(trees, pairs), **asdict(stats)}, indent=2))
    tmp = prefs.with_suffix(".tmp")
    write_preferences(tmp, pairs)
    tmp.replace(prefs)
    if progress:
        progress(f"MCTS: {len(pairs)} preference pairs from {len(trees)} trees")
    return read_preferences(prefs)


__all__ = ["PreferencePair", "collect_preferences", "preference_pairs", "read_preferences", "tree_stats",
           "write_preferences", "write_trees"]
