"""Writes notebooks/05_stie_tuning.ipynb (kept as a script so the notebook's source is reviewable)."""
from notebook_writer import code, md, write_notebook

cells = [
    md("""# 05 · STIE tuning: answer memory, redundancy thresholds, repeat blocking, termination

STIE (paper §2.2, eqs. 5–13) watches the agent's **answer rounds**. Each round's answer is compared
with the last three rounds by the difference D = 1 − O (O: Jaccard overlap of stemmed words) against
asymmetric thresholds δ1 ≥ δ2 ≥ δ3; a new (valid) answer becomes the current answer; a redundant one
is **replaced** by the most confident candidate that is not **shielded** (an answer repeated K times
is a reasoning loop and is blocked); and the loop **terminates** when a valid answer's mean overlap
with the recent rounds is low (a genuinely new answer), when confidence reaches its ceiling, or when
searching brings no new documents. The paper's typeset equations were not available to us; the
reconstruction and the choices that are ours are listed in `kunlunlab/agent/stie.py`.

STIE is a controller on top of the decoder, so we generate the rounds **once** and re-score any
setting on the cached rounds: the sliders below re-run STIE live without touching the model.
`make run` passes the model that notebook 04 trained (`model`); its questions come from the held-out
split of the training config, so none of them was a training question."""),
    code("""# Parameters (papermill overrides these)
model = None              # the trained checkpoint (make run passes notebook 04's); None: embedded SmolLM2, untrained
train_config = "experiments/configs/training/train_embedded_cpu.json"  # its held-out split gives the questions
n_questions = 24          # held-out synthetic-world questions whose rounds the model generates
rounds = 5                # answer rounds generated per question (STIEConfig().max_rounds: K = 3 blocking can act)
index_kind = None         # retrieval index; None: the training config's (as the model was trained)
simulated_questions = 200 # size of the labelled loop simulation
seed = 0
smoke = False
run_dir = None"""),
    code("""import json
import time
from dataclasses import replace
from pathlib import Path
import ipywidgets as widgets
from IPython.display import display, HTML
from kunlunlab.agent.stie import STIEConfig, RoundInput, replay
from kunlunlab.agent.stie_tuning import (CONTROLS, TUNING_GRID, cases_from_records, format_readout, grid_search,
                                         readout, score, simulated_cases, validate)
from kunlunlab.agent.backends import TransformersBackend
from kunlunlab.data import make_questions
from kunlunlab.eval.harness import EvalConfig, evaluate
from kunlunlab.paths import PROJECT_ROOT
from kunlunlab.training.config import load_config
from kunlunlab.training.pipeline import heldout_examples
from kunlunlab.viz import save_figure, stie_heatmaps, table_html

if smoke:
    n_questions, rounds, simulated_questions = 2, 2, 40
run_dir = Path(run_dir) if run_dir else None
metrics = {"model": model}"""),
    md(r"""## The equations, as implemented

From `kunlunlab/agent/stie.py` (paper §2.2; the exact forms are our reconstruction). $W(a)$ is the set
of normalised words of answer $a$, each cut to 5 characters; $c_t$ the round's confidence.

* (6) overlap: $O(a,b) = \dfrac{|W(a)\cap W(b)|}{|W(a)\cup W(b)|}$ — (7) difference: $D(a,b) = 1 - O(a,b)$
* (8) validity: $a_t$ is valid iff $D(a_t, a_{t-k}) \ge \delta_k$ for every lag $k \in \{1,2,3\}$ whose round
  gave an answer ($\delta_1 \ge \delta_2 \ge \delta_3$); otherwise it is *redundant* with the first lag that fails.
* (9) repeat count: $n(a)$ = rounds whose answer was $a$ or redundant with it.
* (10) shielded set: $S = \{a : n(a) \ge K\}$.
* (11) candidates: $C = \{a \in M_t : a \notin S\}$, each with its best confidence $c(a)$.
* (12) replacement: a valid $a_t \notin S$ is accepted (even if less confident); otherwise
  $a^* = \arg\max_{a\in C} c(a)$ replaces it, except that $a_t$'s own answer (if in $C$) stays unless
  $c(a^*) > c(a_t) + \text{margin}$; if $C = \emptyset$ the most confident answer is kept (*all blocked*).
* (13) termination after round $t$: (i) $a_t$ valid and $\bar O_t = \frac{1}{|L|}\sum_{k\in L} O(a_t, a_{t-k}) <$
  `overlap_stop` ($L$: the answered rounds among the last three); (ii) $c_t \ge$ `confidence_ceiling` and
  $a_t \notin S$; (iii) $t > 1$ and $\dfrac{|\mathrm{docs}_t \setminus \bigcup_{s<t}\mathrm{docs}_s|}{|\mathrm{docs}_t|} <$
  `min_new_info`; always at $t =$ `max_rounds`."""),
    md("""## The paper's example

Four rounds of "Russia" variants, then "France". With K = 3 the third Russia shields the answer
(every candidate is then blocked, so the most confident form, "Russian Federation", is kept);
"France" shares no word with the recent rounds, so STIE accepts it and stops."""),
    code("""paper_rounds = [RoundInput("Russia", 0.40, ["d1"]), RoundInput("Russian Federation", 0.45, ["d2"]),
                RoundInput("Russia", 0.42, ["d3"]), RoundInput("the Russia", 0.41, ["d4"]),
                RoundInput("France", 0.35, ["d5"])]
answer, used, decisions = replay(paper_rounds, STIEConfig())  # defaults: K = 3, max_rounds = 5
for r, d in zip(paper_rounds, decisions):
    print(f"round {d.round + 1}: {r.answer!r:22} redundant_with={d.redundant_with} shielded={d.shielded} "
          f"accepted={d.accepted!r} mean_overlap={d.mean_overlap} stop={d.stop} ({d.reason})")
metrics["paper_example"] = {"final": answer, "rounds": used}"""),
    md("""## Cached rounds from the model

The `kunlun` method runs with STIE in collection mode (`stie_collect`: no early termination), so every
question yields all its rounds. With a trained checkpoint its own agent settings apply
(`kunlunlab_agent.json`: top-k, token budgets, RDRA sizes); the untrained embedded model rarely follows
the protocol, so many of its rounds carry no answer. The questions are the training config's held-out
synthetic-world questions (`heldout_examples`), never seen in training."""),
    code("""train_cfg = load_config(PROJECT_ROOT / train_config)
# The world's held-out split does not depend on HotpotQA: hotpot=False skips loading that benchmark.
held = heldout_examples(replace(train_cfg, hotpot=False), n_questions, 0)
examples, world = held.heldout, held.world
common = dict(dataset="world", limit=len(examples), index_kind=index_kind or train_cfg.index_kind,
              embedder=train_cfg.embedder, judge="none", seed=seed,
              method="kunlun", use_stie=True,  # the rounds are STIE's: the method must run it
              stie_rounds=rounds, stie_collect=True)
if model is not None:
    collect = EvalConfig.for_checkpoint(model, **common)
else:
    collect = EvalConfig(**common, max_total_tokens=640)
print("model:", model or "embedded SmolLM2-135M-Instruct (untrained)")
print("settings:", {k: getattr(collect, k) for k in ("method", "top_k", "max_total_tokens", "max_turn_tokens",
                                                     "use_rdra", "index_kind", "stie_rounds")})
print(f"{len(examples)} held-out questions from {train_config}")
backend = TransformersBackend(model)
records_path = (run_dir or Path(".")) / "rounds.jsonl"
summary = evaluate(collect, records_path, backend=backend, examples=examples, passages=world.passages)
records = [json.loads(line) for line in records_path.read_text().splitlines()]
model_cases = cases_from_records(records)
n_rounds = sum(len(r) for _, r in model_cases)
n_answered = sum(1 for _, rs in model_cases for r in rs if r.answer)
print(f"{len(model_cases)} questions, {n_rounds} rounds, {n_answered} with an answer "
      f"({summary['wall_seconds']:.0f} s)")
metrics["model_rounds"] = {"questions": len(model_cases), "rounds": n_rounds, "rounds_with_answer": n_answered}"""),
    md("""## A labelled simulation of loops

To see what the knobs do, a simulated answerer falls into loops: it repeats its last wrong answer
(in surface variants, re-reading one of the documents it read before) with probability 0.6, otherwise
answers correctly with probability 0.35. This is a simulation, labelled as such; the model's own
rounds are above."""),
    code("""golds = [ex.answers[0] for ex in make_questions(world, simulated_questions, seed=seed + 2)]
distractors = [p.title for p in world.passages[:50]]
sim_cases = simulated_cases(golds, distractors, n_rounds=5, seed=seed)
print("stop at the first answer:", score(sim_cases, STIEConfig(max_rounds=1)))
print("STIE defaults, 5 rounds: ", score(sim_cases, STIEConfig(max_rounds=5)))"""),
    md("""## Live re-scoring

Move a slider: STIE re-runs over every cached round (no generation), on the simulation and on the
model's rounds, and the read-out (`stie_tuning.readout`) says what it did, so each knob's effect shows
even when EM does not move:

| control | equation | moves in the read-out |
|---|---|---|
| `delta1`, `delta2`, `delta3` | (8) | redundant rounds (against the round 1, 2 or 3 back), hence replacements |
| `repeat_k` (K) | (10) | rounds with a blocklist, all-blocked rounds, replacements |
| `margin` | (12) | replacements (a rival must beat the round's own answer by more) |
| `overlap_stop` | (13i) | stops "new_answer", rounds used |
| `confidence_ceiling` | (13ii) | stops "confident", rounds used |
| `min_new_info` | (13iii) | stops "no_new_info", rounds used |
| `max_rounds` | (13) | stops "max_rounds", rounds used (the model's replay is capped at the rounds collected) |

`end_of_cache` counts questions whose cached rounds ran out before any stop. The `difference` variant of
eq. (7) has no slider: it only reproduces earlier runs. `tests/test_stie_widgets.py` checks that each
slider changes the read-out. The defaults are printed below the widget (for headless runs)."""),
    code("""defaults = STIEConfig()

def slider(name: str):
    low, high, step = CONTROLS[name]
    kind = widgets.IntSlider if isinstance(getattr(defaults, name), int) else widgets.FloatSlider
    return kind(value=getattr(defaults, name), min=low, max=high, step=step, description=name,
                continuous_update=False, style={"description_width": "initial"})

def show(config: STIEConfig) -> None:
    print("simulation:", format_readout(readout(sim_cases, config)))
    print("model     :", format_readout(readout(model_cases, replace(config, max_rounds=min(config.max_rounds, rounds)))))

sliders = {name: slider(name) for name in CONTROLS}
output = widgets.Output()

def rescore(_=None) -> None:
    output.clear_output(wait=True)
    with output:
        show(STIEConfig(**{k: w.value for k, w in sliders.items()}))

for s in sliders.values():
    s.observe(rescore, names="value")
display(widgets.VBox([*sliders.values(), output]))
rescore()
print("at the defaults:")
show(defaults)"""),
    md("""## Grid search: δ1 × K

EM of STIE's final answer and the rounds it used, over the redundancy threshold δ1 and the
repeat-blocking threshold K (the other knobs at their defaults), on the simulation and on the model's
cached rounds."""),
    code("""delta_grid, k_grid = [0.2, 0.4, 0.6, 0.8, 1.0], [1, 2, 3, 4, 5]
t0 = time.perf_counter()
print(f"grid δ1 × K ({len(delta_grid) * len(k_grid)} settings) on {len(sim_cases)} simulated and "
      f"{len(model_cases)} model questions ...", flush=True)
sim_grid = grid_search(sim_cases, STIEConfig(max_rounds=5), "repeat_k", k_grid, "delta1", delta_grid)
model_grid = grid_search(model_cases, STIEConfig(max_rounds=rounds), "repeat_k", k_grid, "delta1", delta_grid)
print(f"grid done in {time.perf_counter() - t0:.1f} s")
print("best on the simulation:", sim_grid["best"])
print("best on the model's rounds:", model_grid["best"])"""),
    code("""fig_sim = stie_heatmaps(k_grid, delta_grid, sim_grid["em"], sim_grid["rounds"], "K (repeat_k)", "δ1",
                        "STIE on the simulated loops (labelled simulation)")
save_figure(fig_sim, run_dir, "stie_grid_simulation")
fig_sim"""),
    code("""fig_model = stie_heatmaps(k_grid, delta_grid, model_grid["em"], model_grid["rounds"], "K (repeat_k)", "δ1",
                          f"STIE on the model's cached rounds ({len(model_cases)} held-out questions)")
save_figure(fig_model, run_dir, "stie_grid_model")
fig_model"""),
    md("""## Tuning, validated on the other half

`stie_tuning.validate` splits the questions by **alternating index** (even-indexed ones tune,
odd-indexed ones are held out), tunes δ1, δ2, δ3, K, the margin and the three termination thresholds
on the first half by coordinate search over small per-knob grids (`TUNING_GRID`: best EM, then fewest
rounds; two passes; δ1 ≥ δ2 ≥ δ3 kept), and scores the defaults and the tuned setting on the held-out
half. On the tuning half the tuned setting can only tie or win, by construction; the held-out half is
the honest comparison. **With few questions (a dozen held out from the model's rounds) a difference of
one or two questions is within noise**: read the model's row as an indication, not a result."""),
    code("""t0 = time.perf_counter()
print(f"tuning {', '.join(TUNING_GRID)} (coordinate search, 2 passes) on the even-indexed half ...", flush=True)
tuned = {"simulation": validate(sim_cases, STIEConfig(max_rounds=5)),
         "model": validate(model_cases, STIEConfig(max_rounds=rounds))}
print(f"tuning done in {time.perf_counter() - t0:.1f} s "
      f"({sum(t['evaluations'] for t in tuned.values())} settings scored)")
header = ["rounds from", "n held out", "EM default", "EM tuned", "rounds default", "rounds tuned"]
rows = [[name, t["n_heldout"], round(t["heldout_half"]["default"]["em"], 3), round(t["heldout_half"]["tuned"]["em"], 3),
         round(t["heldout_half"]["default"]["rounds"], 2), round(t["heldout_half"]["tuned"]["rounds"], 2)]
        for name, t in tuned.items()]
display(HTML("<b>default vs tuned on the held-out half</b>" + table_html(header, rows)))
for name, t in tuned.items():
    print(f"{name:10} chosen: {t['chosen']}")"""),
    code("""metrics.update({
    "simulation_first_answer_em": score(sim_cases, STIEConfig(max_rounds=1))["em"],
    "simulation_default_em": score(sim_cases, STIEConfig(max_rounds=5))["em"],
    "simulation_best": sim_grid["best"], "model_best": model_grid["best"],
    "model_default": score(model_cases, STIEConfig(max_rounds=rounds)),
    "tuned_vs_default": tuned,
    "tables": {"STIE default vs tuned on the held-out half": {"header": header, "rows": rows}},
})
if run_dir:
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
metrics"""),
]
write_notebook(cells, "notebooks/05_stie_tuning.ipynb")
