# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 08 · Table 2 against the peers: Search-R1, ReSearch and R1-Searcher retrained under one budget, DAPO against GRPO
#
# **What this notebook shows.** The paper's Table 2 sets KunLunBaizeRAG against trained search agents and prompt
# baselines, each on its own backbone. Here every trained recipe starts from **the same base model, the same
# mixed data and the same step budget**, and all are evaluated on **the same held-out questions with the same
# retrieval**; the prompt baselines run on the untrained base model (the backbone every recipe started from):
#
# | row | protocol (`kunlunlab/agent/protocols.py`) | reward | RL algorithm (TRL 1.16) | recipe |
# |---|---|---|---|---|
# | `kunlun` (DAPO) | search-think, RDRA background, STIE rounds | dual-mode, eqs. 17–18 | DAPO: token-level loss, clip-higher, dynamic sampling, overlong shaping | `config` |
# | `kunlun` (GRPO) | the same, from the same SFT checkpoint | the same, no overlong shaping | GRPO: DAPO's four parts off, KL 0.001 | `config` + `GRPO` below |
# | `search_r1` | Search-R1's `<search>`/`<information>`/`<answer>` | exact match | GRPO (its PPO + critic has no TRL counterpart for multi-turn rollouts) | `peers/search_r1.json` |
# | `research` | ReSearch's `<search>`/`<result>`, `\boxed{}` in `<answer>` | F1 with a format check | GRPO | `peers/research.json` |
# | `r1_searcher` | R1-Searcher's `<\|begin_of_query\|>` … `<\|end_of_documents\|>` | stage 1 (retrieval + format), then stage 2 (F1 + format) | GRPO with batch-normalised advantages (its REINFORCE++-baseline) | `peers/r1_searcher.json` |
#
# Each peer's SFT cold start (a named departure: a 135M model never closes a peer's tags untrained) is the same
# mixed trajectories written in its protocol (`kunlunlab/training/peer_data.py`). docs/method.md names every
# source file and departure. At this size most intervals include zero: the honest reading is then "no measurable
# difference at this size".

# %% tags=["parameters"]
# Parameters (papermill overrides these)
config = "experiments/configs/training/train_embedded_cpu.json"   # the kunlun recipe (relative to the repository root)
peers = ["search_r1", "research", "r1_searcher"]   # recipes experiments/configs/training/peers/<name>.json
base_model = None         # the model every arm starts from and the baselines run on (hub id or path); None: the
                          # recipes' own (the embedded SmolLM2-135M-Instruct)
grpo = False              # the kunlun recipe with GRPO in place of DAPO, from the kunlun arm's SFT checkpoint (off at
                          # make run's size, to keep the series in its hour; series_goal_sizes.json turns it on)
baselines = ["naive_gen", "naive_rag", "iter_retgen", "ircot", "search_o1"]   # prompt baselines, on the base model
baseline_records = None   # a folder of world.<baseline>.jsonl records of them on the base model (make run passes
                          # notebook 06's): reused where they answered the arms' questions with the arms' settings
# shared by every arm; make run's size (a check that every recipe trains and is compared, not a measurement: the kept
# Table 2 is experiments/scripts/table2_run.sh's, 100 world questions, 8 RL steps of 2 prompts x 4 samples); rollouts
# and answers stop at 512 tokens (1024 in the recipes): the arms barely trained run on to the cap, half of 08's time
budget = {"mixing.epochs": 2, "mixing.turning_epoch": 1, "mixing.samples_per_epoch": 8,
          "mixing.first_turn_samples": 4, "dapo.steps": 2, "dapo.updates_per_generation": 2,
          "dapo.prompts_per_step": 1, "dapo.max_resample": 0, "dapo.learning_rate": 2e-05,
          "dapo.max_total_tokens": 512, "eval.world_questions": 10, "eval.hotpot_questions": 0,
          "eval.summary_questions": 0, "eval.max_total_tokens": 512, "eval.before": False, "summary_share": 0.0}
smoke = False
device = "auto"           # where the arms train and generate: auto (CUDA when present), cpu, cuda, cuda:N
run_dir = None            # None: a new experiments/runs/<timestamp>-08_peers folder

# %%
import gc
import json
from pathlib import Path

from IPython.display import HTML, display

from kunlunlab.eval.compare import table2
from kunlunlab.paths import PROJECT_ROOT, notebook_run_dir, read_jsonl
from kunlunlab.training.evaluation import evaluate_baselines
from kunlunlab.training.pipeline import run_config, train
from kunlunlab.training.records import compare_runs, heldout_records, training_logs
from kunlunlab.viz import clip_ratio_figure, save_figure, table_html

if smoke:  # the test suite's run: the kunlun arms (DAPO and GRPO) and two baselines at run_config's smoke sizes
    peers, baselines, grpo = [], baselines[:2], True   # (each peer recipe trains at smoke size in test_peer_recipes.py)
GRPO = {"dapo.loss_type": "grpo", "dapo.epsilon_high": 0.2, "dapo.dynamic_sampling": False,
        "rewards.overlong_shaping": False, "dapo.beta": 0.001}
run_dir = notebook_run_dir(run_dir, "08_peers")
n_resamples = 200 if smoke else 2000
# the shared budget; the test suite's run keeps run_config's smoke sizes (a budget would override them)
shared = {"device": device, "eval.before": False, "summary_share": 0.0} if smoke else {**budget, "device": device}
if base_model is not None:
    shared["model"] = base_model
print("run folder:", run_dir)


def recipe(name: str) -> str:
    return config if name == "kunlun" else f"experiments/configs/training/peers/{name}.json"


# %% [markdown]
# ## The arms, trained
#
# Each arm is `train(run_config(recipe, budget, smoke), folder)` (`kunlunlab/training/pipeline.py`): SFT on the
# mixed trajectories in its protocol, then its RL stage, then the evaluation after training on the held-out
# questions; every stage resumes, so running the notebook again on the same `run_dir` reads finished arms back.
# The GRPO arm starts from the kunlun arm's SFT checkpoint and runs the same number of RL steps: the pair is
# paired twice over, by checkpoint and by question.

# %%
folders: dict[str, Path] = {}
for name in ["kunlun", *peers]:
    folders[name] = run_dir / name
    summary = train(run_config(recipe(name), shared, smoke=smoke), folders[name], progress=lambda m, n=name: print(f"{n}: {m}"))
    print(f"{name}: world EM {summary['em_after']}, format {summary['format_compliance_after']}")
    gc.collect()
if grpo:
    folders["kunlun (GRPO)"] = run_dir / "kunlun_grpo"
    sft_final = (folders["kunlun"] / "sft" / "final").resolve()
    summary = train(run_config(config, {**shared, **GRPO, "model": str(sft_final), "sft.enabled": False}, smoke=smoke),
                    folders["kunlun (GRPO)"], progress=lambda m: print(f"kunlun (GRPO): {m}"))
    print(f"kunlun (GRPO): world EM {summary['em_after']}")
    gc.collect()

# %% [markdown]
# ## The prompt baselines, on the base model
#
# The baselines answer with prompts alone (`kunlunlab/agent/methods.py`), so they run on the model every recipe
# started from, untrained: run on a fine-tuned agent checkpoint they measure its mismatch with their prompts, not
# the method. Same held-out questions (the kunlun config's split), same retrieval, same budgets
# (`kunlunlab.eval.harness.evaluate`).

# %%
kunlun_cfg = run_config(config, shared, smoke=smoke)
# on kunlun_cfg.model, the base model, with the arms' questions and agent settings; notebook 06's records of the
# same evaluation (baseline_records) are reused where they hold these questions, else the baselines run here
evaluate_baselines(kunlun_cfg, baselines, run_dir / "baselines", reuse=baseline_records)
records = {"world": {m: read_jsonl(run_dir / "baselines" / f"world.{m}.jsonl") for m in baselines}}
gc.collect()
for name, folder in folders.items():
    records["world"][name] = heldout_records(folder, "world")

# %% [markdown]
# ## Table 2
#
# EM (percent) on the held-out world questions, each row on its own model, and the kunlun recipe's difference to
# the best prompt baseline and to the best peer, each with its paired-bootstrap 95 % interval (notebook 06
# explains the bootstrap). The questions are paired by id: every row answered the same ones.

# %%
models = {**{b: "base (untrained)" for b in baselines},
          **{name: f"{folder.name}/dapo/final" for name, folder in folders.items()}}
trained_peers = [p for p in peers] + (["kunlun (GRPO)"] if grpo else [])
header, rows = table2(records, "kunlun", list(baselines), n_resamples=n_resamples, peers=trained_peers, models=models)
tables = {"Table 2 (world EM %)": {"header": header, "rows": rows}}
display(HTML(table_html(header, rows)))

# %% [markdown]
# ## DAPO against GRPO on the same recipe
#
# The two arms share the SFT checkpoint, the data, the rollouts' protocol and the step budget; they differ in
# DAPO's four parts. Clip-higher can only bind once the policy has moved away from the one that sampled the batch:
# with two updates per rollout batch the second update's importance ratio differs from 1. TRL logs the share of
# tokens whose ratio was clipped above (`clip_ratio/high_mean`) and below (`clip_ratio/low_mean`) at every step:
# with `epsilon_high` 0.28 the DAPO arm clips above later than GRPO's symmetric 0.2 does.

# %%
if grpo:
    header_g, rows_g = compare_runs({"kunlun (DAPO)": folders["kunlun"], "kunlun (GRPO)": folders["kunlun (GRPO)"]},
                                    "kunlun (DAPO)", "world", n_resamples=n_resamples, seed=0)
    tables["DAPO vs GRPO (world)"] = {"header": header_g, "rows": rows_g}
    display(HTML(table_html(header_g, rows_g)))
    logs = {name: training_logs(folders[name])["dapo"] for name in ("kunlun", "kunlun (GRPO)")}
    clip = {name: [{k: row.get(k) for k in ("step", "clip_ratio/high_mean", "clip_ratio/low_mean",
                                             "clip_ratio/region_mean")} for row in rows_log if "loss" in row]
            for name, rows_log in logs.items()}
    fig = clip_ratio_figure(clip)
    save_figure(fig, run_dir, "clip_ratio")
    fig

# %%
def arm_numbers(name: str, folder: Path) -> dict:
    summary = json.loads((folder / "training_summary.json").read_text())
    log = training_logs(folder)["dapo"]
    clipped = [row.get("clip_ratio/high_mean") for row in log if row.get("clip_ratio/high_mean") is not None]
    return {"folder": str(folder), "em": summary["em_after"], "f1": summary["f1_after"],
            "format_compliance": summary["format_compliance_after"], "searches": summary["searches_after"],
            "seconds": summary["seconds_by_stage"], "clip_ratio_high_max": max(clipped) if clipped else None}


metrics = {"budget": budget, "peers": peers, "baselines": baselines, "tables": tables,
           "arms": {name: arm_numbers(name, folder) for name, folder in folders.items()},
           "baselines_em": {m: round(100 * sum(r["em"] for r in records["world"][m]) / len(records["world"][m]), 1)
                            for m in baselines}}
(run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
{name: arm["em"] for name, arm in metrics["arms"].items()}
