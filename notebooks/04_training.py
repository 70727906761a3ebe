# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 04 · Training the whole agent: format cold start (SFT), then DAPO through TRL
#
# **What this notebook shows.** The progressive training of KunLunBaizeRAG (paper §2.3) on the embedded
# SmolLM2-135M, one stage per cell so that each stage's effect can be seen before the next starts:
#
# | stage | what happens | package |
# |---|---|---|
# | 0 · evaluation before | the untrained model, run as the agent it will become | `kunlunlab/training/pipeline.py` → `kunlunlab/eval/harness.py` |
# | 1 · data | mixed trajectories (notebook 02's schedule, eqs. 14–16) | `kunlunlab/training/mixing.py` |
# | 2 · SFT | format cold start with TRL's `SFTTrainer` | `kunlunlab/training/sft.py` |
# | 3 · DAPO | outcome RL with TRL's `GRPOTrainer` (`loss_type="dapo"`) | `kunlunlab/training/dapo.py` |
# | 4 · evaluation after | the same harness, the same held-out questions | `kunlunlab/eval/harness.py` |
#
# **What is trained is the whole agent** (`agent.method = "kunlun"`), run in training exactly as it is
# evaluated: every prompt carries RDRA's background block (§2.1: the passages retrieved for the question),
# and STIE (§2.2) watches the answer rounds and appends its feedback when the agent should verify. The
# make-run config runs RDRA **plan-free** (`agent.rdra.use_plan = false`, a named departure): the paper's
# plan (eq. 2) and its second retrieval (eq. 3) are skipped, because the 135M model's plans are often wrong
# and the model trained on them copies them into its searches (trained at a larger size: 47.0 EM with the
# plan, 70.0 without, on the same 100 held-out questions; README, "Training"). Set it to `true` (with
# `mixing.plan_samples`) to train the paper's planning step. `agent.method = "agent"` trains the bare
# search-think protocol instead (the ablation notebook 06 compares).
#
# **Why two stages.** A 135M model does not follow the `<think>`/`<search>`/`<result>`/`<short_answer>`
# protocol on its own (format compliance before training is about 0 %), and RL cannot reward a protocol it
# never samples. SFT on teacher trajectories teaches the format; DAPO then improves *what* the agent
# searches and answers from its own rollouts.
#
# The same run outside Jupyter: `kunlunlab train --config experiments/configs/training/train_embedded_cpu.json`.
# Every stage resumes: run a cell again on the same `run_dir` and a finished stage is read back, not redone.

# %% tags=["parameters"]
# Parameters (papermill overrides these)
config = "experiments/configs/training/train_embedded_cpu.json"   # relative to the repository root, or absolute
overrides = {}            # e.g. {"sft.learning_rate": 5e-5, "dapo.steps": 8}
smoke = False
device = "auto"           # where the model trains and generates: auto (CUDA when present), cpu, cuda, cuda:N
run_dir = None            # None: a new experiments/runs/<timestamp>-04_training folder
kept = "experiments/results/planfree_makerun"   # the kept full-size run of this recipe shown beside this one
                          # (relative to the repository root; None: none)

# %%
import json

from IPython.display import HTML, display

from kunlunlab.configs import leaf_values
from kunlunlab.eval.compare import kept_beside_fresh
from kunlunlab.paths import PROJECT_ROOT, notebook_run_dir
from kunlunlab.training.config import TrainConfig
from kunlunlab.training.pipeline import TrainingRun, run_config
from kunlunlab.training.records import HELDOUT_FILES, heldout_records, training_logs
from kunlunlab.viz import (before_after_figure, before_after_html, config_table_html, data_figure, render_trajectory,
                           save_figure, sft_loss_figure, table_html, training_curves)

cfg = run_config(config, {"device": device, **overrides}, smoke=smoke)
run_dir = notebook_run_dir(run_dir, "04_training")
print("run folder:", run_dir)
display(HTML(config_table_html(cfg.to_dict(), TrainConfig().to_dict())))

# %% [markdown]
# ## Setting up the run
#
# `TrainingRun` loads the data (a synthetic world's training and held-out questions, and the HotpotQA
# distractor sample split into training and held-out halves), builds the retriever and loads the model. It
# refuses a run folder that holds a run of a *different* config: resuming there would silently hand back
# the other run's models. make run's config trains SFT and DAPO each in a process of its own
# (`own_process_stages`): on a CPU a process keeps the holes its training leaves in the heap until it exits, so
# this kernel reads each stage's final model back instead of growing from the stage's peak (docs/training.md,
# "Memory on CPU"); the stage's bar and lines are shown here all the same.

# %%
run = TrainingRun(cfg, run_dir, progress=print)

# %% [markdown]
# ## Stage 0 · evaluation before training
#
# The held-out questions were never seen in training (the synthetic ones come from another seed and are
# checked against the training questions). The untrained model rarely closes an answer tag, so its few
# correct answers are extracted from free text (the fallback every baseline gets).

# %%
before = run.evaluate("before") if cfg.eval.before else {}
{name: {k: part.get(k) for k in ("n", "em", "f1", "format_compliance")} for name, part in before.items()
 if isinstance(part, dict)}

# %% [markdown]
# ## Stage 1 · data: the mixed trajectories (eqs. 14–16)
#
# Notebook 02 explains the schedule: early epochs hold more high-quality trajectories, later ones more noisy
# ones (a wrong search or a wrong intermediate answer that the trajectory then corrects), so the model first
# learns the format and then learns to recover. For the whole agent the trajectories also carry RDRA
# backgrounds built with real retrieval, *plan samples* when RDRA plans (the plan prompt → the plan, so the
# model learns to write RDRA's plan; none plan-free), and STIE feedback rounds (verify with a new search,
# answer again; in half of them the first answer was wrong and is corrected).

# %%
trajectories = run.mix()
print(f"{len(trajectories)} trajectories")
fig = data_figure(run.stats_rows)
save_figure(fig, run_dir, "data")
fig

# %% [markdown]
# ## Stage 2 · format cold start (SFT) with retrieved tokens masked (eq. 19)
#
# The loss is the usual next-token cross-entropy, but only over the model's own tokens. With $m_t = 1$ for a
# token the model generated (think, search queries, answers) and $m_t = 0$ for the prompt, every
# `<result>…</result>` block, STIE's feedback text and the wrong turns of noisy trajectories:
#
# $$\mathcal{L}_\text{SFT}(\theta) = -\frac{1}{\sum_t m_t} \sum_t m_t \log \pi_\theta(y_t \mid y_{<t})$$
#
# *Why mask retrieved tokens?* They are written by the retriever, not the model: training on them would
# teach the model to hallucinate passages instead of searching for them, and their length would swamp the
# loss of the few tokens that decide what to search and answer. (Eq. 19 of the paper is the same masking in
# the RL objective below; the SFT form above is the workbench's reading.)

# %%
run.sft()
fig = sft_loss_figure(training_logs(run_dir)["sft"])
save_figure(fig, run_dir, "sft_loss")
fig

# %% [markdown]
# ## Stage 3 · DAPO (TRL `GRPOTrainer`, `loss_type="dapo"`)
#
# For each training question the policy samples a group of $G$ trajectories $o_1 \dots o_G$ with the same
# rollout engine as inference (RDRA + STIE for the whole agent); each gets notebook 03's dual-mode reward
# $R_i$ (eqs. 17–18). DAPO (Yu et al., 2025) maximises
#
# $$\mathcal{J}(\theta)=\mathbb{E}\Big[\frac{1}{\sum_{i=1}^{G}\sum_t m_{i,t}}\sum_{i=1}^{G}\sum_{t} m_{i,t}\,
#   \min\big(r_{i,t}(\theta)\hat A_{i},\ \operatorname{clip}(r_{i,t}(\theta),1-\varepsilon_\text{low},
#   1+\varepsilon_\text{high})\hat A_{i}\big)\Big],\quad
#   r_{i,t}=\frac{\pi_\theta(o_{i,t}\mid q,o_{i,<t})}{\pi_{\theta_\text{old}}(o_{i,t}\mid q,o_{i,<t})},\quad
#   \hat A_i=\frac{R_i-\operatorname{mean}(R)}{\operatorname{std}(R)}$$
#
# subject to $0 < |\{i : o_i \text{ correct}\}| < G$, where $m_{i,t}$ is eq. 19's mask (`env_mask` from the
# rollout: retrieved passages and STIE's feedback get no gradient). The choices a learner may question:
#
# - **token-level averaging** (the $1/\sum m$ outside both sums): long trajectories are not down-weighted per
#   token, as they are when each sample's loss is averaged first;
# - **clip-higher** ($\varepsilon_\text{high} = 0.28 > \varepsilon_\text{low} = 0.2$): lets rare good tokens
#   grow faster, against entropy collapse; **no KL term** ($\beta = 0$);
# - **dynamic sampling** (the constraint): a group whose samples are all right or all wrong has
#   $\hat A_i = 0$ for every $i$, no gradient at all, so it is dropped and replaced by an informative group of
#   another training question (flatness is judged on accuracy, not on the shaped reward);
# - **overlong shaping**: a soft penalty as a trajectory nears the token budget.

# %%
run.dapo()
logs = training_logs(run_dir)
fig = training_curves(logs["sft"], logs["dapo"], logs["rollouts"])
save_figure(fig, run_dir, "training_curves")
fig

# %% [markdown]
# ## Stage 4 · evaluation after training
#
# EM, F1 (in %) and **format compliance**: the share of trajectories that follow the protocol end to end
# (an answer tag with `\boxed{}` and no protocol issue on the way).

# %%
run.evaluate("after")
summary = run.finish()
display(HTML(before_after_html(summary)))
print(f"{summary['steps']} optimizer steps {summary['steps_by_stage']}, {summary['seconds']} s of training "
      f"{summary['seconds_by_stage']}, {summary['heldout_questions']} held-out questions")
fig = before_after_figure(summary)
save_figure(fig, run_dir, "before_after")
fig

# %% [markdown]
# ## This run beside the kept full-size run
#
# `make run` evaluates on few questions to keep the series within its hour, so its EM moves by tens of points
# from one draw to the next. The kept run of the same recipe (`kept`, its records and config in that folder;
# docs/results.md, "make run's training") was evaluated on more held-out questions of the same world: here both,
# labelled, and this run minus the kept one on the questions both evaluated (paired; a question counts as shared
# only where its id and its text agree).

# %%
if kept:
    kept_dir = PROJECT_ROOT / kept
    kept_cfg = json.loads((kept_dir / "train_config.json").read_text())
    for dataset, label in (("world", "synthetic world"), ("hotpotqa_distractor", "HotpotQA distractor")):
        if not (run_dir / HELDOUT_FILES[dataset]).is_file():
            continue
        header, rows = kept_beside_fresh(heldout_records(kept_dir, dataset), heldout_records(run_dir, dataset),
                                         f"kept: {kept} (after training)", "this run (after training)")
        print(label)
        display(HTML(table_html(header, rows)))
    kept_values, now_values = leaf_values(kept_cfg), leaf_values(cfg.to_dict())
    # fields added since the kept run are left out (it ran their defaults' predecessors); lists and tuples, False
    # and 0.0 alike
    print("the kept run's config (kept -> this run), where they differ:",
          {k: (kept_values[k], v) for k, v in now_values.items() if k in kept_values and k != "device"
           and kept_values[k] != v and json.dumps(kept_values[k]) != json.dumps(v)})

# %% [markdown]
# ## The two answer modes
#
# The dual-mode reward (eqs. 17–18, notebook 03) scores `<short_answer>` and `<long_answer>` alike up to the
# long mode's summary length and structure. `summary_share` of the world's training questions ask for a summary
# ("Describe how X is connected to Y."): their SFT trajectories answer in the long mode (the chain's facts, then
# the link in the box), and in DAPO their accuracy term also scores how much of the gold facts the summary states
# (fact coverage). The table above has the held-out summary-oriented questions in its last rows; here is which
# mode the trained model chose on each kind of question, and one of its long answers.

# %%
summary_records = heldout_records(run_dir, "world_summary") if cfg.eval.summary_questions else []
factoid_records = heldout_records(run_dir, "world")
for name, rows in (("factoid", factoid_records), ("summary-oriented", summary_records)):
    modes = [r.get("answer_mode") for r in rows]
    print(f"{name:>16}: {len(rows)} questions, long {modes.count('long')}, short {modes.count('short')}, "
          f"no answer tag {modes.count(None)}")
long_answer = next((r for r in summary_records if r.get("answer_mode") == "long"), None)
if long_answer:
    print("question:", long_answer["question"], "| gold facts coverage:", round(long_answer["fact_coverage"], 2))
    print(long_answer["trajectory"].get("text", "")[-400:])

# %% [markdown]
# ## A trajectory of the trained model

# %%
records = [json.loads(line) for line in (run_dir / "eval_after_world.jsonl").read_text().splitlines()]
pick = next((r for r in records if r["em"]), records[0])
print("gold:", pick["golds"], "| prediction:", pick["prediction"])
display(HTML(render_trajectory(pick)))

# %% [markdown]
# Where the EM comes from: answers closed with an answer tag versus answers the evaluation had to extract
# from free text (the fallback every baseline gets). A gain from following the protocol shows up as tagged
# answers.

# %%
print({k: summary.get(k) for k in ("em_tagged_after", "n_tagged_after", "em_fallback_after", "n_fallback_after")})
print("trajectory mix:", summary["trajectory_mix"])

# %%
(run_dir / "metrics.json").write_text(json.dumps(summary, indent=2))
{k: summary[k] for k in ("em_before", "em_after", "format_compliance_before", "format_compliance_after", "seconds")}

# %% [markdown]
# ## What this run showed
#
# Read back from this run's `metrics.json` (the training summary).

# %%
shown = json.loads((run_dir / "metrics.json").read_text())
print(f"held-out EM {shown.get('em_before')} before training -> {shown.get('em_after')} after, on "
      f"{shown.get('heldout_questions')} held-out questions")
print(f"format compliance {shown.get('format_compliance_before')} -> {shown.get('format_compliance_after')}; "
      f"{shown.get('steps')} optimizer steps in {shown.get('seconds')} s {shown.get('seconds_by_stage')}")
summaries = shown.get("world_summary") or {}
print(f"long answers: {shown.get('long_share_before')} % -> {shown.get('long_share_after')} % of the factoid "
      f"questions, {summaries.get('long_share_before')} % -> {summaries.get('long_share_after')} % of the "
      f"{summaries.get('n')} summary-oriented ones; their fact coverage {summaries.get('fact_coverage_before')} -> "
      f"{summaries.get('fact_coverage_after')} %, EM of the boxed link {summaries.get('em_before')} -> "
      f"{summaries.get('em_after')}")

# %% [markdown]
# ## Exercises
#
# 1. Set `overrides = {"dapo.enabled": False}` and compare EM after SFT alone with this run's: how much did DAPO add
#    here, and is that inside the noise of 40 questions (see notebook 06's paired intervals)?
# 2. Set `{"agent.method": "agent", "eval.method": "agent"}` to train the plain search-think agent: does the
#    whole method (RDRA + STIE) beat it at this model size? (The README's table gives the measured answer.)
# 3. Set `{"dapo.updates_per_generation": 2}` and look at `clip_ratio` in the DAPO log: why does clip-higher bind
#    only with more than one update per rollout batch?
# 4. Set `{"sft.learning_rate": 1e-4}`: how do the SFT loss curve and EM after SFT move?
