"""Writes notebooks/06_evaluation.ipynb (kept as a script so the notebook's source is reviewable)."""
from notebook_writer import code, md, write_notebook

cells = [
    md("""# 06 · Evaluation: the trained agent against the baselines (Table 2) and its ablations

`make run` hands this notebook the model that notebook 04 trained (`model`); without one it evaluates the
embedded, untrained SmolLM2-135M. The suite (`kunlunlab.suite.run_suite`) runs every method on the same
loaded model with the checkpoint's own agent settings (`kunlunlab_agent.json`: top-k, token budgets, STIE
rounds), on questions training never saw: the held-out split of the training config for the synthetic
world, the held-out half of the HotpotQA distractor sample, and the first `limit` questions of 2Wiki,
MuSiQue and Bamboogle (searched in the 2Wiki paragraphs + HotpotQA contexts, an open corpus that does not
cover every question).

**Methods**: Naive Generation, Naive RAG, Iter-RetGen, IRCoT, a Search-o1-style agent and `kunlun`
(RDRA background §2.1 → search-think agent → STIE over answer rounds §2.2).

**Metrics** (`kunlunlab/eval/metrics.py`): EM after SQuAD normalisation (lower case, no articles or
punctuation), token F1, and LJ from an LLM judge. The judge must not be the model under test: with no
`judge` configured, LJ is absent (–), never a number from the answering model.

**Intervals**: every difference is over the same questions, so it comes with a paired-bootstrap 95 %
interval (`kunlunlab/eval/stats.py`): resample question indices with replacement, recompute both means,
take the 2.5th and 97.5th percentiles of the difference. With tens of questions an interval that spans
zero is the honest reading: no measurable difference at this size."""),
    code("""# Parameters (papermill overrides these)
model = None               # the trained checkpoint (make run passes notebook 04's); None: embedded, untrained
train_config = "experiments/configs/training/train_embedded_cpu.json"  # whose held-out split is evaluated
baselines = ["naive_gen", "naive_rag", "iter_retgen", "ircot", "search_o1"]
datasets = ["world", "hotpotqa_distractor", "2wikimultihopqa", "musique", "bamboogle"]
world_questions = 30       # held-out synthetic questions
hotpot_questions = 20      # held-out HotpotQA distractor questions
limit = 10                 # questions of each other benchmark
ablations = ["−RDRA", "−STIE", "agent (−RDRA −STIE)"]
ablation_datasets = ["world"]
nlr = True                 # NLR rows: a router trained against a network tier over the world (local tier: half)
nlr_latency_ms = 150.0     # the network tier's added latency per request
judge = None               # LJ judge: a model (hub id / path) or, with judge_url, a served model's name
judge_url = None
index_kind = "flat"
n_resamples = 2000
seed = 0
smoke = False
run_dir = None"""),
    code("""import json
from pathlib import Path
from IPython.display import HTML, display
from kunlunlab.eval.compare import ablation_table, table2
from kunlunlab.paths import shared_data_dir
from kunlunlab.suite import SuiteConfig, run_suite
from kunlunlab.viz import method_bars, render_trajectory, save_figure, table_html

if smoke:
    baselines, datasets, world_questions, hotpot_questions, limit = ["naive_rag"], ["world", "hotpotqa_distractor"], 2, 1, 1
    ablations, n_resamples, nlr = ["−STIE"], 200, False
if shared_data_dir() is None:
    print("benchmark data folder not found: evaluating the synthetic world only")
run_dir = Path(run_dir) if run_dir else Path(".")
print("model:", model or "embedded SmolLM2-135M-Instruct (untrained)")
cfg = SuiteConfig(model=model, train_config=train_config, baselines=tuple(baselines), datasets=tuple(datasets),
                  world_questions=world_questions, hotpot_questions=hotpot_questions, limit=limit,
                  ablations=tuple(ablations), ablation_datasets=tuple(ablation_datasets), nlr=nlr,
                  nlr_latency_ms=nlr_latency_ms, judge=judge,
                  judge_url=judge_url, index_kind=index_kind, seed=seed)"""),
    md("## Run every method on every dataset, then the ablations"),
    code("""result = run_suite(cfg, run_dir / "records")
print(f"{result.seconds} s")"""),
    md("""## Table 2, reproduced on this model

EM and LJ in percent per dataset and method; the last row is `kunlun` minus the best baseline of each
dataset (by EM), with its paired-bootstrap 95 % interval and the number of questions."""),
    code("""header, rows = table2(result.records, cfg.method, cfg.baselines, n_resamples=n_resamples, seed=seed)
display(HTML(table_html(header, rows)))
summaries = [s for s in result.summaries if s["variant"] in (*cfg.baselines, cfg.method)]
fig = method_bars(summaries, "em")
save_figure(fig, run_dir, "em_per_dataset")
fig"""),
    md("""## Ablations of the whole agent

What each mechanism buys, on the same questions: `kunlun` without RDRA's background, without STIE, and
the plain search-think agent (neither). A row's Δ is the variant minus `kunlun`; a mechanism helps when
removing it loses EM with an interval below zero.

**NLR** (§2.4) needs a second tier, so its rows change the corpus: the local index holds a seeded half
of the world and the network tier (the retrieval service over the whole world, `nlr_latency_ms` slower
per request) holds the rest. `local ½, no NLR` searches the half alone; `+NLR` lets the trained router
(eqs. 20–23: state → local / network / both, reward = relative recall gain + relative latency saving)
choose per query. Both compare with `kunlun` on the whole world in one local index, the upper bound. The training ablations (no noisy mixing, `R_short`
only) need their own training run each: train with notebook 04's config and
`--set mixing.noise_start=0 mixing.noise_end=0 mixing.hq_share_start=1` or
`--set rewards.w_structure=0 ...`, then point `model` at the result."""),
    code("""ablation_rows = {}
for dataset, variants in result.ablations.items():
    header_a, rows_a = ablation_table(variants, cfg.method, n_resamples=n_resamples, seed=seed)
    ablation_rows[dataset] = rows_a
    display(HTML(f"<h4>{dataset}</h4>" + table_html(header_a, rows_a)))
if result.router:
    print("router during evaluation:", json.dumps(result.router["evaluation"]))
    print("router on its held-out hop queries:", json.dumps(result.router["training"]["heldout"]))"""),
    md("## One question, step by step (RDRA plan and background, each turn, STIE's rounds)"),
    code("""first = next(iter(result.records))
records = result.records[first][cfg.method]
pick = next((r for r in records if r["em"]), records[0])
viewer = render_trajectory(pick)
(run_dir / "trajectory.html").write_text(viewer)
display(HTML(viewer))"""),
    code("""tables = {"Table 2 (EM / LJ %)": {"header": header, "rows": rows},
          **{f"Ablations on {d}": {"header": header_a, "rows": r} for d, r in ablation_rows.items()}}
metrics = {"model": model, "tables": tables, "seconds": result.seconds, "router": result.router,
           "summaries": [{k: s.get(k) for k in ("dataset", "variant", "n", "em", "f1", "lj", "em_tagged", "em_fallback",
                                                "searches_per_question", "seconds_per_question")}
                         for s in result.summaries]}
(run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
{"kunlun vs best baseline": rows[-1], "seconds": result.seconds}"""),
]
write_notebook(cells, "notebooks/06_evaluation.ipynb")
