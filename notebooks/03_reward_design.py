# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 03 · Reward design: dual-mode rewards for short and long answers
#
# **What this notebook shows.** The RL stage (DAPO) scores each trajectory with a **dual-mode** reward
# (paper §2.3, eqs. 17–18): one formula when the model closes with a short answer, another when it writes a
# long one, plus DAPO's soft penalty on over-long responses. You will see every component on hand-written
# responses that each isolate one behaviour, change the weights and watch the ranking of those responses
# change, and try your own response in an explorer.
#
# **Why it matters.** The reward is the only thing RL optimises. A component that can be collected without a
# correct answer will be collected: the weights decide what the policy learns to prefer.
#
# Code: `kunlunlab/training/rewards.py` (parsing, components, eqs. 17–18, the TRL reward functions),
# `kunlunlab/studies/reward_cases.py` (the hand-written cases), `kunlunlab/viz/data_views.py` (the read-outs).

# %% tags=["parameters"]
# Parameters (papermill overrides these)
w_format = 0.2
w_length = 0.1
w_accuracy = 1.0
w_structure = 0.2
accuracy = "em"              # "em" or "f1"
short_target_words = 6
long_min_words = 15
long_max_words = 120
overlong_max_tokens = 512
overlong_buffer = 128
smoke = False
run_dir = None

# %%
import json
from dataclasses import asdict

from kunlunlab.paths import notebook_run_dir
from IPython.display import HTML, display
from kunlunlab.training.rewards import RewardConfig
from kunlunlab.studies.reward_cases import REWARD_CASES, case_rows
from kunlunlab.viz import reward_components_figure, reward_table_html, save_figure
from kunlunlab.viz.apps import reward_explorer
from kunlunlab.viz.data_views import reward_rankings

run_dir = notebook_run_dir(run_dir, "03_reward_design")  # None: a new experiments/runs folder
cfg = RewardConfig(w_format=w_format, w_length=w_length, w_accuracy=w_accuracy, w_structure=w_structure,
                   accuracy=accuracy, short_target_words=short_target_words, long_min_words=long_min_words,
                   long_max_words=long_max_words, overlong_max_tokens=overlong_max_tokens, overlong_buffer=overlong_buffer)
metrics = {"config": asdict(cfg)}

# %% [markdown]
# ## The reward (eqs. 17–18)
#
# The model ends with `<short_answer>\boxed{…}</short_answer>` or `<long_answer> summary \boxed{…}
# </long_answer>`; the mode is the one it chose. Written as `kunlunlab/training/rewards.py` computes them
# (`score`; the workbench's reading of the paper's eqs. 17–18 and of its description of each component):
#
# $$R_\text{short} = w_f\, r_\text{format} + w_l\, r_\text{length} + w_a\, r_\text{acc} \tag{17}$$
#
# $$R_\text{long} = w_f\, r_\text{format} + w_l\, r_\text{length} + w_a\, r_\text{acc} + w_s\left(r_\text{struct} - 1\right) \tag{18}$$
#
# and the total adds DAPO's soft overlong penalty with weight 1: $R = R_\text{mode} + r_\text{overlong}$. Every
# component lies in $[0, 1]$ (the overlong term in $[-1, 0]$):
#
# * **format**: $r_\text{format} = 1$ for an answer tag with a boxed answer and no protocol issue;
#   $\max\left(0.1,\ 0.5 - 0.1\,(n - 1)\right)$ for an answer with $n \ge 1$ distinct issues (missing box, text after
#   the answer, unclosed or nested tags, an empty query); $0$ with no answer at all.
# * **length**, through a band that is 1 inside $[a, b]$ and falls linearly to 0 at $a/2$ and at $2b$:
#
#   $$\operatorname{band}(v; a, b) = \begin{cases} \max\left(0, \dfrac{v - a/2}{a/2}\right) & v < a \\ 1 & a \le v \le b \\ \max\left(0, 1 - \dfrac{v - b}{b}\right) & v > b \end{cases}$$
#
#   short mode: $r_\text{length} = \operatorname{band}(\text{words in the boxed answer}; 0, t)$ with $t$ =
#   `short_target_words`; long mode: $\operatorname{band}(\text{words in the summary}; \ell_\text{min}, \ell_\text{max})$
#   with `long_min_words` and `long_max_words`.
# * **accuracy**: exact match of the boxed answer against the gold aliases (or token F1 with `accuracy="f1"`). On a
#   *summary-oriented* question ("Describe how X is connected to Y.", whose gold is the chain's facts $F$ and the
#   link in the box) it is $\tfrac12\,\text{EM} + \tfrac12\,\text{cov}$, with the fact coverage
#   $\text{cov} = \frac{1}{|F|}\sum_{f \in F} \frac{|\text{tokens}(f) \cap \text{tokens}(\text{answer})|}{|\text{tokens}(f)|}$
#   (a workbench choice: the paper grades long answers with its LLM judge and gives no formula).
# * **structure** (long mode only): the share of four checks passed: the summary holds text besides the box,
#   the box closes the summary, the reasoning sits in closed `<think>` blocks, no tag is unclosed or nested.
# * **overlong** (DAPO), on $L$, the model's own tokens (retrieved results never count):
#
#   $$r_\text{overlong}(L) = \begin{cases} 0 & L \le L_\text{max} - L_\text{buf} \\ \dfrac{(L_\text{max} - L_\text{buf}) - L}{L_\text{buf}} & L_\text{max} - L_\text{buf} < L \le L_\text{max} \\ -1 & L > L_\text{max} \end{cases}$$
#
# **Why is the format term small next to accuracy?** With $w_a$ dominant, a correct answer with a formatting slip
# still beats a perfectly formatted wrong one, so the policy cannot collect most of its reward by emitting
# well-formed wrong answers. The format term is still there because the rollout engine can only execute
# searches it can parse: among responses of equal accuracy it prefers the one that follows the protocol.
#
# **Why is structure a penalty, $w_s(r_\text{struct} - 1)$, and not a bonus?** A well-structured long answer then
# reaches exactly $R_\text{short}$'s maximum, so choosing the long mode never earns reward by itself; with a
# bonus, a box-only "long answer" out-scored a correct short one.
#
# **Why a soft overlong ramp?** A linear penalty over the last $L_\text{buf}$ tokens tells the model that it is
# getting long before a response is cut off, instead of a cliff at $L_\text{max}$.
#
# Rewards read the trajectory's **parse record** (`parse_completion`): retrieved `<result>` blocks are the
# environment's and never count; malformed tags score as the protocol defines. Each component is its own TRL
# reward function (`reward_functions`), so `GRPOConfig.reward_weights` are the $w$'s and TRL logs every component.

# %% [markdown]
# ## Hand-written cases
#
# Each case isolates one behaviour: correct, verbose, wrong, malformed (unclosed `<query>` and `<think>`),
# missing `\boxed`, no answer at all, over-long reasoning, two long answers (one with a proper summary, one
# with only the box), and a summary-oriented question answered in each mode: the long answer states both facts
# and earns the whole accuracy term, the bare box covers only the names and loses about a third of it, which is
# what makes the long mode worth choosing there (and only there). The table shows each raw component; the chart
# stacks the weighted ones, with the total as a diamond.

# %%
rows = case_rows(REWARD_CASES, cfg)
display(HTML(reward_table_html(rows)))
fig = reward_components_figure(rows)
save_figure(fig, run_dir, "reward_cases")
metrics["cases"] = {r["name"]: r["total"] for r in rows}
fig

# %% [markdown]
# ## Explorer
#
# Pick a case or write your own trajectory (the text after the assistant's opening `<think>`), set the gold
# answer (aliases separated by `|`) and the weights; the table shows every component as the trainer would see
# it, and the line under it what the parser read.

# %%
explorer = reward_explorer(cfg)   # kunlunlab/viz/apps.py; the same widget `make app` serves as a Voilà app
display(explorer)

# %% [markdown]
# ## Weights change the ranking
#
# The same cases ranked by total reward, highest first, under the default weights and under format-heavy
# weights ($w_f = 1.5$, $w_a = 0.5$). Compare where `malformed` (correct, but with protocol issues) and `wrong`
# (well formed, wrong answer) sit in each: this is the trade-off the weights set.

# %%
rankings = reward_rankings({"default": {}, "format-heavy": {"w_format": 1.5, "w_accuracy": 0.5}}, cfg)
for label, order in rankings.items():
    print(f"{label:13}", " > ".join(order))
    metrics[f"ranking_{label}"] = order
if run_dir is not None:
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))

# %% [markdown]
# ## What this run showed
#
# Read back from this run's `metrics.json`.

# %%
shown = json.loads((run_dir / "metrics.json").read_text()) if run_dir else metrics
best, worst = max(shown["cases"], key=shown["cases"].get), min(shown["cases"], key=shown["cases"].get)
print(f"highest total: {best} ({shown['cases'][best]:.3f}); lowest: {worst} ({shown['cases'][worst]:.3f})")
for label in ("default", "format-heavy"):
    print(f"ranking under {label} weights:", " > ".join(shown[f"ranking_{label}"]))

# %% [markdown]
# ## Exercises
#
# 1. Set `accuracy = "f1"`: which cases gain partial credit, and does `verbose` now beat `wrong` by more?
# 2. Raise `w_format` to 1.0 and lower `w_accuracy` to 0.5: find the first case where a malformed but correct
#    answer loses to a well-formed wrong one. Would you train with those weights?
# 3. Lower `overlong_max_tokens` to 256: which case does overlong shaping now punish, and by how much?
# 4. In the explorer, write a long answer of 10 words: why does the long-answer mode (eq. 18) score it below a
#    short answer with the same box, and which parameter would change that?
