"""Writes notebooks/04_training.ipynb (kept as a script so the notebook's source is reviewable)."""
from notebook_writer import code, md, write_notebook

cells = [
    md("""# 04 · Training: format cold start (SFT) and DAPO through TRL

The progressive training of KunLunBaizeRAG (paper §2.3), end to end on the embedded SmolLM2-135M. What is
trained is the **whole agent** (`agent.method = "kunlun"`), run exactly as it is evaluated: every prompt
carries RDRA's background block (§2.1: the plan, then the passages retrieved for the question and for the
plan's queries), and STIE (§2.2) watches the answer rounds, appending its feedback when the agent should
verify. `agent.method = "agent"` trains the search-think protocol alone (the ablation notebook 06 compares).

1. **Data**: the mixed trajectories of notebook 02 (schedule eqs. 14–16), written as the whole agent runs:
   RDRA backgrounds with real retrieval, planning samples (the plan prompt → the plan) and, for a quarter of
   the trajectories, an STIE feedback round after the answer (verify with a new search, answer again; in
   half of them the first answer was wrong and is corrected, its tokens kept out of the loss).
2. **Stage 1, format cold start**: TRL `SFTTrainer` on the trajectories; the loss covers the model's own
   tokens only: prompts, retrieved `<result>` blocks and the wrong turns of noisy samples are masked.
3. **Stage 2, DAPO**: TRL `GRPOTrainer` with `loss_type="dapo"` (token-level aggregation), clip-higher
   (`epsilon_high`), no KL term, dynamic sampling and overlong shaping. Rollouts come from the same batched
   engine as inference via `rollout_func`, which returns `env_mask` so retrieved tokens and STIE's feedback
   get no gradient (eq. 19). Rewards are notebook 03's dual-mode rewards, scored on the answer STIE accepts.
   Dynamic sampling judges a group by its accuracy: a group whose samples are all right or all wrong has no
   signal, so it is dropped and replaced by an informative group of another training question.
4. **Evaluation before and after** with the same inference pipeline (`kunlunlab eval`'s harness) on
   held-out synthetic questions and the held-out half of the HotpotQA distractor sample.

The same run outside Jupyter: `kunlunlab train --config experiments/configs/training/train_embedded_cpu.json`.
A killed run continues from its last checkpoint when started again with the same `run_dir`."""),
    code("""# Parameters (papermill overrides these)
config = "experiments/configs/training/train_embedded_cpu.json"   # relative to the repository root, or absolute
overrides = {}            # e.g. {"sft.learning_rate": 5e-5, "dapo.steps": 8}
smoke = False
run_dir = None"""),
    code("""import json
from pathlib import Path
from IPython.display import HTML, display
from kunlunlab.paths import PROJECT_ROOT, new_run_dir
from kunlunlab.training.config import apply_overrides, config_from_dict, load_config
from kunlunlab.training.pipeline import SMOKE_OVERRIDES, train, training_logs
from kunlunlab.viz import before_after_figure, render_trajectory, save_figure, training_curves

path = Path(config) if Path(config).is_absolute() else PROJECT_ROOT / config
cfg = load_config(path, dict(overrides))
if smoke:
    cfg = config_from_dict(apply_overrides(apply_overrides(cfg.to_dict(), SMOKE_OVERRIDES), dict(overrides)))
run_dir = Path(run_dir) if run_dir else new_run_dir(name="04_training")
print(json.dumps(cfg.to_dict(), indent=1)[:1500])"""),
    md("""## Train (or resume)

Progress lines appear as each stage finishes; the Trainer logs every step."""),
    code("""summary = train(cfg, run_dir, progress=print)"""),
    md("""## Before and after

EM, F1 (in %) and **format compliance**: the share of trajectories that follow the protocol end to end
(an answer tag with `\\boxed{}` and no protocol issue on the way)."""),
    code("""rows = [("EM", "em"), ("F1", "f1"), ("format compliance", "format_compliance"), ("searches / question", "searches")]
table = "<table><tr><th></th><th>before</th><th>after</th></tr>" + "".join(
    f"<tr><td>{label}</td><td>{summary[f'{key}_before']}</td><td>{summary[f'{key}_after']}</td></tr>" for label, key in rows)
hotpot = summary.get("hotpotqa_distractor")
if hotpot:
    table += "".join(f"<tr><td>HotpotQA {label}</td><td>{hotpot[f'{key}_before']}</td><td>{hotpot[f'{key}_after']}</td></tr>"
                     for label, key in rows[:3])
display(HTML(table + "</table>"))
print(f"{summary['steps']} optimizer steps {summary['steps_by_stage']}, {summary['seconds']} s of training "
      f"{summary['seconds_by_stage']}, {summary['heldout_questions']} held-out questions")
fig = before_after_figure(summary)
save_figure(fig, run_dir, "before_after")
fig"""),
    md("""## Training curves

SFT loss; DAPO reward and its components, response length, searches per rollout and format compliance
(the paper's Figures 2–3), and how many groups dynamic sampling re-sampled or kept out of the loss."""),
    code("""logs = training_logs(run_dir)
fig = training_curves(logs["sft"], logs["dapo"], logs["rollouts"])
save_figure(fig, run_dir, "training_curves")
fig"""),
    md("""## A trajectory of the trained model"""),
    code("""records = [json.loads(line) for line in (run_dir / "eval_after_world.jsonl").read_text().splitlines()]
pick = next((r for r in records if r["em"]), records[0])
print("gold:", pick["golds"], "| prediction:", pick["prediction"])
display(HTML(render_trajectory(pick)))"""),
    md("""Where the EM comes from: answers closed with an answer tag versus answers the evaluation had to extract
from free text (the fallback every baseline gets). A gain from following the protocol shows up as tagged answers."""),
    code("""print({k: summary.get(k) for k in ("em_tagged_after", "n_tagged_after", "em_fallback_after", "n_fallback_after")})
print("trajectory mix:", summary["trajectory_mix"])"""),
    code("""(run_dir / "metrics.json").write_text(json.dumps(summary, indent=2))
{k: summary[k] for k in ("em_before", "em_after", "format_compliance_before", "format_compliance_after", "seconds")}"""),
]

write_notebook(cells, "notebooks/04_training.ipynb")
