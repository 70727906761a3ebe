"""How often STIE (§2.2) intervenes on a trained checkpoint, and what it changes, from the records of one
``kunlunlab suite`` run of ``kunlun`` (``records/world.kunlun.jsonl``); prints one JSON line:

* ``answer_rounds``: answer rounds per question (1.0: every rollout ended at its first answer);
* ``with_feedback``: questions where STIE appended its feedback block and the model answered again;
* ``changed_answer``: questions whose accepted answer differs from the first round's answer;
* ``stop_reasons``: how each rollout ended (``controller``: STIE stopped it);
* EM with STIE against EM of the first answer round, paired, with the 95 % paired-bootstrap interval and n.

The first round's answer is what ``−STIE`` answers: decoding is greedy and STIE acts only after an answer round
(it stops the rollout or appends feedback; eq. 13's block applies after feedback), so without STIE the same
rollout ends at that answer. When the run also holds ``records/world.−STIE.jsonl`` the script checks that.

    kunlunlab suite --model CKPT --train-config CONFIG --out OUT \
        --set 'datasets=["world"]' world_questions=100 'baselines=[]' 'ablations=[]' nlr=false
    python experiments/scripts/stie_intervention.py OUT
"""
from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from kunlunlab.data.answers import exact_match, normalize_answer
from kunlunlab.eval.stats import paired_bootstrap
from kunlunlab.paths import jsonl_path, read_jsonl


def read(path: Path) -> list[dict]:
    return read_jsonl(path)  # the kept records are gzipped: path.gz is read where path is not there


def first_answer(record: dict) -> str | None:
    rounds = record["trajectory"].get("rounds") or []
    return rounds[0].get("answer") if rounds else record["prediction"]


def main(out: str) -> dict:
    records = Path(out) / "records"
    runs = read(records / "world.kunlun.jsonl")
    rounds = [len(r["trajectory"].get("rounds") or []) for r in runs]
    feedback = [any(step.get("kind") == "feedback" for step in r["trajectory"].get("steps", [])) for r in runs]
    changed = [first_answer(r) is not None and normalize_answer(first_answer(r)) != normalize_answer(r["prediction"] or "")
               for r in runs]
    with_stie = [float(r["em"]) for r in runs]
    without = [exact_match(first_answer(r), r["golds"]) for r in runs]
    boot = paired_bootstrap(with_stie, without, n_resamples=10_000, seed=0)
    result = {
        "n": boot["n"], "answer_rounds": round(sum(rounds) / len(rounds), 3), "with_feedback": sum(feedback),
        "changed_answer": sum(changed), "stop_reasons": dict(Counter(r["trajectory"].get("finish") for r in runs)),
        "em_stie": round(100 * boot["mean_a"], 1), "em_first_answer": round(100 * boot["mean_b"], 1),
        "delta": round(100 * boot["diff"], 1), "ci95": [round(100 * boot["low"], 1), round(100 * boot["high"], 1)],
    }
    ablation = jsonl_path(records / "world.−STIE.jsonl")
    if ablation.is_file():  # the first-answer reading checked against a real −STIE run
        by_id = {r["id"]: r["prediction"] for r in read(ablation)}
        result["first_answer_equals_minus_stie"] = sum(by_id.get(r["id"]) == first_answer(r) for r in runs)
    print(json.dumps(result))
    return result


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python experiments/scripts/stie_intervention.py SUITE_OUT_FOLDER")
    main(sys.argv[1])
