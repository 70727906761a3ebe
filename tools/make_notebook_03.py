"""Writes notebooks/03_reward_design.ipynb (kept as a script so the notebook's source is reviewable)."""
from notebook_writer import code, md, write_notebook

cells = [
    md("""# 03 · Reward design: dual-mode rewards for short and long answers

The RL stage scores each trajectory with a **dual-mode** reward (paper §2.3):

* short answers (`<short_answer>\\boxed{…}</short_answer>`): $R_{short} = w_f r_{format} + w_l r_{length} + w_a r_{accuracy}$ (eq. 17)
* long answers (`<long_answer> summary \\boxed{…} </long_answer>`): $R_{long} = R_{short}$-terms $+\\, w_s (r_{structure} - 1)$ (eq. 18):
  structure is a penalty, so choosing the long mode earns nothing by itself

plus DAPO's soft **overlong** penalty on the model's own tokens. Every component is a TRL reward function
(`kunlunlab.training.rewards.reward_functions`), so `GRPOConfig.reward_weights` are the w's and TRL logs each
component. Rewards read the trajectory's **parse record**: retrieved `<result>` blocks are the
environment's and never count; malformed tags score as the protocol defines."""),
    code("""# Parameters (papermill overrides these)
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
run_dir = None"""),
    code("""import json
from dataclasses import asdict
from pathlib import Path
import ipywidgets as widgets
from IPython.display import HTML, display
from kunlunlab.training.rewards import RewardConfig, parse_completion, score
from kunlunlab.training.reward_cases import REWARD_CASES, case_rows
from kunlunlab.viz import reward_components_figure, reward_table_html, save_figure

run_dir = Path(run_dir) if run_dir else None
cfg = RewardConfig(w_format=w_format, w_length=w_length, w_accuracy=w_accuracy, w_structure=w_structure,
                   accuracy=accuracy, short_target_words=short_target_words, long_min_words=long_min_words,
                   long_max_words=long_max_words, overlong_max_tokens=overlong_max_tokens, overlong_buffer=overlong_buffer)
metrics = {"config": asdict(cfg)}"""),
    md("""## Hand-written cases

Correct, verbose, wrong, malformed (unclosed `<query>` and `<think>`), missing `\\boxed`, no answer at all,
over-long reasoning, and two long answers (one with a proper summary, one with only the box)."""),
    code("""rows = case_rows(REWARD_CASES, cfg)
display(HTML(reward_table_html(rows)))
fig = reward_components_figure(rows)
save_figure(fig, run_dir, "reward_cases")
metrics["cases"] = {r["name"]: r["total"] for r in rows}
fig"""),
    md("""## Explorer

Pick a case or write your own trajectory (the text after the assistant's opening `<think>`), set the gold
answer and the weights; the table shows every component as the trainer would see it."""),
    code("""picker = widgets.Dropdown(options=[c["name"] for c in REWARD_CASES], description="case")
# 95 % and no horizontal scroll: a 100 % text area plus its border is wider than the VBox
text = widgets.Textarea(value=REWARD_CASES[0]["text"], layout=widgets.Layout(width="95%", height="180px"))
gold = widgets.Text(value=" | ".join(REWARD_CASES[0]["golds"]), description="gold")
# the default label width (about 80 px) cuts "model tokens": let the label take the width it needs
tokens = widgets.IntText(value=0, description="model tokens", style={"description_width": "initial"})
sliders = {k: widgets.FloatSlider(value=getattr(cfg, k), min=0, max=2, step=0.05, description=k)
           for k in ("w_format", "w_length", "w_accuracy", "w_structure")}
out = widgets.HTML()

def explain(*_):
    live = RewardConfig(**{**asdict(cfg), **{k: s.value for k, s in sliders.items()}})
    record = parse_completion(text.value, model_tokens=tokens.value or None)
    row = case_rows([{"name": "your response", "text": text.value, "golds": [g.strip() for g in gold.value.split("|")],
                      "model_tokens": tokens.value or None}], live)
    out.value = reward_table_html(row) + f"<p>answer: <code>{record.answer!r}</code>, issues: {record.issues or 'none'}, searches: {record.n_searches}</p>"

def pick(change):
    case = next(c for c in REWARD_CASES if c["name"] == change["new"])
    text.value, gold.value, tokens.value = case["text"], " | ".join(case["golds"]), case.get("model_tokens") or 0

picker.observe(pick, names="value")
for w in [text, gold, tokens, *sliders.values()]:
    w.observe(explain, names="value")
explain()
display(widgets.VBox([picker, text, gold, tokens, *sliders.values(), out]))"""),
    md("""## Weights change the ranking

With accuracy dominant, a correct answer with a formatting slip still beats a well-formatted wrong one;
raising the format weight flips that. This is the trade-off the paper tunes."""),
    code("""for label, weights in [("default", {}), ("format-heavy", {"w_format": 1.5, "w_accuracy": 0.5})]:
    live = RewardConfig(**{**asdict(cfg), **weights})
    totals = {r["name"]: r["total"] for r in case_rows(REWARD_CASES, live)}
    order = sorted(totals, key=totals.get, reverse=True)
    print(f"{label:13}", " > ".join(order[:5]))
    metrics[f"ranking_{label}"] = order
if run_dir is not None:
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))"""),
]

write_notebook(cells, "notebooks/03_reward_design.ipynb")
