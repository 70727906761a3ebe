"""Table 2's prompt baselines on the untrained backbone, on the kunlun arm's held-out world questions with its
agent settings (budgets, top-k, index), as notebook 08 runs them, into ``<out>/records/world.<method>.jsonl``
(where experiments/scripts/table2_report.py reads a suite's records). Used by issue 43's measured run in place of
``kunlunlab suite``, which would first evaluate the kunlun checkpoint again (25 minutes of a 2-core budget).

    python experiments/scripts/table2_baselines.py runs/table2.kunlun/train_config.json runs/table2.suite [METHOD ...]
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from kunlunlab.agent.transformers_backend import TransformersBackend
from kunlunlab.data.splits import load_splits
from kunlunlab.eval.harness import EvalConfig, apply_agent_settings, evaluate
from kunlunlab.training.pipeline import agent_settings, run_config

BASELINES = ("naive_gen", "naive_rag", "iter_retgen", "ircot", "search_o1")


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        raise SystemExit(__doc__.strip().splitlines()[-1].strip())
    cfg = run_config(argv[0], {})
    out = Path(argv[1]) / "records"
    held = load_splits(cfg.splits())
    backend = TransformersBackend(cfg.model, device=cfg.device)  # None: the embedded SmolLM2-135M-Instruct
    settings = agent_settings(cfg)
    summaries = {}
    for method in argv[2:] or BASELINES:
        eval_cfg = apply_agent_settings(EvalConfig(dataset="world", limit=len(held.heldout), judge=None,
                                                   index_kind=cfg.index_kind, embedder=cfg.embedder,
                                                   batch_size=cfg.eval.batch_size, seed=cfg.world_seed),
                                        {**settings, "method": method})
        summary = evaluate(eval_cfg, out / f"world.{method}.jsonl", backend=backend, examples=held.heldout,
                           passages=held.passages, resume=True)
        summaries[method] = {"em": summary["em"], "f1": summary.get("f1"), "n": summary.get("n")}
        print(f"{method}: EM {summary['em']}", flush=True)
    print(json.dumps(summaries))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
