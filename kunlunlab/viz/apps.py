"""The interactive widgets of notebooks 03 and 05, also served as Voilà apps (``make app``, ``apps/``).

* :func:`reward_explorer` (notebook 03, ``apps/reward_explorer.ipynb``): pick a hand-written case
  (:data:`~kunlunlab.studies.reward_cases.REWARD_CASES`) or edit the trajectory, the gold answers, the
  model's token count and the weights of eqs. 17-18; the read-out is
  :func:`~kunlunlab.viz.data_views.reward_explanation_html` (the component table and what the parser read).
* :func:`stie_tuner` (notebook 05, ``apps/stie_tuner.ipynb``): one slider per STIE knob
  (:data:`~kunlunlab.studies.stie_tuning.CONTROLS`); every move replays STIE over cached rounds and the
  read-out shows :func:`~kunlunlab.studies.stie_tuning.format_readout` for each set of rounds.
  :func:`stie_tuner_app` is the app's version: the labelled loop simulation of notebook 05
  (:func:`simulation_cases`, no model needed), plus the model's cached rounds of a run when
  ``$KUNLUNLAB_ROUNDS`` names them (``rounds.jsonl``, the ``05_stie_tuning`` folder holding it, or the
  run folder above that).

Each function returns the assembled ipywidgets container (a ``VBox`` subclass, so it displays as itself)
and keeps its controls as attributes (``picker``, ``sliders``, ``readout`` …), so a test can set values in
Python and read the output. Every control and read-out also carries a CSS class (``kl-…``) for the
browser tests (``tests/notebooks/test_apps_browser.py``).
"""
from __future__ import annotations

import html
import json
import os
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

import ipywidgets as widgets

from kunlunlab.agent.stie import STIEConfig
from kunlunlab.data import World, make_questions
from kunlunlab.paths import PROJECT_ROOT
from kunlunlab.studies.reward_cases import REWARD_CASES
from kunlunlab.studies.stie_tuning import CONTROLS, Case, cases_from_records, format_readout, readout, simulated_cases
from kunlunlab.training.config import load_config
from kunlunlab.training.rewards import RewardConfig
from kunlunlab.viz.data_views import reward_explanation_html

# The weights of eqs. 17-18 the reward explorer has sliders for, and their range.
REWARD_WEIGHTS = ("w_format", "w_length", "w_accuracy", "w_structure")
WEIGHT_RANGE = (0.0, 2.0, 0.05)

# The environment variable naming the cached rounds the STIE tuner app replays besides the simulation.
ROUNDS_ENV = "KUNLUNLAB_ROUNDS"
# Notebook 05's defaults: the training config whose world gives the simulation's questions, their number.
TRAIN_CONFIG = "experiments/configs/training/train_embedded_cpu.json"
SIMULATED_QUESTIONS = 200


# --- notebook 03: the reward explorer ------------------------------------------------------------------

class RewardExplorer(widgets.VBox):
    """The reward explorer: ``picker`` (a Dropdown of case names), ``text`` (the trajectory), ``gold``
    (aliases joined by ``|``), ``tokens`` (the model's own tokens, 0 for none), ``sliders`` (one
    FloatSlider per weight in :data:`REWARD_WEIGHTS`) and ``readout`` (an HTML widget). Picking a case
    fills text, gold and tokens; any change re-scores."""

    def __init__(self, cfg: RewardConfig | None = None, cases: Sequence[dict] | None = None):
        self.base = cfg or RewardConfig()
        self.cases = list(cases or REWARD_CASES)
        first = self.cases[0]
        picker = widgets.Dropdown(options=[c["name"] for c in self.cases], value=first["name"], description="case")
        # 95 % and no horizontal scroll: a 100 % text area plus its border is wider than the VBox
        text = widgets.Textarea(value=first["text"], layout=widgets.Layout(width="95%", height="180px"))
        gold = widgets.Text(value=" | ".join(first["golds"]), description="gold")
        # the default label width (about 80 px) cuts "model tokens": let the label take the width it needs
        tokens = widgets.IntText(value=first.get("model_tokens") or 0, description="model tokens",
                                 style={"description_width": "initial"})
        low, high, step = WEIGHT_RANGE
        sliders = {k: widgets.FloatSlider(value=getattr(self.base, k), min=low, max=high, step=step, description=k,
                                          continuous_update=False) for k in REWARD_WEIGHTS}
        out = widgets.HTML()
        for name, w in [("case", picker), ("text", text), ("gold", gold), ("tokens", tokens), *sliders.items(),
                        ("readout", out)]:
            w.add_class(f"kl-{name}")
        super().__init__([picker, text, gold, tokens, *sliders.values(), out])
        self.add_class("kl-reward-explorer")
        self.picker, self.text, self.gold, self.tokens = picker, text, gold, tokens
        self.sliders, self.readout = sliders, out
        self._picking = False
        picker.observe(self._pick, names="value")
        for w in [text, gold, tokens, *sliders.values()]:
            w.observe(self.explain, names="value")
        self.explain()

    @property
    def config(self) -> RewardConfig:
        """The reward config with the sliders' weights."""
        return replace(self.base, **{k: s.value for k, s in self.sliders.items()})

    def explain(self, *_) -> None:
        """Re-scores the current text under the current weights into ``readout``."""
        if self._picking:
            return
        self.readout.value = reward_explanation_html(self.text.value, self.gold.value, self.config,
                                                     model_tokens=self.tokens.value or None)

    def _pick(self, change) -> None:
        case = next(c for c in self.cases if c["name"] == change["new"])
        self._picking = True  # three fields change: score once, with all of them in place
        try:
            self.text.value, self.gold.value = case["text"], " | ".join(case["golds"])
            self.tokens.value = case.get("model_tokens") or 0
        finally:
            self._picking = False
        self.explain()


def reward_explorer(cfg: RewardConfig | None = None, cases: Sequence[dict] | None = None) -> RewardExplorer:
    """Notebook 03's reward explorer over ``cases`` (the hand-written ones by default), with the weights
    of ``cfg`` (``RewardConfig()`` by default) as the sliders' start; its other settings (accuracy, length
    targets, overlong budget) stay as ``cfg`` has them."""
    return RewardExplorer(cfg, cases)


# --- notebook 05: the STIE tuner -----------------------------------------------------------------------

def _slider(name: str, value) -> widgets.Widget:
    low, high, step = CONTROLS[name]
    kind = widgets.IntSlider if isinstance(getattr(STIEConfig(), name), int) else widgets.FloatSlider
    return kind(value=value, min=low, max=high, step=step, description=name, continuous_update=False,
                style={"description_width": "initial"})


class STIETuner(widgets.VBox):
    """The STIE tuner: ``sliders`` (one per knob of :data:`CONTROLS`), ``header`` (which rounds each
    row replays) and ``readout`` (an HTML ``<pre>``, one line per set of cached rounds). Moving a slider
    replays STIE on every set (no generation).

    ``cases``: ``{label: cases}``; ``max_rounds``: ``{label: rounds collected}`` caps the round budget
    of that set's replays (the slider can ask for more rounds than were collected)."""

    def __init__(self, cases: Mapping[str, Sequence[Case]], max_rounds: Mapping[str, int] | None = None,
                 config: STIEConfig | None = None, notes: Mapping[str, str] | None = None):
        self.base = config or STIEConfig()
        self.cases = {label: list(c) for label, c in cases.items()}
        self.max_rounds = dict(max_rounds or {})
        sliders = {name: _slider(name, getattr(self.base, name)) for name in CONTROLS}
        header, out = widgets.HTML(), widgets.HTML()
        for name, w in [*sliders.items(), ("header", header), ("readout", out)]:
            w.add_class(f"kl-{name}")
        super().__init__([header, *sliders.values(), out])
        self.add_class("kl-stie-tuner")
        self.sliders, self.header, self.readout = sliders, header, out
        rows = []
        for label, c in self.cases.items():
            note = f"{len(c)} question{'s' if len(c) != 1 else ''}"
            if label in self.max_rounds:
                note += f", {self.max_rounds[label]} rounds collected (max_rounds is capped there)"
            if notes and notes.get(label):
                note += f"; {notes[label]}"
            rows.append(f"<li><b>{html.escape(label)}</b>: {html.escape(note)}</li>")
        header.value = "<ul style='margin:2px 0'>" + "".join(rows) + "</ul>"
        for s in sliders.values():
            s.observe(self.update, names="value")
        self.update()

    @property
    def config(self) -> STIEConfig:
        """The STIE config the sliders set."""
        return replace(self.base, **{k: s.value for k, s in self.sliders.items()})

    def config_for(self, label: str, config: STIEConfig | None = None) -> STIEConfig:
        """``config`` (the sliders' by default) with the round budget capped at what ``label`` collected."""
        config = config or self.config
        cap = self.max_rounds.get(label)
        return config if cap is None else replace(config, max_rounds=min(config.max_rounds, cap))

    def readouts(self, config: STIEConfig | None = None) -> dict[str, dict]:
        """:func:`readout` of every set of rounds under ``config`` (the sliders' by default)."""
        return {label: readout(c, self.config_for(label, config)) for label, c in self.cases.items()}

    def report(self, config: STIEConfig | None = None) -> str:
        """The read-out as text: one ``label: format_readout(...)`` line per set of rounds."""
        width = max((len(label) for label in self.cases), default=0)
        return "\n".join(f"{label:<{width}}: {format_readout(r)}" for label, r in self.readouts(config).items())

    def update(self, *_) -> None:
        """Replays STIE under the sliders' setting into ``readout``."""
        body = html.escape(self.report())
        self.readout.value = f"<pre class='kl-readout-text' style='white-space:pre-wrap'>{body}</pre>"


def simulation_cases(n_questions: int = SIMULATED_QUESTIONS, seed: int = 0, train_config: str | Path = TRAIN_CONFIG,
                     n_rounds: int = 5) -> list[Case]:
    """Notebook 05's labelled loop simulation (:func:`~kunlunlab.studies.stie_tuning.simulated_cases`),
    built as the notebook builds it at its defaults: gold answers of ``n_questions`` questions of the
    training config's synthetic world (question seed ``seed + 2``), the first 50 passage titles as
    distractors. No model and no index: under a second."""
    path = Path(train_config)
    cfg = load_config(path if path.is_absolute() else PROJECT_ROOT / path)
    world = World.generate(n_passages=cfg.world_passages, seed=cfg.world_seed)
    golds = [ex.answers[0] for ex in make_questions(world, n_questions, seed=seed + 2)]
    distractors = [p.title for p in world.passages[:50]]
    return simulated_cases(golds, distractors, n_rounds=n_rounds, seed=seed)


def rounds_file(path: str | Path) -> Path:
    """The ``rounds.jsonl`` that notebook 05 wrote, from the file itself, the notebook's output folder
    (``<run>/05_stie_tuning``) or the run folder (``<run>``). A relative path is tried from the working
    directory, then from the repository root (a Voilà kernel runs in ``apps/``). Raises
    FileNotFoundError otherwise."""
    path = Path(path).expanduser()
    bases = [path] if path.is_absolute() else [path, PROJECT_ROOT / path]
    for base in bases:
        for candidate in (base, base / "rounds.jsonl", base / "05_stie_tuning" / "rounds.jsonl"):
            if candidate.is_file():
                return candidate.resolve()
    raise FileNotFoundError(f"no rounds.jsonl at {path} (give the file, the 05_stie_tuning folder or the run folder)")


def load_rounds(path: str | Path) -> list[Case]:
    """The cached rounds of ``rounds.jsonl`` (:func:`rounds_file` finds it) as STIE cases."""
    lines = rounds_file(path).read_text(encoding="utf-8").splitlines()
    return cases_from_records([json.loads(line) for line in lines if line.strip()])


def stie_tuner(cases: Mapping[str, Sequence[Case]] | None = None, *, rounds: str | Path | None = None,
               max_rounds: Mapping[str, int] | None = None, config: STIEConfig | None = None) -> STIETuner:
    """Notebook 05's STIE tuner over ``cases`` (``{label: cases}``; the labelled simulation,
    :func:`simulation_cases`, when None) and, with ``rounds``, the model's cached rounds of a run (see
    :func:`rounds_file`) as a "model" row, whose budget is capped at the most rounds a question has.
    ``max_rounds``: ``{label: rounds collected}`` for the given ``cases``."""
    cases = dict(cases) if cases is not None else {"simulation": simulation_cases()}
    caps, notes = dict(max_rounds or {}), {}
    if "simulation" in cases:
        notes["simulation"] = "labelled loop simulation (simulated_cases), no model"
    if rounds is not None:
        path = rounds_file(rounds)
        model = load_rounds(path)
        cases["model"] = model
        caps["model"] = max((len(r) for _, r in model), default=1) or 1
        notes["model"] = f"cached rounds from {path}"
    return STIETuner(cases, caps, config, notes)


def stie_tuner_app(rounds: str | Path | None = None) -> STIETuner:
    """The Voilà app's tuner: :func:`stie_tuner` on the simulation plus the cached rounds that ``rounds``
    or, when None, ``$KUNLUNLAB_ROUNDS`` names. Rounds that cannot be read are reported above the tuner
    (the simulation still shows) instead of failing the app."""
    rounds = rounds if rounds is not None else (os.environ.get(ROUNDS_ENV) or None)
    try:
        return stie_tuner(rounds=rounds)
    except (OSError, ValueError, KeyError, TypeError) as err:
        tuner = stie_tuner()
        problem = widgets.HTML(f"<p style='color:#c33'>{ROUNDS_ENV}={html.escape(str(rounds))}: "
                               f"{html.escape(f'{type(err).__name__}: {err}')}; showing the simulation only</p>")
        problem.add_class("kl-problem")
        tuner.children = (problem, *tuner.children)
        return tuner


__all__ = ["REWARD_WEIGHTS", "ROUNDS_ENV", "RewardExplorer", "STIETuner", "load_rounds", "reward_explorer",
           "rounds_file", "simulation_cases", "stie_tuner", "stie_tuner_app"]
