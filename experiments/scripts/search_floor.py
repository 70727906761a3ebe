"""The search floor of run folders whose held-out records predate the ``search_floor`` field (2026-11-26).

    python experiments/scripts/search_floor.py RUN [RUN ...]

For each run folder (or kept record folder under ``experiments/results``) the held-out world questions are
rebuilt from its ``train_config.json`` (the world and question seeds), and every record of
``eval_after_world.jsonl`` gets :func:`kunlunlab.eval.metrics.evidence_search_floor`: RDRA's queries plus one
search per dependency stage of the gold chain that the trajectory's background did not show. Prints one line
per run and, last, all of them as JSON: ``searches`` and ``search_floor`` per question and ``max_cut``, the
share of searches a budget could remove without the agent answering from evidence it never read
(1 − floor / searches). Records that carry ``search_floor`` (evaluated after 2026-11-26) keep theirs.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kunlunlab.eval.metrics import evidence_search_floor
from kunlunlab.paths import jsonl_path, read_jsonl
from kunlunlab.training.config import load_config
from kunlunlab.data.splits import world_questions


def floors(run: Path) -> dict:
    if not (run / "train_config.json").is_file() or not jsonl_path(run / "eval_after_world.jsonl").is_file():
        raise SystemExit(f"{run}: not a run folder (needs train_config.json and eval_after_world.jsonl)")
    world, _, heldout = world_questions(load_config(run / "train_config.json").splits())
    titles = {p.id: p.title for p in world.passages}
    by_question = {q.question: q for q in heldout}
    records = read_jsonl(run / "eval_after_world.jsonl")
    missing = [r["question"] for r in records if r["question"] not in by_question]
    if missing:
        raise SystemExit(f"{run}: {len(missing)} held-out records match no question of its config, e.g. {missing[0]!r}")
    floor = [r.get("search_floor") if r.get("search_floor") is not None
             else evidence_search_floor(r["trajectory"], titles, by_question[r["question"]]) for r in records]
    n, searches = len(records), sum(r["searches"] for r in records)
    return {"run": str(run), "n": n, "searches_per_question": round(searches / n, 2),
            "search_floor_per_question": round(sum(floor) / n, 2), "max_cut": round(1 - sum(floor) / searches, 3)}


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    rows = [floors(Path(arg)) for arg in sys.argv[1:]]
    for row in rows:
        print(f"{row['run']}: n {row['n']}, searches {row['searches_per_question']}, floor "
              f"{row['search_floor_per_question']}, max cut {row['max_cut']:.1%}")
    print(json.dumps(rows))
