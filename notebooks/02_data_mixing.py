# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 02 · Progressive data mixing: noisy and high-quality trajectories
#
# **What this notebook shows.** KunLunBaizeRAG's supervised stage trains on a **mix** of high-quality and
# noisy search-think trajectories (paper §2.3). Training starts at a 1:1 ratio (the *cold start*, eq. 14);
# the high-quality share then rises to 100 % by a turning epoch $T$ (eq. 15), while the noisy samples that
# remain get noisier (eq. 16). You will see the schedule, build the trajectories with the **real
# retriever** (every `<result>` block is what the rollout engine would append at inference, formatted by the
# same function), read one trajectory of each kind with the tokens that are in the loss highlighted, and
# count what the mix contains.
#
# **Why noisy trajectories at all?** At inference retrieval is imperfect: the results may miss the fact, a
# hop may be answered wrongly, the prompt may carry irrelevant background. A model trained only on clean gold
# chains never sees a search that fails, so it learns to trust whatever comes back. Noisy trajectories show
# the *recovery*: noticing that the results do not answer and searching the entity's own page, correcting a
# wrong intermediate answer. The wrong turns themselves are kept out of the loss, so the model learns the
# correction, not the error.
#
# **Why anneal the mix?** Early epochs teach the protocol (think, search, read, answer) from a broad mix;
# later epochs concentrate on high-quality behaviour, so the policy that enters RL imitates correct
# reasoning, while the few noisy samples left become harder (a higher noise ratio): a curriculum.
#
# Code: `kunlunlab/training/mixing.py` (schedule, trajectory builder, `mix`, `data_stats`),
# `kunlunlab/viz/data_views.py` (the views below).

# %% tags=["parameters"]
# Parameters (papermill overrides these). The data come from the training config notebook 04 trains on, so
# what you see here is what SFT learns from; change the mix with overrides, e.g. {"mixing.epochs": 4,
# "mixing.turning_epoch": 3, "mixing.hq_share_start": 0.5, "mixing.noise_end": 0.9, "mixing.quote_evidence": True}.
config = "experiments/configs/training/train_embedded_cpu.json"   # relative to the repository root, or absolute
overrides = {}
smoke = False
run_dir = None               # None: a new experiments/runs/<timestamp>-02_data_mixing folder

# %%
import json
from collections import Counter

from IPython.display import HTML, display

from kunlunlab.models import load_llm
from kunlunlab.paths import notebook_run_dir, shared_data_dir
from kunlunlab.data.splits import load_rl_prompts, load_splits
from kunlunlab.training.mixing import data_stats, schedule
from kunlunlab.training.pipeline import mix_training_data, run_config
from kunlunlab.viz import data_figure, save_figure, schedule_figure
from kunlunlab.viz.data_views import (epoch_table_html, example_trajectories, mask_legend_html, mixed_trajectory_html,
                                      mixing_summary, schedule_table_html)

train_cfg = run_config(config, overrides, smoke=smoke)
cfg = train_cfg.mixing   # the MixingConfig of the run; result blocks use the run's own top_k / max_result_chars
run_dir = notebook_run_dir(run_dir, "02_data_mixing")
print(cfg)
print({k: getattr(train_cfg, k) for k in ("top_k", "max_result_chars", "seed")})
metrics = {}

# %% [markdown]
# ## The schedule (eqs. 14–16)
#
# Per epoch $e$ (counting from 0) with turning epoch $T$, initial high-quality share $p_0$, shape $\gamma$ and
# noise ratios $\rho_0 \to \rho_{\max}$, written as `kunlunlab/training/mixing.py` implements them (`hq_share`,
# `noise_ratio`, `schedule`; the workbench's reading of the paper's eqs. 14–16):
#
# $$p_{hq}(0) = p_0 \tag{14}$$
#
# $$p_{hq}(e) = p_0 + (1 - p_0)\,\min\!\left(1, \tfrac{e}{T}\right)^{\gamma} \tag{15}$$
#
# $$\rho(e) = \rho_0 + (\rho_{\max} - \rho_0)\,\min\!\left(1, \tfrac{e}{T}\right) \tag{16}$$
#
# With $p_0 = 0.5$ the cold start is the paper's 1:1 ratio of noisy to high-quality data; from epoch $T$ on only
# high-quality samples remain ($T = 0$: from the start). An epoch of $S$ samples holds
# $n_{hq}(e) = \operatorname{round}\left(p_{hq}(e)\,S\right)$ high-quality and $S - n_{hq}(e)$ noisy ones. The noise
# ratio $\rho(e)$ is the probability that each stage of a noisy trajectory is corrupted; $\gamma > 1$ keeps the
# noisy share high for longer, $\gamma < 1$ drops it early.

# %%
rows = schedule(cfg)
display(HTML(schedule_table_html(rows)))
fig = schedule_figure(rows)
save_figure(fig, run_dir, "schedule")
metrics["schedule"] = rows
fig

# %% [markdown]
# ## Building trajectories
#
# **High quality**: the synthetic world's **gold chains** (each hop names the passage that answers it;
# parallel hops of a comparison share one multi-query search) and HotpotQA questions walked along their
# **supporting facts**. The gold passage is always among the results (it replaces the last hit when the
# retriever missed it), so a high-quality trajectory never reasons from evidence it was not shown.
#
# **Noisy**, each stage corrupted with probability $\rho(e)$: *distractor* results (the gold passage withheld;
# the model says the results do not answer and searches the entity's page), a *wrong hop* that is pursued and
# then corrected (the wrong turn is out of the loss) and an *irrelevant background* block in the prompt.
# Every noisy trajectory still ends at the gold answer.
#
# **First-turn samples** (the prompt and the first search only) add cheap practice at decomposing a question
# into its first sub-question.

# %%
data = load_splits(train_cfg.splits())   # the world's training questions and the HotpotQA training half
trajectories = mix_training_data(train_cfg, data)
print(len(trajectories), "samples;", dict(Counter(t.quality for t in trajectories)),
      dict(Counter(t.source for t in trajectories)), dict(Counter(t.kind for t in trajectories)))

# %% [markdown]
# ## One trajectory of each kind, with the loss mask
#
# Supervised fine-tuning computes the loss only on tokens the model should learn to write. With $m_i = 1$ for a
# token of a trained model turn and $m_i = 0$ for the prompt, every retrieved `<result>` block and the masked
# wrong turns (`tokenize_trajectory` in `kunlunlab/training/mixing.py` builds the mask; `kunlunlab/training/sft.py`
# hands it to TRL, which turns $m_i = 0$ into ignored labels):
#
# $$\mathcal L_\text{SFT} = -\frac{1}{\sum_i m_i} \sum_i m_i \log \pi_\theta\left(y_i \mid y_{<i}\right)$$
#
# Why mask the results? They are the environment's text: at inference the retriever writes them, so training the
# model to produce them would teach it to hallucinate search results. Colours below: grey is in the loss, red is
# a model turn kept out of it, green is retrieved text, blue the assistant prefix that is part of the prompt.

# %%
display(HTML(mask_legend_html()))
for label, t in example_trajectories(trajectories).items():
    display(HTML(mixed_trajectory_html(t, title=label) + "<hr>"))

# %% [markdown]
# ## What the mix contains
#
# Per epoch: how many high-quality and noisy samples, and which noise kinds (a noisy trajectory can carry
# several). The histograms compare hops, searches and token lengths (the embedded model's tokenizer) of the two
# qualities. A distractor or wrong-hop trajectory is longer by construction (recovering costs an extra turn and
# result); background noise sits in the prompt and adds nothing to the model's text.

# %%
_, tokenizer = load_llm(train_cfg.model)
stats = data_stats(trajectories, tokenizer)
summary = mixing_summary(stats)
display(HTML(epoch_table_html(summary["per_epoch"])))
print("mean tokens per quality:", summary["mean_tokens"], "| mean searches:", summary["mean_searches"],
      "| sources:", summary["sources"], "| first-turn samples:", summary["first_turn_samples"])
fig = data_figure(stats)
save_figure(fig, run_dir, "data")
metrics.update(summary)
fig

# %% [markdown]
# ## Bringing ReSearch / ZeroSearch / Search-R1 data
#
# RL prompts from the field come in the veRL layout (`prompt`, `reward_model.ground_truth`, `extra_info`),
# as jsonl or parquet; `load_rl_prompts` reads both into the same records.

# %%
root = shared_data_dir()
if root is not None:
    rl = load_rl_prompts(root / "musique/test.jsonl", limit=3)
    for ex in rl:
        print(ex.source, "|", ex.question, "->", ex.answers)
    metrics["rl_prompts_example"] = len(rl)
else:
    print("benchmark data folder not found (KUNLUNLAB_DATA or ../shared/data)")

# %%
if run_dir is not None:  # always set: notebook_run_dir
    with (run_dir / "trajectories.jsonl").open("w") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict()) + "\n")
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
metrics["mean_tokens"]

# %% [markdown]
# ## What this run showed
#
# Read back from this run's `metrics.json`.

# %%
shown = json.loads((run_dir / "metrics.json").read_text())
epochs = shown["per_epoch"]
first, last = min(epochs, key=int), max(epochs, key=int)
print(f"{shown['trajectories']} SFT trajectories over {len(epochs)} epochs; sources {shown['sources']}")
print(f"epoch {first}: {epochs[first].get('hq', 0)} high-quality, {epochs[first].get('noisy', 0)} noisy; "
      f"epoch {last}: {epochs[last].get('hq', 0)} high-quality, {epochs[last].get('noisy', 0)} noisy")
print("mean tokens per quality:", shown.get("mean_tokens"), "| mean searches:", shown.get("mean_searches"))

# %% [markdown]
# ## Exercises
#
# 1. Set `overrides = {"mixing.hq_share_start": 1.0}`: every epoch is high-quality. What happens to the noisy
#    share per epoch, and which behaviour (recovering from a distractor) does SFT then never see?
# 2. Move the turning point, `{"mixing.turning_epoch": 1}`: compare the schedule figure with eqs. (14)–(16).
# 3. Set `{"mixing.quote_evidence": True}`: how much longer do trajectories get, and where do the extra tokens sit?
# 4. Which noise kind adds the most tokens per trajectory, and why does background noise add none to the
#    model's own text?
