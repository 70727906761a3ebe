"""Writes notebooks/06_evaluation.ipynb (kept as a script so the notebook's source is reviewable)."""
from notebook_writer import code, md, write_notebook

cells = [
    md("""# 06 · Evaluation: every method on the four benchmarks and the synthetic world

One runner (`kunlunlab.eval.harness.evaluate`, also `kunlunlab eval`) runs every method on the same
backend and retriever: Naive Generation, Naive RAG, Iter-RetGen, IRCoT, a Search-o1-style agent and
`kunlun` (RDRA + search-think agent + STIE). Metrics: EM and F1 with SQuAD/HotpotQA normalisation,
cover-EM (`acc`) and LJ, an LLM judge with a fixed prompt (here the answering model itself, with
verdicts cached; pass a stronger `judge` model where you have one).

Corpora: the synthetic world for its questions, the HotpotQA distractor contexts, the 2Wiki
paragraphs; HotpotQA, MuSiQue and Bamboogle ship no evidence, so they search the union of both
(an open-corpus setting that does not cover every question)."""),
    code("""# Parameters (papermill overrides these)
methods = ["naive_gen", "naive_rag", "iter_retgen", "ircot", "search_o1", "kunlun"]
datasets = ["world", "hotpotqa_distractor", "2wikimultihopqa", "musique", "bamboogle"]
limit = 3                  # questions per dataset
model = None               # None: embedded SmolLM2-135M-Instruct; or a hub id / local path
judge = "same"             # "same", "none" or a judge model
index_kind = "bm25"        # "flat" for dense retrieval (embeds each corpus once, cached)
world_passages = 2000
seed = 0
smoke = False
run_dir = None"""),
    code("""import json
from pathlib import Path
from IPython.display import HTML, display
from kunlunlab.agent.backends import TransformersBackend
from kunlunlab.eval.harness import EvalConfig, evaluate
from kunlunlab.paths import shared_data_dir
from kunlunlab.viz import method_bars, render_trajectory, results_table, save_figure, table_html

if smoke:
    methods, datasets, limit = ["naive_rag", "kunlun"], ["world", "hotpotqa_distractor"], 1
if shared_data_dir() is None:
    print("benchmark data folder not found: evaluating the synthetic world only")
    datasets = [d for d in datasets if d == "world"]
run_dir = Path(run_dir) if run_dir else Path(".")
backend = TransformersBackend(model)"""),
    md("## Run every method on every dataset"),
    code("""summaries = []
for dataset in datasets:
    for method in methods:
        config = EvalConfig(dataset=dataset, method=method, limit=limit, judge=judge, index_kind=index_kind,
                            world_passages=world_passages, seed=seed, max_total_tokens=640)
        s = evaluate(config, run_dir / f"{dataset}.{method}.jsonl", backend=backend)
        s.pop("config")
        summaries.append(s)
        print(f"{dataset:20} {method:12} EM {s['em']:.3f}  F1 {s['f1']:.3f}  LJ {s['lj']}  "
              f"searches {s['searches_per_question']:.1f}  {s['seconds_per_question']:.1f} s/q")"""),
    md("""## Table 2, reproduced on this model

EM and LJ in percent per dataset and method (the paper reports these for 7B–32B models trained
with DAPO; the embedded 135M model, untrained, mostly sets the floor)."""),
    code("""header, rows = results_table(summaries)
display(HTML(table_html(header, rows)))
fig = method_bars(summaries, "em")
save_figure(fig, run_dir, "em_per_dataset")
fig_f1 = method_bars(summaries, "f1")
save_figure(fig_f1, run_dir, "f1_per_dataset")
fig"""),
    md("## Trajectory viewer: one question, step by step"),
    code("""records = [json.loads(line) for line in (run_dir / f"{datasets[0]}.{methods[-1]}.jsonl").read_text().splitlines()]
viewer = render_trajectory(records[0])
(run_dir / "trajectory.html").write_text(viewer)
display(HTML(viewer))"""),
    code("""metrics = {"table_header": header, "table_rows": rows,
           "summaries": [{k: s[k] for k in ("dataset", "method", "n", "em", "f1", "acc", "lj",
                                            "searches_per_question", "seconds_per_question", "retrieval_recall")}
                         for s in summaries]}
(run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
metrics["table_rows"]"""),
]
write_notebook(cells, "notebooks/06_evaluation.ipynb")
