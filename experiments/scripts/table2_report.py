"""Table 2 against the peers from kept records (issue 43; docs/results.md, "Table 2 against the peers"): each trained
arm's evaluation after training (``<arm>/eval_after_{world,hotpot}.jsonl``) and the prompt baselines of the suite on
the untrained backbone (``suite/records/<dataset>.<method>.jsonl``), paired by question id; then the kunlun recipe
with DAPO against GRPO, with the clip ratios TRL logged at every RL step. Every table carries each row's
answer-tag share; a row answered mostly by fallback extraction is marked collapsed and compared with nothing. The folder is a runs folder of
``experiments/scripts/table2_run.sh`` (``table2.<arm>``, ``table2.suite``) or the kept ``experiments/results/table2``
(``<arm>``, ``suite``). Prints the tables as markdown, then one JSON line.

    python experiments/scripts/table2_report.py experiments/results/table2
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kunlunlab.eval.compare import ablation_table, table2
from kunlunlab.eval.metrics import collapsed
from kunlunlab.paths import jsonl_path, read_jsonl
from kunlunlab.runner import markdown_table
from kunlunlab.training.records import heldout_records, training_logs

ARMS = ("search_r1", "research", "r1_searcher", "kunlun")  # Table 2's rows (kunlun last)
BASELINES = ("naive_gen", "naive_rag", "iter_retgen", "ircot", "search_o1")
FILES = {"world": "eval_after_world.jsonl", "hotpotqa_distractor": "eval_after_hotpot.jsonl"}


def _share(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.2f} %"


def folder_of(root: Path, name: str) -> Path:
    return root / name if (root / name).is_dir() else root / f"table2.{name}"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit("usage: table2_report.py RUNS_OR_KEPT_FOLDER")
    root = Path(argv[0])
    records: dict[str, dict[str, list[dict]]] = {}
    for dataset, name in FILES.items():
        per_method = records.setdefault(dataset, {})
        suite = folder_of(root, "suite") / "records"
        for method in BASELINES:
            path = jsonl_path(suite / f"{dataset}.{method}.jsonl")
            if path.is_file():
                per_method[method] = read_jsonl(path)
        for arm in ARMS:
            path = jsonl_path(folder_of(root, arm) / name)
            if path.is_file():
                per_method[arm] = read_jsonl(path)
    baselines = [b for b in BASELINES if b in records["world"]]
    peers = [a for a in ARMS[:-1] if a in records["world"]]
    models = {**{b: "SmolLM2-135M-Instruct (untrained)" for b in baselines},
              **{a: f"{a}/dapo/final" for a in (*peers, "kunlun")}}
    header, rows = table2(records, "kunlun", baselines, n_resamples=10_000, peers=peers, models=models)
    print("## Table 2 (EM %)\n")
    print("\n".join(markdown_table(header, rows)))
    # rows whose answers came mostly from fallback extraction (their "tag %" cell says "collapsed"): not results
    out = {"table2": {"header": header, "rows": rows},
           "collapsed": sorted(f"{dataset} {name}" for dataset, per_method in records.items()
                               for name, recs in per_method.items() if collapsed(recs))}
    if out["collapsed"]:
        print(f"\nCollapsed (most answers by fallback extraction, not results): {', '.join(out['collapsed'])}")
    # every trained arm against kunlun, one by one (Table 2 shows the difference to the best peer only)
    for dataset in FILES:
        arms = {a: records[dataset][a] for a in ("kunlun", *peers) if a in records[dataset]}
        if "kunlun" not in arms or len(arms) < 2:
            continue
        h, r = ablation_table(arms, "kunlun", n_resamples=10_000, seed=0)
        print(f"\n## The trained arms against kunlun ({dataset}, n = {len(arms['kunlun'])} paired questions)\n")
        print("\n".join(markdown_table(h, r)))
        out[f"arms_vs_kunlun {dataset}"] = {"header": h, "rows": r}
    # the kunlun recipe with DAPO against GRPO where clip-higher can bind (4 updates per rollout batch, lr 1e-4; at
    # Table 2's 2 updates and lr 2e-5 the ratio never left [1 - ε, 1 + ε_high] upwards), both from kunlun's SFT
    # checkpoint; Table 2's own DAPO arm's clip ratios are listed beside them
    pairs = {"4 updates per batch, lr 1e-4": ("kunlun_dapo_u4", "kunlun_grpo_u4")}
    clip = {}
    for setting, (dapo, grpo) in pairs.items():
        if not all(jsonl_path(folder_of(root, arm) / FILES["world"]).is_file() for arm in (dapo, grpo)):
            continue
        runs = {f"DAPO ({dapo})": folder_of(root, dapo), f"GRPO ({grpo})": folder_of(root, grpo)}
        for dataset, name in FILES.items():
            if not all(jsonl_path(folder / name).is_file() for folder in runs.values()):
                continue  # an arm evaluated on the world questions only
            # paired on the questions both answered (an arm may have answered the first n of the held-out set)
            pair = {label: heldout_records(folder, dataset) for label, folder in runs.items()}
            common = set.intersection(*({r["id"] for r in recs} for recs in pair.values()))
            h, r = ablation_table({label: [x for x in recs if x["id"] in common] for label, recs in pair.items()},
                                  f"DAPO ({dapo})", n_resamples=10_000, seed=0)
            print(f"\n## DAPO vs GRPO, {setting} ({dataset}, n = {len(common)} paired questions)\n")
            print("\n".join(markdown_table(h, r)))
            out[f"dapo_vs_grpo {setting} {dataset}"] = {"header": h, "rows": r, "n": len(common)}
        for label, folder in {**runs, "DAPO (kunlun, Table 2)": folder_of(root, "kunlun")}.items():
            steps = [row for row in training_logs(folder)["dapo"] if "loss" in row]
            clip[label] = [{k: row.get(k) for k in ("step", "clip_ratio/high_mean", "clip_ratio/low_mean",
                                                     "clip_ratio/region_mean")} for row in steps]
    if clip:
        print("\n## Clip ratio per RL step\n")
        print("\n".join(markdown_table(["arm", "step", "high (above 1 + ε_high)", "low (below 1 − ε)", "region"],
                                       [[label, c["step"], *(_share(c[k]) for k in ("clip_ratio/high_mean",
                                         "clip_ratio/low_mean", "clip_ratio/region_mean"))]
                                        for label, cs in clip.items() for c in cs])))
        out["clip_ratio"] = clip
    print(json.dumps(out, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
