# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · Evaluation: the trained agent against the baselines (Table 2) and its ablations
#
# **What this notebook shows.** Does the agent that notebook 04 trained answer multi-hop questions better
# than the standard ways of using the same model with retrieval, and which of its mechanisms earn their
# place? It reproduces the *shape* of the paper's Table 2 (EM and LJ per dataset and method) and its
# ablations on whatever model it is given, each difference with an interval that says how sure we can be.
# It then opens the individual answers in a **trajectory browser**: a table of means says *that* a method
# wins or loses, one trajectory at a time says *why* (a search that never found the second hop, a loop that
# STIE broke or failed to break, an answer that was right but badly formatted).
#
# `make run` hands this notebook the model that notebook 04 trained (`model`); without one it evaluates the
# embedded, untrained SmolLM2-135M. The suite (`kunlunlab/studies/suite.py::run_suite`) runs every method on the
# same loaded model with the checkpoint's own agent settings (`kunlunlab_agent.json`: top-k, token budgets,
# RDRA, STIE, index kind and embedder), so budgets are equal across the table, and on questions training
# never saw: the held-out split of the training config for the synthetic world, the held-out half of the
# HotpotQA distractor sample, and the first `limit` questions of 2Wiki, MuSiQue and Bamboogle (searched in
# the 2Wiki paragraphs + HotpotQA contexts, an open corpus that does not cover every question).
#
# **Methods** (`kunlunlab/agent/methods.py`): Naive Generation (the question alone), Naive RAG (top-k
# passages, then answer), Iter-RetGen, IRCoT, Search-o1 (with its Reason-in-Documents step), and `kunlun` (RDRA background §2.1 →
# search-think agent → STIE over answer rounds §2.2).

# %% tags=["parameters"]
# Parameters (papermill overrides these)
model = None               # the trained checkpoint (make run passes notebook 04's); None: embedded, untrained
baseline_model = None      # the prompt baselines' model: None, the backbone train_config trained; "checkpoint", `model`
train_config = "experiments/configs/training/train_embedded_cpu.json"  # whose held-out split is evaluated
baselines = ["naive_gen", "naive_rag", "iter_retgen", "ircot", "search_o1"]
datasets = ["world", "world_summary", "hotpotqa_distractor"]  # make run's; add "2wikimultihopqa", "musique",
                           # "bamboogle" (searched in a corpus lacking most of their evidence; series_goal_sizes.json)
world_questions = 50       # held-out synthetic questions (make run's size, as notebook 04's; the larger run: 100)
summary_questions = 5      # held-out summary-oriented world questions (world_summary: the long-answer mode)
hotpot_questions = 5       # held-out HotpotQA distractor questions
limit = 5                  # questions of each other benchmark (make run: a smoke-sized cell, see the README)
ablations = ["−RDRA", "−STIE", "agent (−RDRA −STIE)"]
ablation_datasets = ["world"]
nlr = True                 # NLR rows: a router trained against a network tier over the world (local tier: half)
nlr_latency_ms = 150.0     # the network tier's added latency per request
judge = None               # LJ judge: a model (hub id / path) or, with judge_url, a served model's name
judge_url = None
index_kind = None          # None: the checkpoint's (kunlunlab_agent.json), else flat
embedder = None            # None: the checkpoint's, else the embedded all-MiniLM-L6-v2
device = "auto"            # where the checkpoint generates: auto (CUDA when present), cpu, cuda, cuda:N
retriever_url = None       # the benchmarks' searches through this retrieval service; None: their own corpora here
batch_size = 20            # questions per generation batch
rollout = {}               # the agent's budgets on every row ({"max_total_tokens": 512}); {}: the checkpoint's
training_runs = {}         # training ablations: label -> `kunlunlab train` run folder; the first is the reference
n_resamples = 2000
seed = 0
kept = "experiments/results/planfree_makerun"   # the kept full-size run of make run's recipe, shown beside this
                           # run's kunlun row (relative to the repository root; None: none)
smoke = False
run_dir = None             # None: a new experiments/runs/<timestamp>-06_evaluation folder

# %%
import json
from IPython.display import HTML, display
from kunlunlab.eval.compare import kept_beside_fresh
from kunlunlab.eval.metrics import exact_match, f1, normalize_answer
from kunlunlab.paths import PROJECT_ROOT, jsonl_path, notebook_run_dir, read_jsonl, shared_data_dir
from kunlunlab.training.records import compare_runs, heldout_records
from kunlunlab.studies.suite import MODES_TITLE, TABLE2_TITLE, SuiteConfig, ablation_title, run_suite, suite_tables
from kunlunlab.viz import method_bars, save_figure, table_html
from kunlunlab.viz.trajectory_browser import (record_html, runs_from_suite, stie_config_for, trajectories_html,
                                              trajectory_browser)

if smoke:
    baselines, datasets, world_questions, hotpot_questions, limit = ["naive_rag"], ["world", "hotpotqa_distractor"], 2, 1, 1
    datasets, summary_questions = datasets + ["world_summary"], 1
    ablations, n_resamples, nlr = ["−STIE"], 200, False
    index_kind = index_kind or "bm25"  # a dense index would embed the 2,000-passage world first (~60 s on 2 cores)
    rollout = {"max_total_tokens": 160, "max_turn_tokens": 32, **rollout}  # the smoke training's budgets
if shared_data_dir() is None:
    print("benchmark data folder not found: evaluating the synthetic world only")
run_dir = notebook_run_dir(run_dir, "06_evaluation")
print("model:", model or "embedded SmolLM2-135M-Instruct (untrained)")
cfg = SuiteConfig(model=model, baseline_model=baseline_model, train_config=train_config, baselines=tuple(baselines),
                  datasets=tuple(datasets),
                  world_questions=world_questions, summary_questions=summary_questions,
                  hotpot_questions=hotpot_questions, limit=limit,
                  ablations=tuple(ablations), ablation_datasets=tuple(ablation_datasets), nlr=nlr,
                  nlr_latency_ms=nlr_latency_ms, judge=judge, judge_url=judge_url, index_kind=index_kind,
                  embedder=embedder, device=device, retriever_url=retriever_url, rollout=rollout, batch_size=batch_size,
                  n_resamples=n_resamples, seed=seed)

# %% [markdown]
# ## Run every method on every dataset, then the ablations
#
# `run_suite` calls `kunlunlab/eval/harness.py::evaluate` once per (dataset, method) and writes one JSON
# record per question to `records/<dataset>.<method>.jsonl`: the question, the gold answers, the prediction,
# its `em`, `f1`, `acc`, `lj`, and the whole `trajectory` (every turn, every retrieved passage, the answer
# rounds). Everything below is computed from these records; the browser at the end reads them too.

# %%
result = run_suite(cfg, run_dir / "records")
print(f"{result.seconds} s")

# %% [markdown]
# ## The metrics, as implemented
#
# **Normalisation first** (`kunlunlab/eval/metrics.py::normalize_answer`, the SQuAD v1.1 rule): lower-case,
# drop punctuation, drop the articles *a, an, the*, collapse white space. Without it "The Eiffel Tower." and
# "Eiffel Tower" would count as different answers, and a method would be rewarded for formatting rather than
# knowing. Every score takes the best match over the gold aliases $G$.
#
# **Exact match** (`exact_match`): the normalised prediction $\hat a$ equals a normalised gold answer.
#
# $$\mathrm{EM}(\hat a, G) = \max_{g \in G}\ \mathbf{1}\big[\operatorname{norm}(\hat a) = \operatorname{norm}(g)\big]$$
#
# **Token F1** (`f1`): partial credit for overlapping words. With $\hat T$ and $T_g$ the multisets of
# normalised tokens of the prediction and of a gold answer,
#
# $$P = \frac{|\hat T \cap T_g|}{|\hat T|}, \qquad R = \frac{|\hat T \cap T_g|}{|T_g|}, \qquad
# \mathrm{F1}(\hat a, G) = \max_{g \in G} \frac{2PR}{P + R}\quad(0 \text{ when nothing overlaps}).$$
#
# As in the official HotpotQA script, when either side normalises to *yes*, *no* or *noanswer*, F1 is 1 only
# for an exact match: "no" against "no, never" is not half right. (`acc`, in the records too, asks whether a
# normalised gold answer appears inside the normalised prediction.)
#
# **LJ, the LLM judge** (`kunlunlab/eval/judge.py::LLMJudge`): a second model reads question, gold answers
# and prediction and replies *yes* or *no*; an empty prediction is 0 and an exact match is 1 without asking.
# LJ is the mean verdict:
#
# $$\mathrm{LJ} = \frac{1}{n}\sum_{i=1}^{n} J(q_i, G_i, \hat a_i), \qquad J \in \{0, 1\}.$$
#
# The judge **must not be the model under test**: a model grading its own answers shares the
# misunderstandings that produced them, so its verdicts are biased towards its own mistakes, and a small
# model is a poor grader anyway. So with no `judge` configured LJ is absent (–), never a number from the
# answering model; `judge="same"` exists only as an explicit opt-in and its summary is marked
# `self_judged`. The EM/F1 examples below are computed by the functions themselves:

# %%
for prediction, golds in [("The Eiffel Tower.", ["Eiffel Tower"]), ("the tall Eiffel Tower", ["Eiffel Tower"]),
                          ("Eiffel", ["Eiffel Tower"]), ("no", ["no, never"])]:
    print(f"{prediction!r:26} vs {golds}: norm {normalize_answer(prediction)!r:22} "
          f"EM {exact_match(prediction, golds):.0f}  F1 {f1(prediction, golds):.2f}")
print("judge:", judge or "none configured: LJ is absent")

# %% [markdown]
# ## Differences come with a paired-bootstrap interval
#
# `kunlunlab/eval/stats.py::paired_bootstrap`, called by `kunlunlab/eval/compare.py::table2` and
# `ablation_table`. Two methods $A$, $B$ answered the **same** $n$ questions, with per-question scores
# $s^A_i, s^B_i$ (EM). Take the per-question differences, resample question indices with replacement
# ($b = 1, \dots, N_\text{boot}$, with $N_\text{boot}$ = `n_resamples`), and read the interval off the resampled means:
#
# $$d_i = s^A_i - s^B_i, \qquad \bar d^{*(b)} = \frac{1}{n}\sum_{j=1}^{n} d_{I_j^{(b)}},\quad
# I_j^{(b)} \sim \mathrm{Uniform}\{1,\dots,n\}, \qquad
# \mathrm{CI}_{95\%} = \big[\,q_{2.5}(\bar d^{*}),\ q_{97.5}(\bar d^{*})\,\big].$$
#
# Questions are paired by their `id` (`compare.paired`), and tables report the result in percentage points.
#
# **Why paired, and not one interval per method?** Most of the variation in a score comes from *which*
# questions are in the set: an easy question is easy for every method. The variance of a difference is
#
# $$\operatorname{Var}(\bar s^A - \bar s^B) = \frac{1}{n}\Big(\operatorname{Var}(s^A) + \operatorname{Var}(s^B) - 2\operatorname{Cov}(s^A, s^B)\Big),$$
#
# and the two methods' scores on the same question are usually positively correlated, so the covariance
# term removes much of the variance. Two separate intervals, one per method, leave it out: judged by them the
# gap looks less certain than it is, and "the intervals overlap" is not a test of "no difference". Resampling the questions *together* keeps the covariance in,
# so the interval is the uncertainty of the gap itself. With tens of questions, an interval that includes
# zero is the honest reading: no measurable difference at this size. Each interval is 95 % on its own; across
# many cells of a table, a few will exclude zero by chance.

# %% [markdown]
# ## Table 2, reproduced on this model
#
# EM and LJ in percent per dataset and method; the last row is `kunlun` minus the best baseline of each
# dataset (by EM), with its paired-bootstrap 95 % interval and the number of questions
# (`kunlunlab/eval/compare.py::table2`). `kunlunlab/studies/suite.py::suite_tables` builds this table and the
# ablation tables below from the records, the same way `kunlunlab suite` does outside Jupyter.

# %%
tables = suite_tables(result, cfg)
header, rows = tables[TABLE2_TITLE]
display(HTML(table_html(header, rows)))
summaries = [s for s in result.summaries if s["variant"] in (*cfg.baselines, cfg.method)]
fig = method_bars(summaries, "em")
save_figure(fig, run_dir, "em_per_dataset")
fig

# %% [markdown]
# `make run` evaluates on few questions, so the row above moves by tens of points from one draw to the next. The
# kept run of the recipe make run trains (`kept`: notebook 04's config, trained and evaluated on more held-out
# questions of the same world; docs/results.md) beside this run's `kunlun` row, labelled, and this run minus the
# kept one paired on the questions both answered (a question counts as shared only where id and text agree).

# %%
fresh_kunlun = jsonl_path(run_dir / "records" / f"world.{cfg.method}.jsonl")
if kept and fresh_kunlun.is_file():
    header_k, rows_k = kept_beside_fresh(heldout_records(PROJECT_ROOT / kept, "world"), read_jsonl(fresh_kunlun),
                                         f"kept: {kept} (kunlun after training)",
                                         f"this run: {cfg.method} on {model or 'the untrained embedded model'}",
                                         n_resamples=n_resamples, seed=seed)
    display(HTML(table_html(header_k, rows_k)))

# %% [markdown]
# ## Which answer mode each method chose
#
# The paper's answers come in two modes (§2.3): `<short_answer>` for a fact, `<long_answer>` with a summary for
# a question that asks for one. `world_summary` holds held-out summary-oriented questions ("Describe how X is
# connected to Y."): its Table 2 column is the EM of the boxed link, and this table adds the share of long answers
# on factoid and on summary-oriented questions and how much of the gold facts the answers state (fact coverage,
# the mean share of each fact's words the answer contains). A method that never writes an answer tag (the
# baselines) counts as short; its coverage is its free-text answer's.

# %%
if MODES_TITLE in tables:
    header_m, rows_m = tables[MODES_TITLE]
    display(HTML(table_html(header_m, rows_m)))

# %% [markdown]
# ## Ablations of the whole agent
#
# What each mechanism buys, on the same questions (`kunlunlab/studies/suite.py::ABLATIONS`, scored by
# `kunlunlab/eval/compare.py::ablation_table`). Each row removes one thing and keeps the rest:
#
# | row | what is removed | how |
# |---|---|---|
# | `−RDRA` | the background step (§2.1): no plan, no first- and second-stage retrieval, no `<background>` block; the agent starts from the bare question | `use_rdra=False` |
# | `−STIE` | the answer controller (§2.2): the first answer ends the rollout; no answer memory, no replacement, no feedback rounds | `use_stie=False` |
# | `agent (−RDRA −STIE)` | both: the plain search-think agent with the same protocol and budgets | `method="agent"` |
#
# A row's Δ is the variant minus `kunlun`, with its paired interval: a mechanism helps when removing it
# loses EM with an interval entirely below zero; an interval across zero reads "no measurable effect at this
# scale".
#
# **NLR** (§2.4) needs a second tier, so its rows change the corpus: the local index holds a seeded half
# of the world and the network tier (the retrieval service over the whole world, `nlr_latency_ms` slower
# per request) holds the rest. `local ½, no NLR` searches the half alone; `+NLR` lets the trained router
# (eqs. 20–23: state → local / network / both, reward = relative recall gain + relative latency saving)
# choose per query. Both compare with `kunlun` on the whole world in one local index, the upper bound. The
# training ablations come after the browser: they need a training run each.

# %%
for dataset in result.ablations:
    header_a, rows_a = tables[ablation_title(dataset)]
    display(HTML(f"<h4>{dataset}</h4>" + table_html(header_a, rows_a)))
if result.router:
    print("router during evaluation:", json.dumps(result.router["evaluation"]))
    print("router on its held-out hop queries:", json.dumps(result.router["training"]["heldout"]))

# %% [markdown]
# ## The trajectory browser: one question at a time
#
# Pick a run (dataset · method; the ablation variants are listed after the baselines) and a question
# (✓/✗ is its EM). The view (`kunlunlab/viz/trajectory_browser.py::record_html`) shows, in the order it
# happened:
#
# * the header: question, **gold vs prediction**, EM, F1, where the answer came from (`answer_tag` or the
#   free-text `fallback`), the number of searches;
# * for `kunlun`, **RDRA's plan** (eq. 2), its second-stage queries (eq. 3) and the **background
#   documents** the prompt started from (eq. 4);
# * every **turn**: the model's `<think>` text, its `<search>` queries and the **passages of each
#   `<result>` block**, or its answer (protocol issues such as an unclosed tag are named; the raw text is one
#   click away);
# * after each answer round, **STIE's decision** (eqs. 8–13): valid or redundant (with which round),
#   accepted, kept or replaced, which answers are blocked, and whether it stopped and why; then the feedback
#   STIE sent back to the model. The records store STIE's rounds, not its decisions, so the browser replays
#   `kunlunlab/agent/stie.py::replay` on the recorded rounds with the run's settings (`stie_config_for`:
#   the checkpoint's STIE configuration, STIE's defaults otherwise) and says so if the replay's answer differs
#   from the recorded one.
#
# The same views are written to `trajectories.html` in the run folder (every question, collapsible), for
# exports where widgets do not render, and the first correctly answered `kunlun` question to `trajectory.html`.

# %%
runs = runs_from_suite(result.records, result.ablations, first=cfg.method)
stie = stie_config_for(model)
browser = trajectory_browser(runs, stie)
(run_dir / "trajectories.html").write_text(trajectories_html(runs, stie))
first = next(iter(result.records))
pick = next((r for r in result.records[first][cfg.method] if r["em"]), result.records[first][cfg.method][0])
(run_dir / "trajectory.html").write_text(record_html(pick, f"{first} · {cfg.method}", stie))
print(f"{len(runs)} runs, {sum(len(r) for r in runs.values())} trajectories; STIE replayed with "
      f"max_rounds={stie.max_rounds}")
display(browser.widget)

# %% [markdown]
# ## Training ablations: what the training recipe buys
#
# The rows above change the agent at inference; these change *training*, so each needs its own run of
# notebook 04's config (`kunlunlab train`), and the rows compare the runs' evaluations after training on
# the same held-out questions (the same seeds give the same questions; `kunlunlab/training/records.py::
# compare_runs` pairs them by id and refuses runs evaluated on other questions):
#
# | run | what changes | `kunlunlab train --config experiments/configs/training/train_embedded_cpu.json --set …` |
# |---|---|---|
# | `kunlun` | the reference: notebook 04's run | — |
# | `agent` | the bare search-think agent trained and evaluated without RDRA and STIE | `agent.method=agent eval.method=agent` |
# | `no noisy mixing` | every SFT trajectory high-quality (eqs. 14–15 with $\rho_0 = 1$: no noisy share in any epoch) | `mixing.hq_share_start=1` |
# | `R_short only` | DAPO scores every answer with eq. 17 (no long-answer mode in the reward) | `rewards.dual_mode=false` |
#
# `R_short only` changes only stage 2, so its run can start from the reference's SFT checkpoint
# (`model=<run>/sft/final sft.enabled=false eval.before=false`). Pass the folders as `training_runs`
# (label → folder, the reference first), or compare them from the shell with `kunlunlab compare-runs
# kunlun=<folder> agent=<folder> …`. `make run` trains only the reference, so at its defaults this table is
# absent.

# %%
training_rows = {}
if training_runs:
    for dataset in ("world", "hotpotqa_distractor"):
        try:
            header_t, training_rows[dataset] = compare_runs(training_runs, next(iter(training_runs)), dataset,
                                                            n_resamples=n_resamples, seed=seed)
        except FileNotFoundError as err:  # a run without HotpotQA held-out records
            print(f"{dataset}: {err}")
            continue
        display(HTML(f"<h4>training ablations on {dataset}</h4>" + table_html(header_t, training_rows[dataset])))
else:
    print("no training_runs given: the training-ablation table needs one training run per row")

# %%
tables_out = {title: {"header": h, "rows": r} for title, (h, r) in tables.items()}
tables_out.update({f"Training ablations on {d}": {"header": header_t, "rows": r} for d, r in training_rows.items()})
metrics = {"model": model, "tables": tables_out, "seconds": result.seconds, "router": result.router,
           "summaries": [{k: s.get(k) for k in ("dataset", "variant", "n", "em", "f1", "lj", "em_tagged", "em_fallback",
                                                "searches_per_question", "long_share", "fact_coverage",
                                                "seconds_per_question")}
                         for s in result.summaries]}
(run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
{"kunlun vs best baseline": rows[-1], "seconds": result.seconds}

# %% [markdown]
# ## What this run showed
#
# Read back from this run's `metrics.json`.

# %%
shown = json.loads((run_dir / "metrics.json").read_text())
for s in shown["summaries"]:
    print(f"{s['dataset']!s:22} {s['variant']!s:24} n = {s['n']!s:>3}  EM {s['em']}  searches/question "
          f"{s['searches_per_question']}  long answers {s.get('long_share')}")
modes = shown["tables"].get(MODES_TITLE)
if modes:
    print(dict(zip(modes["header"], modes["rows"][-1])))

# %% [markdown]
# ## Exercises
#
# 1. Set `world_questions = 100`: how much narrower does the paired interval of `kunlun` − best baseline get,
#    and does its sign change?
# 2. Drop `−STIE` from `ablations` and add it back with `limit = 20`: on how many questions does STIE change the
#    answer at all, and why (see notebook 05's rounds per question)?
# 3. Point `retriever_url` at a `kunlunlab serve-retriever` over the HotpotQA paragraphs: does EM on
#    `hotpotqa_distractor` move when retrieval runs through the service?
# 4. Pick a wrong `kunlun` answer in the trajectory browser: was the gold passage retrieved? If so, the model read
#    badly; if not, the search missed. Count a few of each.
