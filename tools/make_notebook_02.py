"""Writes notebooks/02_data_mixing.ipynb (kept as a script so the notebook's source is reviewable)."""
from notebook_writer import code, md, write_notebook

cells = [
    md("""# 02 · Progressive data mixing: noisy and high-quality trajectories

KunLunBaizeRAG trains on a **mix** of high-quality and noisy search-think trajectories (paper §2.3).
Training starts at a 1:1 ratio (the *cold start*, eq. 14); the high-quality share then rises to 100 %
by the turning epoch T (eq. 15) while the noisy samples that remain get noisier (eq. 16).

Everything here is built by `kunlunlab.training.mixing` with the **real retriever**: each `<result>` block
is what the rollout engine would append at inference, formatted by the same function."""),
    code("""# Parameters (papermill overrides these)
world_passages = 2000
train_questions = 200
index_kind = "flat"          # retriever that fills the <result> blocks
top_k = 1                    # passages per search, as in the embedded training config
max_result_chars = 300
quote_evidence = False       # True: think turns quote the result sentence holding each hop answer
epochs = 4
turning_epoch = 3            # T
hq_share_start = 0.5         # eq. 14
hq_shape = 1.0               # eq. 15 exponent (1 = linear)
noise_start = 0.3            # eq. 16
noise_end = 0.7
samples_per_epoch = 48
hotpot_share = 0.2
first_turn_samples = 20      # extra per epoch: prompt + first turn only (decomposition practice)
seed = 0
smoke = False
run_dir = None"""),
    code("""import json
from pathlib import Path
from collections import Counter
from IPython.display import HTML, display
from kunlunlab.data import World, make_questions
from kunlunlab.data.loaders import corpus_from_examples, load_benchmark
from kunlunlab.training.mixing import MixingConfig, TrajectoryBuilder, data_stats, load_rl_prompts, mix, schedule
from kunlunlab.models import load_llm
from kunlunlab.paths import shared_data_dir
from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
from kunlunlab.viz import data_figure, save_figure, schedule_figure

if smoke:
    world_passages, train_questions, samples_per_epoch, epochs, turning_epoch, first_turn_samples = 600, 24, 6, 2, 1, 2
run_dir = Path(run_dir) if run_dir else None
cfg = MixingConfig(epochs=epochs, turning_epoch=turning_epoch, hq_share_start=hq_share_start, hq_shape=hq_shape,
                   noise_start=noise_start, noise_end=noise_end, samples_per_epoch=samples_per_epoch,
                   hotpot_share=hotpot_share, first_turn_samples=first_turn_samples, top_k=top_k, max_result_chars=max_result_chars,
                   quote_evidence=quote_evidence, seed=seed)
metrics = {}"""),
    md("""## The schedule (eqs. 14–16)

$p_{hq}(0) = p_0$, $\\;p_{hq}(e) = p_0 + (1-p_0)\\,\\min(1, e/T)^{\\gamma}$, $\\;\\rho(e) = \\rho_0 + (\\rho_{max}-\\rho_0)\\,\\min(1, e/T)$."""),
    code("""rows = schedule(cfg)
for r in rows:
    print(f"epoch {r['epoch']}: high-quality share {r['hq_share']:.2f} ({r['n_hq']} samples), "
          f"noise ratio {r['noise_ratio']:.2f} ({r['n_noisy']} noisy samples)")
fig = schedule_figure(rows)
save_figure(fig, run_dir, "schedule")
metrics["schedule"] = rows
fig"""),
    md("""## Building trajectories

High quality: the synthetic world's **gold chains** (each hop names the passage that answers it) and
HotpotQA questions walked along their **supporting facts**. Noisy: *distractor* results (the gold passage
withheld; the model notices and searches the entity's page), a *wrong hop* that is then corrected (the
wrong turn is out of the loss) and an *irrelevant background*. First-turn samples (the prompt and the
first search only) add cheap practice at decomposing a question into its first sub-question."""),
    code("""world = World.generate(n_passages=world_passages, seed=seed)
questions = make_questions(world, train_questions, seed=seed + 1, id_prefix="train")
retriever = build_retriever(world.passages, IndexConfig(kind=index_kind))
builder = TrajectoryBuilder(retriever.search, world.passages, cfg)
hotpot, hotpot_builder = [], None
if shared_data_dir() is not None:
    hotpot = load_benchmark("hotpotqa_distractor")[:30]   # the held-out half stays out (notebook 04 evaluates on it)
    hotpot_passages = corpus_from_examples(load_benchmark("hotpotqa_distractor"))
    hotpot_builder = TrajectoryBuilder(build_retriever(hotpot_passages, IndexConfig(kind=index_kind)).search,
                                       hotpot_passages, cfg)
trajectories = mix(builder, questions, cfg, hotpot_builder, hotpot)
print(len(trajectories), "samples;", Counter(t.quality for t in trajectories), Counter(t.source for t in trajectories),
      Counter("first turn" if t.partial else "whole" for t in trajectories))"""),
    code("""import html, random
def show(t):
    head = f"<b>{t.quality}</b> {t.source} ({t.qtype}), noise: {', '.join(t.noise) or 'none'}<br><b>Q:</b> {html.escape(t.question)}"
    body = []
    for s in [{"role": "model", "text": "<think>", "train": True}] + t.segments:
        color = "#eaf6ea" if s["role"] == "env" else ("#f7f7f7" if s["train"] else "#fde8e8")
        body.append(f"<pre style='background:{color};margin:0;white-space:pre-wrap'>{html.escape(s['text'])}</pre>")
    display(HTML(head + "".join(body)))
hq = next(t for t in trajectories if t.quality == "hq" and t.source == "world" and not t.partial)
noisy = next((t for t in trajectories if t.quality == "noisy"), None)
show(hq)
if noisy is not None:
    show(noisy)"""),
    md("""Grey: model turns in the loss; green: retrieved results (masked); red: a noisy wrong turn (masked).

## What the mix contains"""),
    code("""_, tokenizer = load_llm()
stats = data_stats(trajectories, tokenizer)
fig = data_figure(stats)
save_figure(fig, run_dir, "data")
per_epoch = {}
for r in stats:
    e = per_epoch.setdefault(r["epoch"], Counter())
    e[r["quality"]] += 1
    e["noise:" + r["noise"]] += 1
for e, c in sorted(per_epoch.items()):
    print(f"epoch {e}:", dict(c))
metrics["trajectories"] = len(trajectories)
metrics["per_epoch"] = {str(e): dict(c) for e, c in per_epoch.items()}
metrics["mean_tokens"] = {q: round(sum(r["tokens"] for r in stats if r["quality"] == q) /
                                   max(1, sum(1 for r in stats if r["quality"] == q)), 1) for q in ("hq", "noisy")}
metrics["mean_searches"] = round(sum(r["searches"] for r in stats) / len(stats), 2)
fig"""),
    md("""## Bringing ReSearch / ZeroSearch / Search-R1 data

RL prompts from the field come in the veRL layout (`prompt`, `reward_model.ground_truth`, `extra_info`),
as jsonl or parquet; `load_rl_prompts` reads both into the same records."""),
    code("""root = shared_data_dir()
if root is not None:
    rl = load_rl_prompts(root / "musique/test.jsonl", limit=3)
    for ex in rl:
        print(ex.source, "|", ex.question, "->", ex.answers)
    metrics["rl_prompts_example"] = len(rl)
else:
    print("benchmark data folder not found (KUNLUNLAB_DATA or ../shared/data)")"""),
    code("""if run_dir is not None:
    with (run_dir / "trajectories.jsonl").open("w") as f:
        for t in trajectories:
            f.write(json.dumps(t.to_dict()) + "\\n")
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
metrics["mean_tokens"]"""),
]

write_notebook(cells, "notebooks/02_data_mixing.ipynb")
