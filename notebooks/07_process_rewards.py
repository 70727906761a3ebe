# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 07 · Process-supervised training (ReasonRAG) and a search budget (FrugalRAG) against DAPO, from one SFT checkpoint
#
# **What this notebook shows.** KunLunBaizeRAG's stage 2 (notebook 04) is *outcome* RL: DAPO gives every
# trajectory one number, its dual-mode reward, and the whole trajectory is pushed up or down by it. Two
# recipes from the agentic-RAG literature change *what* the model is rewarded for after the same format cold
# start, and this notebook trains each of them from **one SFT checkpoint** and compares them on the same
# held-out questions:
#
# | variant | after the SFT checkpoint | overrides (beside `model=<ref>/sft/final sft.enabled=false eval.before=false`) |
# |---|---|---|
# | SFT only | nothing: the checkpoint as it is | `dapo.enabled=false` |
# | DAPO | notebook 04's stage 2: outcome RL | the reference run itself (`ref_run`), else `dapo.steps=dapo_steps` |
# | ReasonRAG | tree search over steps → step preference pairs → DPO (process supervision) | `prl.enabled=true prl.questions prl.mcts.iterations prl.mcts.children_per_node prl.dpo.learning_rate dapo.enabled=false` |
# | DAPO + budget | DAPO whose reward also scores *when the agent stopped searching* (FrugalRAG) | `rewards.w_budget=budget_weight dapo.steps=dapo_steps` |
#
# Every variant is a `TrainingRun` (`kunlunlab/training/pipeline.py`) in its own folder under `run_dir`, built
# with `run_config(config, overrides, smoke)`; every stage resumes, so running the notebook again on the same
# `run_dir` reads finished variants back instead of training them again. `make run` passes notebook 04's run
# folder as `ref_run`; without one the notebook first trains an SFT-only run itself (`run_dir/sft`, the same
# config with `dapo.enabled=false`), whose evaluation after SFT is then the "SFT only" row.
#
# **What is compared.** EM, F1 and searches per question on the held-out synthetic questions and the held-out
# HotpotQA half, each variant's EM difference to DAPO with its paired-bootstrap interval (notebook 06 explains
# it; `compare_runs` pairs the runs by question id); what each variant *costs* (searches and generated tokens
# per question at inference, seconds of training after SFT); the two DAPO runs' rollout curves; the
# preference pairs ReasonRAG's tree search found; and one explored tree, step by step.
#
# At this scale (a 135M model, a few optimizer steps, tens of held-out questions) most intervals will
# include zero: the honest reading is then "no measurable difference at this size", and what the notebook
# does show reliably is the machinery and the costs.

# %% tags=["parameters"]
# Parameters (papermill overrides these)
ref_run = None            # notebook 04's training run folder (make run passes it); None: train an SFT-only run here
config = "experiments/configs/training/train_embedded_cpu.json"   # relative to the repository root, or absolute
prl_questions = 4         # ReasonRAG: training questions searched as trees
mcts_iterations = 2       # selections per tree
children_per_node = 3     # sampled steps per expansion
dpo_learning_rate = 5e-6  # ReasonRAG's DPO stage
budget_weight = 0.5       # FrugalRAG: w_budget, the weight of the search-budget term in the DAPO reward
budget_extra = "past_stop"  # which searches the budget term charges: "past_stop" (FrugalRAG's) or "redundant"
flat_includes_budget = False  # DAPO + budget: a group of equal accuracy but unequal budget scores stays in the loss
dapo_steps = None         # DAPO + budget's optimizer steps; None: the config's dapo.steps, as notebook 04's DAPO
dapo_learning_rate = None   # None: the config's (dapo.learning_rate); set, it applies to both DAPO variants
sft_overrides = {}        # without ref_run: config overrides of the SFT trained here, shared by every variant
variant_hotpot = False    # also evaluate the variants on the held-out HotpotQA questions (about 2 min more each)
smoke = False
device = "auto"           # where the variants train and generate: auto (CUDA when present), cpu, cuda, cuda:N
run_dir = None            # None: a new experiments/runs/<timestamp>-07_process_rewards folder

# %%
import gc
import json
from pathlib import Path

from IPython.display import HTML, display

from kunlunlab.paths import PROJECT_ROOT, notebook_run_dir
from kunlunlab.studies.training_variants import cost_table, reference_mismatch, run_costs, train_variant
from kunlunlab.training.pipeline import TrainingRun, run_config
from kunlunlab.training.preferences import read_preferences
from kunlunlab.training.records import compare_runs, training_logs
from kunlunlab.viz import (dapo_runs_figure, pair_stats, pair_stats_figure, pair_stats_table, save_figure, table_html,
                           tree_html)

if smoke:
    prl_questions, mcts_iterations, children_per_node, dapo_steps = 2, 2, 2, 1
if dapo_steps is None:
    dapo_steps = run_config(config, {}, smoke=smoke).dapo.steps
if ref_run and (sft_overrides or dapo_learning_rate is not None):
    raise ValueError("sft_overrides and dapo_learning_rate shape the SFT and DAPO trained here: pass them without "
                     "ref_run (whose SFT and DAPO are fixed)")
n_resamples = 200 if smoke else 2000
run_dir = notebook_run_dir(run_dir, "07_process_rewards")
FOLDERS = {"SFT only": "sft_only", "DAPO": "dapo", "ReasonRAG": "reasonrag", "DAPO + budget": "dapo_budget"}
folders: dict[str, Path] = {}
notes: dict[str, str] = {}
untrained: dict[str, str] = {}   # variants that could not be trained: label -> why
print("run folder:", run_dir)

# %% [markdown]
# ## The shared starting point: one SFT checkpoint
#
# With `ref_run` the checkpoint is notebook 04's `sft/final`, the model its DAPO stage started from, and the
# reference run's own evaluation after DAPO is the "DAPO" row. The notebook first checks that the reference
# was trained with a config whose held-out questions are the ones the variants will be evaluated on (the same
# world, seeds and sizes: `kunlunlab/studies/training_variants.py::reference_mismatch`); a difference there would
# make the comparison meaningless, so it stops before training anything. Without `ref_run` the SFT stage runs
# here, with the same config and no DAPO.

# %%
base_overrides = {**sft_overrides, "device": device, "dapo.enabled": False, "eval.before": False}
if ref_run:
    ref = Path(ref_run)
    if not ref.is_absolute() and not ref.exists():
        ref = PROJECT_ROOT / ref
    sft_final = ref / "sft" / "final"
    for need, what in ((sft_final / "config.json", "an SFT model (sft/final)"),
                       (ref / "dapo" / "final" / "config.json", "a DAPO model (dapo/final)"),
                       (ref / "eval_after_world.jsonl", "its evaluation after training"),
                       (ref / "train_config.json", "its train_config.json")):
        if not need.is_file():
            raise FileNotFoundError(f"ref_run {ref} lacks {what} ({need}): pass a finished notebook-04 training run")
    ref_cfg = json.loads((ref / "train_config.json").read_text())
    heldout_diff, other_diff = reference_mismatch(ref_cfg, run_config(config, base_overrides, smoke=smoke).to_dict())
    if heldout_diff:
        raise ValueError(f"ref_run {ref} was trained with other held-out questions (differs in {heldout_diff}) than "
                         f"config={config!r} smoke={smoke} gives: the variants could not be compared with it")
    if other_diff:
        print(f"note: the reference run's config differs from this notebook's in {other_diff}")
        notes["DAPO"] = f"notebook 04's run; its config differs in {', '.join(other_diff)}"
    ref_steps = ref_cfg.get("dapo", {}).get("steps")
    if ref_steps != dapo_steps:
        print(f"note: the reference ran {ref_steps} DAPO steps, DAPO + budget runs dapo_steps={dapo_steps}")
    folders["DAPO"] = ref
    notes.setdefault("DAPO", f"notebook 04's run ({ref_steps} DAPO steps from the same SFT checkpoint)")
else:
    base_dir = run_dir / "sft"
    base = TrainingRun(run_config(config, base_overrides, smoke=smoke), base_dir, progress=print)
    base.sft()
    base.evaluate("after")
    base.finish()
    del base
    gc.collect()
    sft_final = base_dir / "sft" / "final"
    folders["SFT only"] = base_dir
    notes["SFT only"] = "the SFT run trained here, evaluated right after SFT"
common = {**sft_overrides, "device": device, "model": str(sft_final.resolve()), "sft.enabled": False,
          "eval.before": False}
if dapo_learning_rate is not None:
    common["dapo.learning_rate"] = dapo_learning_rate
if not variant_hotpot:  # world only: the HotpotQA comparison is skipped (no held-out HotpotQA records)
    common["eval.hotpot_questions"] = 0
print("SFT checkpoint:", sft_final)

# %% [markdown]
# ## Running a variant
#
# `train_variant` (`kunlunlab/studies/training_variants.py`) runs the stages of `train()` in order (SFT is
# switched off, so it is a no-op; PRL and DAPO run when the variant enables them; then the evaluation after
# training and `training_summary.json`). It
# differs from `train()` in one place: `TrainingRun.prl` raises when the tree search found **no preference
# pair** (every explored sibling scored the same, which an untrained or tiny model easily produces: all its
# answers are wrong, so every value is 0). DPO then has nothing to learn from and the model *is* the SFT
# checkpoint; evaluating it as "ReasonRAG" would report the SFT numbers under another name. So that variant
# is not evaluated, and the tables keep its row with the reason. Any other error stops the notebook.

# %%
def add_variant(name: str, extra: dict) -> None:
    if name in folders:  # the reference run or the SFT run trained above
        print(f"{name}: {folders[name]} ({notes.get(name, '')})")
        return
    folder = run_dir / FOLDERS[name]
    reason = train_variant(run_config(config, {**common, **extra}, smoke=smoke), folder,
                           progress=lambda line: print(f"{name}: {line}"))
    if reason:
        untrained[name] = reason
        print(f"{name}: {reason}")
    folders[name] = folder
    gc.collect()


# %% [markdown]
# ## SFT only
#
# The checkpoint itself, evaluated with the same harness and budgets: what stage 2 starts from.

# %%
add_variant("SFT only", {"dapo.enabled": False})

# %% [markdown]
# ## DAPO: outcome reward
#
# Notebook 04's stage 2 (its markdown has the objective): for each question a group of $G$ trajectories, each
# scored once at the end with the dual-mode reward $R_i$ (eqs. 17–18), group-normalised advantages
# $\hat A_i = (R_i - \operatorname{mean} R)/\operatorname{std} R$, the clipped token-level policy gradient.
# Every token of a trajectory gets the same $\hat A_i$: a good first search in a trajectory that ended with a
# wrong answer is pushed down with it. That is the credit-assignment problem process supervision addresses.

# %%
add_variant("DAPO", {"dapo.steps": dapo_steps})

# %% [markdown]
# ## ReasonRAG: process supervision by tree search, step values and DPO
#
# ReasonRAG (Zhang et al., *Process vs. Outcome Reward: Which is Better for Agentic RAG Reinforcement
# Learning*, arXiv 2505.14069) rewards **steps** instead of trajectories
# (`kunlunlab/training/process_rewards.py`, `kunlunlab/training/preferences.py`, `kunlunlab/training/dpo.py`).
# A step is one model turn of the protocol: `<think>…</think><search>…</search>` or an answer.
#
# **Tree search (MCTS).** For each of the first `prl_questions` training questions the SFT model grows a tree
# whose root is the prompt (with RDRA's background, as the whole agent sees it). Each of the
# `mcts_iterations` iterations walks down by UCT,
#
# $$c^\star = \arg\max_{c \in \text{children}(s)} \Big[ V(c) + c_\text{uct} \sqrt{\frac{\ln N(s)}{N(c)}} \Big]
# \qquad (\text{unvisited children first}),$$
#
# samples `children_per_node` next steps at the leaf it reaches (a search step gets its `<result>` block
# appended by the environment, exactly as in the rollouts), values them and backs the values up.
#
# **Shortest Path Reward Estimation (SPRE).** A step that answers at depth $d$ (model turns below the prompt)
# is worth its F1 against the gold answers, discounted per step; a branch that ends without an answer is
# worth 0; an inner step is worth the visit-weighted mean of its children:
#
# $$V(s) = \mathrm{F1}(\hat a_s, G)\,\alpha^{d(s)} \ \ (s \text{ answers}), \qquad
# V(s) = \frac{\sum_{c} N(c)\, V(c)}{\sum_{c} N(c)} \ \ (s \text{ inner}), \qquad \alpha = 0.9 .$$
#
# The discount $\alpha^{d}$ is what makes it a *shortest-path* estimate: of two correct paths the shorter is
# worth more, so the preferences teach the model to stop searching once it can answer. ReasonRAG estimates an
# open leaf by rollouts; the workbench's default (`prl.mcts.value_source="gold"`, deterministic and cheap on
# the synthetic world) values it by the share of gold supporting passages retrieved on its path, discounted
# as if it answered at the next step: $\hat V(s) = \mathrm{cov}(s)\,\alpha^{d(s)+1}$ (`rollout` and `judge` are
# the alternatives).
#
# **Step preference pairs.** Under every expanded step, two sibling steps with different text whose values
# differ by at least `min_gap` (0.01) form a pair: the higher one is *chosen* ($y_w$), the lower *rejected*
# ($y_l$), and the prompt $x$ is everything before them (question, background, earlier steps and their
# results). Pairs across actions (search more vs answer now) are kept: they carry the "when to stop" signal.
#
# **DPO.** The policy $\pi_\theta$ (initialised from the SFT checkpoint) is trained against a frozen copy of
# it, $\pi_\text{ref}$, with the sigmoid DPO loss on the step tokens only:
#
# $$\mathcal{L}_\text{DPO}(\theta) = -\,\mathbb{E}_{(x, y_w, y_l)}\Big[\log \sigma\Big(
# \beta \log\frac{\pi_\theta(y_w \mid x)}{\pi_\text{ref}(y_w \mid x)}
# - \beta \log\frac{\pi_\theta(y_l \mid x)}{\pi_\text{ref}(y_l \mid x)}\Big)\Big], \qquad \beta = 0.3$$
#
# ($\beta$ = `prl.dpo.beta`, ReasonRAG's value; the learning rate is `dpo_learning_rate`). Larger $\beta$ keeps
# the policy closer to the reference. DAPO is off in this variant: it is ReasonRAG's recipe alone.
#
# Departures from ReasonRAG, on purpose (the module docstring has them all): steps are this protocol's turns,
# not ReasonRAG's three actions; open leaves are valued by gold coverage by default; the answer is forced by
# the environment after `max_depth` turns.

# %%
add_variant("ReasonRAG", {"prl.enabled": True, "prl.questions": prl_questions,
                          "prl.mcts.iterations": mcts_iterations, "prl.mcts.children_per_node": children_per_node,
                          "prl.dpo.learning_rate": dpo_learning_rate, "dapo.enabled": False})
prl_dir = folders["ReasonRAG"] / "prl"
mcts_stats = json.loads((prl_dir / "mcts_stats.json").read_text()) if (prl_dir / "mcts_stats.json").is_file() else {}
print(json.dumps(mcts_stats, indent=1))

# %% [markdown]
# ## DAPO + budget: FrugalRAG's search budget in the reward
#
# FrugalRAG (arXiv 2507.07634) asks for the same accuracy with **fewer searches**: every search costs latency,
# and an agent that keeps searching after it has found the evidence spends it for nothing. The workbench's
# reading of its budget reward (`kunlunlab/training/rewards.py::budget_score`): with $R_k$ the recall of the
# gold supporting passages after $k$ searches ($k = 0$: RDRA's background alone), $n$ the searches the
# trajectory made and $k^\star$ the first search at which the recall reached its maximum (the *optimal stop*),
#
# $$R_k = \frac{|D_{\le k} \cap G|}{|G|}, \qquad k^\star = \min\{k : R_k = \max_j R_j\}, \qquad
# b = \max\Big(-1,\ \begin{cases} 1 - \lambda\,(n - k^\star) & \text{if } R_{k^\star} = 1 \\
# -(1 - R_{k^\star}) - \lambda\,(n - k^\star) & \text{otherwise} \end{cases}\Big)$$
#
# with $\lambda$ = `rewards.budget_penalty` (0.25) per search past the optimal stop. Stopping right after the
# evidence is complete earns 1; every extra search costs $\lambda$; stopping without all the evidence never
# earns anything positive, so the term cannot be gamed by not searching. It enters the DAPO reward as one
# more weighted component,
#
# $$R_i = R^\text{dual}_i + w_\text{budget}\, b_i, \qquad w_\text{budget} = \texttt{budget\_weight},$$
#
# and is left out for a question without gold passage ids. (The paper's exact formula is not reproduced; this
# is the shape its text describes.) Everything else is the DAPO run above.
#
# `budget_extra = "redundant"` (a departure) charges $\lambda$ for every search that raised the recall of no gold
# passage, $e = |\{k \ge 1 : R_k \le R_{k-1}\}|$ instead of $n - k^\star$: with RDRA's background the agent
# also wastes searches *before* the optimal stop, re-searching a page the background already shows (a third of
# all searches of make run's SFT checkpoint), which FrugalRAG's $n - k^\star$ never charges. The cost table
# below has both counts per variant. A policy can only learn to skip such a search if its SFT data ever skip
# one: `sft_overrides = {"mixing.background_facts": 0.5}` (without `ref_run`) trains the shared SFT checkpoint
# with half of the questions read from the background, FrugalRAG's first stage in spirit (both behaviours in
# the policy), and the budget reward then chooses between them. Measured so (README, "Process rewards and the
# search budget"; `experiments/configs/notebook07_frugal.json`, 40 held-out world questions): DAPO alone took
# that SFT checkpoint from 2.42 to 1.93 searches per question and from EM 22.5 to 40.0; with the budget term
# added it gave the same 40 answers. At this scale the outcome reward already prefers the short path once the
# policy offers it. Part of the budget's signal never reaches the loss: DAPO's dynamic sampling drops groups
# of equal accuracy, whatever their budget scores. `flat_includes_budget = True` keeps them; measured so, the
# policy searched more (2.55 per question against 1.93, same EM 40.0), because the groups it keeps are mostly
# all-wrong ones, where the budget term rewards finding more gold evidence (README). From a stronger SFT
# checkpoint (world EM 75.0, whose groups are mostly all-right) it does cut searches, by a quarter, at −8 EM
# (n = 100): the policy learns to read hop 1 from the background instead of re-fetching it, and the 135M
# model misreads the background more often than a search result (README, "The budget term where the groups
# are right").

# %%
add_variant("DAPO + budget", {"rewards.w_budget": budget_weight, "rewards.budget_extra": budget_extra,
                              "dapo.steps": dapo_steps, "dapo.flat_includes_budget": flat_includes_budget})

# %% [markdown]
# ## The comparison: accuracy on the held-out questions, against DAPO
#
# One row per variant (`compare_runs(runs, "DAPO", dataset)`): EM, F1 and searches per question in percent /
# counts, and the EM difference to DAPO with its paired-bootstrap 95 % interval. A variant that could not be
# trained keeps its row, empty, with the reason.

# %%
evaluated = {name: folder for name, folder in folders.items() if name not in untrained}
tables, accuracy_rows = {}, {}
for dataset, title in (("world", "synthetic world"), ("hotpotqa_distractor", "HotpotQA distractor")):
    try:
        header_c, rows_c = compare_runs(evaluated, "DAPO", dataset, n_resamples=n_resamples, seed=0)
    except FileNotFoundError as err:  # no HotpotQA data: no held-out HotpotQA records
        print(f"{dataset}: {err}")
        continue
    rows_c = [row[:-1] + [f"{row[-1]}; {notes[row[0]]}" if row[0] in notes else row[-1]] for row in rows_c]
    rows_c += [[name, None, None, None, None, "–", why] for name, why in untrained.items()]
    accuracy_rows[dataset] = rows_c
    tables[f"Variants vs DAPO on {title} (held-out)"] = {"header": header_c, "rows": rows_c}
    display(HTML(f"<h4>{title}</h4>" + table_html(header_c, rows_c)))

# %% [markdown]
# ## What each variant costs
#
# `kunlunlab/studies/training_variants.py::cost_table`, from each run folder: searches (all of them, and the
# **agent's own**: less the queries RDRA sends before the first turn, which no reward can cut; those **past the
# optimal stop** $n - k^\star$, what FrugalRAG's term charges; and the **redundant** ones, which raised the recall
# of no gold passage, before or after the stop), the **search floor** (the fewest searches that complete each
# question's gold evidence given its RDRA background: one per dependency stage the background lacks, a
# comparison's two pages in one multi-query search; `searches − floor` is all a budget can cut without answering
# from unread evidence) and **generated tokens per
# question** at inference on the held-out world questions (the agent's own tokens: the trajectory's mask, so
# `<result>` blocks and STIE's feedback do not count, nor RDRA's plan), and the **training seconds after
# SFT** (every stage but SFT in `state.json`; ReasonRAG's include its tree search, shown separately; a search
# that found no pairs still cost its seconds). A budget reward that works shows up here as fewer searches at an
# EM difference whose interval includes zero.

# %%
header_cost, rows_cost = cost_table(folders, "world", {**notes, **untrained})
tables["Cost per variant (held-out world)"] = {"header": header_cost, "rows": rows_cost}
display(HTML(table_html(header_cost, rows_cost)))

# %% [markdown]
# ## The two DAPO runs during training
#
# The rollout log of each DAPO step (`training_logs(run)["rollouts"]`): mean shaped reward (the budget run's
# includes $w_\text{budget} b$, so its reward is not on the same scale), accuracy of the sampled trajectories,
# searches per rollout, and the budget term itself where it was scored.

# %%
rollouts = {name: training_logs(folders[name])["rollouts"] for name in ("DAPO", "DAPO + budget")
            if name in folders and name not in untrained}
fig = dapo_runs_figure(rollouts)
save_figure(fig, run_dir, "dapo_runs")
fig

# %% [markdown]
# ## ReasonRAG's preference pairs
#
# Which decisions the tree search turned into training signal: pairs by action pair (*chosen ≻ rejected*:
# `search≻answer` says searching more beat answering now, `answer≻search` the opposite) and by depth, with the
# mean value gap $V(y_w) - V(y_l)$ (how strongly the pair prefers). Pairs whose two steps have the same action
# teach *which* query or answer, cross-action pairs teach *when to stop*.

# %%
pairs = (read_preferences(prl_dir / "preferences.jsonl")
         if (prl_dir / "preferences.jsonl").is_file() else [])
stats = pair_stats(pairs)
header_p, rows_p = pair_stats_table(stats)
tables["ReasonRAG preference pairs"] = {"header": header_p, "rows": rows_p}
if not pairs:
    print("the tree search found no preference pairs:", untrained.get("ReasonRAG", "see mcts_stats above"))
fig = pair_stats_figure(pairs)
save_figure(fig, run_dir, "preference_pairs")
fig

# %% [markdown]
# ## One explored tree
#
# The tree with the most explored steps (`prl/trees.jsonl`), as nested collapsible steps: each step's
# depth, action, visits $N$, value $V$, its SPRE reward (an answer) or its estimate (an open leaf), its text,
# queries and retrieved passage ids, its answer and F1, and the result block the environment appended. ★
# marks the best-valued sibling: the step a preference pair would choose. The same view is written to
# `tree.html` in the run folder.

# %%
trees = ([json.loads(line) for line in (prl_dir / "trees.jsonl").read_text().splitlines() if line.strip()]
         if (prl_dir / "trees.jsonl").is_file() else [])
if trees:
    tree = max(trees, key=lambda t: t.get("n_nodes", 0) if isinstance(t, dict) else 0)
    page = tree_html(tree)
    (run_dir / "tree.html").write_text(f"<!doctype html><html><meta charset='utf-8'><body>{page}</body></html>")
    display(HTML(page))
else:
    print("no trees.jsonl: the ReasonRAG variant did not search")

# %%
def variant_numbers(name: str) -> dict:
    out = {"folder": str(folders[name]), "note": untrained.get(name) or notes.get(name),
           "costs": run_costs(folders[name], "world")}
    for dataset, rows in accuracy_rows.items():
        row = next(r for r in rows if r[0] == name)
        out[dataset] = dict(zip(("n", "em", "f1", "searches", "delta_em_vs_dapo", "reading"), row[1:]))
    return out


metrics = {"ref_run": str(ref_run) if ref_run else None, "sft_checkpoint": str(sft_final),
           "parameters": {"prl_questions": prl_questions, "mcts_iterations": mcts_iterations,
                          "children_per_node": children_per_node, "dpo_learning_rate": dpo_learning_rate,
                          "budget_weight": budget_weight, "budget_extra": budget_extra, "dapo_steps": dapo_steps,
                          "flat_includes_budget": flat_includes_budget,
                          "dapo_learning_rate": dapo_learning_rate, "sft_overrides": sft_overrides},
           "tables": tables, "variants": {name: variant_numbers(name) for name in folders},
           "untrained": untrained, "mcts": mcts_stats, "preference_pairs": stats}
(run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2, default=str))
{name: (v.get("world") or {}).get("em") for name, v in metrics["variants"].items()}

# %% [markdown]
# ## What this run showed
#
# Read back from this run's `metrics.json`.

# %%
shown = json.loads((run_dir / "metrics.json").read_text())
for name, v in shown["variants"].items():
    world = v.get("world") or {}
    print(f"{name:14} world EM {world.get('em')}  searches/question {world.get('searches')}  "
          f"Δ EM vs DAPO {world.get('delta_em_vs_dapo')}")

# %% [markdown]
# ## Exercises
#
# 1. Raise `budget_weight` to 2.0: do searches per question fall further, and what does EM pay for it?
# 2. Set `budget_extra = "redundant"`: the budget now charges searches that found nothing new, before the optimal
#    stop too. Compare searches per question with FrugalRAG's `past_stop`.
# 3. Set `flat_includes_budget = True`: groups whose answers are all right but whose search counts differ now stay
#    in DAPO's loss. Does the budget bind sooner?
# 4. Raise `mcts_iterations` to 6: how many more preference pairs does ReasonRAG get, and does its EM move?
