"""How often STIE (§2.2) intervenes on a trained checkpoint, and what it changes: reads the records of a
``kunlunlab suite`` run with the ``−STIE`` ablation (``records/world.kunlun.jsonl`` and
``records/world.−STIE.jsonl``) and prints one JSON line:

* ``answer_rounds``: answer rounds per question under STIE (1.0: every rollout ended at its first answer);
* ``with_feedback``: questions where STIE appended its feedback block and the model answered again;
* ``changed_answer``: questions whose accepted answer differs from the first round's answer (a replacement);
* ``stop_reasons``: the controller's reason for ending each rollout;
* the paired EM difference kunlun − (−STIE) with its 95 % paired-bootstrap interval, and n.

    kunlunlab suite --model CKPT --train-config CONFIG --out OUT \
        --set 'datasets=["world"]' world_questions=100 'baselines=[]' 'ablations=["−STIE"]' nlr=false
    python experiments/scripts/stie_intervention.py OUT
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from kunlunlab.data.answers import normalize_answer
from kunlunlab.eval.stats import paired_bootstrap, paired_records


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def main(out: str) -> dict:
    records = Path(out) / "records"
    with_stie, without = read(records / "world.kunlun.jsonl"), read(records / "world.−STIE.jsonl")
    rounds = [len(r["trajectory"].get("rounds") or []) for r in with_stie]
    feedback = [any(step.get("kind") == "feedback" for step in r["trajectory"].get("steps", [])) for r in with_stie]
    changed = []
    for r in with_stie:
        first = (r["trajectory"].get("rounds") or [{}])[0].get("answer")
        changed.append(first is not None and normalize_answer(first) != normalize_answer(r["prediction"] or ""))
    a, b = paired_records(with_stie, without, "em")
    boot = paired_bootstrap(a, b, n_resamples=10_000, seed=0)
    n, low, high = boot["n"], boot["low"], boot["high"]
    by_id = {r["id"]: r for r in without}
    result = {
        "n": n, "answer_rounds": round(sum(rounds) / len(rounds), 3),
        "with_feedback": sum(feedback), "changed_answer": sum(changed),
        "stop_reasons": dict(Counter(r["trajectory"].get("finish") for r in with_stie)),
        "em_stie": round(100 * sum(a) / n, 1), "em_without_stie": round(100 * sum(b) / n, 1),
        "delta": round(100 * (sum(a) - sum(b)) / n, 1), "ci95": [round(100 * low, 1), round(100 * high, 1)],
        "answers_differ": sum(1 for r in with_stie if r["prediction"] != by_id[r["id"]]["prediction"]),
    }
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python experiments/scripts/stie_intervention.py SUITE_OUT_FOLDER")
    main(sys.argv[1])
