"""Runs the notebook series headlessly with papermill (what `make run` does).

The runner executes the notebooks' jupytext sources (``notebooks/NN_name.py``, what a user edits; the paired
``.ipynb`` is kept in step by jupytext and checked by the tests). Each notebook gets ``run_dir`` (its own
folder inside the run) and ``smoke`` as parameters and writes its figures and a ``metrics.json`` there; the
run folder also receives the executed notebook and a static HTML rendering of it (every plotly figure
embedded, every equation as MathML so the page needs no network), and the runner gathers the metrics into
``summary.json``/``summary.md``. Nothing is written into ``notebooks/``.
"""
from __future__ import annotations

import ast
import copy
import dataclasses
import json
import re
import sys
import threading
import time
import typing
from pathlib import Path

import nbformat
import psutil
from latex2mathml.converter import convert as latex_to_mathml
from nbconvert import HTMLExporter

from kunlunlab.configs import ConfigError, build_dataclass
from kunlunlab.paths import PROJECT_ROOT, new_run_dir

NOTEBOOK_DIR = PROJECT_ROOT / "notebooks"


def notebooks(only: list[str] | None = None) -> list[Path]:
    """The series in order: each notebook's jupytext source (``.py``), or its ``.ipynb`` where it has none."""
    sources = {p.stem: p for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb")}
    sources.update({p.stem: p for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.py")})
    found = [sources[stem] for stem in sorted(sources)]
    if only:
        found = [p for p in found if any(p.name.startswith(prefix) for prefix in only)]
    return found


def select_notebooks(only: list[str] | None = None) -> list[Path]:
    """:func:`notebooks`, refusing an ``only`` prefix that matches none (a typo must not run nothing, silently)."""
    found = notebooks(only)
    unmatched = [prefix for prefix in only or [] if not any(p.name.startswith(prefix) for p in found)]
    if unmatched:
        raise ConfigError(f"no notebook matches --only {' '.join(unmatched)}; the notebooks: "
                          + ", ".join(p.stem for p in notebooks()))
    return found


def read_notebook(path: Path):
    """The notebook as nbformat reads it, from a jupytext source (``.py``) or an ``.ipynb``."""
    import jupytext  # deferred: the runner process stays light; kernels do the work

    return jupytext.read(path)


def pairing_problems(directory: Path | None = None) -> list[str]:
    """What is wrong with the notebook pairs in ``directory``: a ``.py`` source without its ``.ipynb``, a pair
    whose cells differ (one side edited without jupytext), or a committed ``.ipynb`` carrying outputs."""
    problems = []
    for source in sorted(Path(directory or NOTEBOOK_DIR).glob("[0-9][0-9]_*.py")):
        paired = source.with_suffix(".ipynb")
        if not paired.is_file():
            problems.append(f"{source.name}: no paired {paired.name} (run `jupytext --sync {source}`)")
            continue
        nb = nbformat.read(paired, as_version=4)
        if [(c.cell_type, c.source) for c in nb.cells] != [(c.cell_type, c.source) for c in read_notebook(source).cells]:
            problems.append(f"{paired.name} is out of step with {source.name} (run `jupytext --sync {source}`)")
        if any(c.get("outputs") or c.get("execution_count") is not None for c in nb.cells if c.cell_type == "code"):
            problems.append(f"{paired.name} carries outputs (clear them; executed copies belong in run folders)")
    return problems


# code (fenced blocks, spans) is left as written; outside it, $$display$$ and $inline$ math (not an escaped \$)
_CODE = re.compile(r"(```.*?```|`[^`\n]*`)", re.S)
_MATH = re.compile(r"\$\$(.+?)\$\$|(?<![\\$])\$([^$\n]+?)\$", re.S)


def markdown_math_to_mathml(markdown: str) -> str:
    """``markdown`` with its LaTeX math as MathML, which browsers render without a script: the static pages
    then show the equations offline (nbconvert's MathJax comes from a CDN). A formula latex2mathml cannot
    convert is left as written (the page then shows its source, as it would without MathJax)."""

    def one(match: re.Match) -> str:
        display = match.group(1) is not None
        try:
            mathml = latex_to_mathml((match.group(1) if display else match.group(2)).strip(),
                                     display="block" if display else "inline")
        except Exception:  # latex2mathml raises many types on unsupported input; the source stays readable
            return match.group(0)
        return mathml.replace("\\_", "_")

    return "".join(part if _CODE.fullmatch(part) else _MATH.sub(one, part) for part in _CODE.split(markdown))


def render_html(executed: Path) -> Path:
    """A static HTML page of an executed notebook (outputs included, equations as MathML), beside it."""
    nb = nbformat.read(executed, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = markdown_math_to_mathml(cell.source)
    body, _ = HTMLExporter().from_notebook_node(nb)
    out = executed.with_suffix(".html")
    out.write_text(body, encoding="utf-8")
    return out


class PeakMemory:
    """The peak resident memory of this process's descendants (a notebook's kernel and whatever it starts:
    accelerate ranks, a retrieval service, Ray workers), sampled every ``interval`` seconds while the block
    runs: what a laptop must hold beside the runner itself. ``peak_bytes`` after the block."""

    def __init__(self, interval: float = 0.5):
        self.interval, self.peak_bytes = interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _current(self) -> int:
        total = 0
        for child in psutil.Process().children(recursive=True):
            try:
                total += child.memory_info().rss
            except (psutil.NoSuchProcess, psutil.AccessDenied):  # a child that ended between listing and reading
                continue
        return total

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self._current())
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakMemory":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def run_notebook(path: Path, run_dir: Path, smoke: bool = False, extra: dict | None = None,
                 progress: bool = False) -> dict:
    """Executes one notebook into ``run_dir/<stem>.ipynb`` (+ ``.html``); its own outputs go to ``run_dir/<stem>/``.
    ``progress`` shows papermill's per-cell progress bar and streams what the cells print (the training
    stages' progress lines, for example) to this process's stdout as it happens."""
    import papermill as pm  # deferred: the runner process stays light; kernels do the work

    out_dir = run_dir / path.stem
    out_dir.mkdir(parents=True, exist_ok=True)
    params = {"run_dir": str(out_dir), "smoke": smoke, **(extra or {})}
    params = {k: v for k, v in params.items() if k not in RUNNER_PARAMETERS or k in parameter_cell(path)}
    executed = run_dir / f"{path.stem}.ipynb"
    start = time.perf_counter()
    record = {"notebook": path.stem, "source": path.name, "executed": str(executed)}
    with PeakMemory() as memory:
        try:
            pm.execute_notebook(read_notebook(path), str(executed), parameters=params, cwd=str(path.parent),
                                kernel_name="python3", progress_bar=progress,
                                stdout_file=sys.stdout if progress else None)
            record["ok"] = True
        except pm.PapermillExecutionError as err:
            record.update(ok=False, error=f"{err.ename}: {err.evalue}", cell=err.exec_count)
    record["seconds"] = round(time.perf_counter() - start, 1)
    record["peak_rss_gb"] = round(memory.peak_bytes / 2**30, 2)
    if executed.is_file():  # a failed notebook is rendered too: the page shows where it stopped
        record["html"] = str(render_html(executed))
    metrics = out_dir / "metrics.json"
    record["metrics"] = json.loads(metrics.read_text()) if metrics.is_file() else None
    return record


# ---------------------------------------------------------------------------- notebook parameters
# A parameter whose default is None says nothing of its type: a string (a path, a model, a URL) unless named here.
NONE_DEFAULT_TYPES: dict[str, object] = {"dapo_learning_rate": float | None}
# The parameters the runner itself passes (the run folder, smoke sizes) or hands from notebook 04 to the later ones.
RUNNER_PARAMETERS = ("run_dir", "smoke", "model", "ref_run", "baseline_records")
# Notebooks whose ``config`` parameter is a training config and this parameter its overrides: checked as a
# TrainConfig before the run, so a typo in a key or a value fails here, not in the notebook's first cell.
TRAIN_OVERRIDE_PARAMETERS = {"02_data_mixing": "overrides", "04_training": "overrides",
                             "07_process_rewards": "sft_overrides"}


def _literal_type(value) -> object:
    """The type of a parameter's default as the parameters cell writes it (``[1, 2]`` -> ``list[int]``)."""
    if isinstance(value, (list, tuple)):
        kinds = {type(v) for v in value}
        return list[kinds.pop()] if len(kinds) == 1 and not kinds & {list, tuple, dict} else list
    return type(value)


def parameter_cell(path: Path) -> dict[str, tuple[object, object]]:
    """A notebook's parameters: name -> (type, default), read from the cell tagged ``parameters`` (papermill's
    own parser drops a line whose comment holds ``=``). An annotated parameter (``x: int | None = None``) has its
    annotation; else the type of its literal default (None: a string, unless :data:`NONE_DEFAULT_TYPES` names
    it); a default that is no literal accepts any value."""
    cells = [c for c in read_notebook(path).cells
             if c.cell_type == "code" and "parameters" in c.get("metadata", {}).get("tags", [])]
    found: dict[str, tuple[object, object]] = {}
    for cell in cells:
        for node in ast.parse(cell.source).body:
            target, annotation = None, None
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                target = node.targets[0].id
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                target = node.target.id
                annotation = eval(compile(ast.Expression(node.annotation), str(path), "eval"),  # noqa: S307
                                  {"Literal": typing.Literal, "Any": typing.Any, "Optional": typing.Optional})
            if target is None:
                continue
            try:
                default = ast.literal_eval(node.value)
            except ValueError:  # an expression (e.g. a computed path): its value is not known before the run
                found[target] = (annotation or typing.Any, None)
                continue
            if annotation is None:
                annotation = NONE_DEFAULT_TYPES.get(target, str | None) if default is None else _literal_type(default)
            found[target] = (annotation, default)
    return found


def parameter_class(path: Path) -> type:
    """A notebook's parameters as a config dataclass (one field each, typed as :func:`parameter_cell` reads
    them), so its papermill values are checked as ``--set`` values are: unknown names and wrong types refused."""
    fields = []
    for name, (annotation, default) in parameter_cell(path).items():
        fields.append((name, annotation, dataclasses.field(default_factory=lambda d=default: copy.deepcopy(d))))
    return dataclasses.make_dataclass(f"Parameters_{path.stem}", fields)


def check_params(series: list[Path], params: dict[str, dict] | None, smoke: bool = False) -> None:
    """Every notebook's parameters of ``params`` checked against its parameters cell before the first cell of
    the first notebook runs: an unknown name or a value of the wrong type is one :class:`ConfigError` line
    naming the notebook, the parameter and what it expects. Training overrides are checked as a TrainConfig."""
    for path in series:
        given = dict((params or {}).get(path.stem, {}))
        build_dataclass(parameter_class(path), given, f"notebook {path.stem}")
        key = TRAIN_OVERRIDE_PARAMETERS.get(path.stem)
        if key and given.get(key):
            from kunlunlab.training.pipeline import run_config  # deferred: torch and TRL stay out until needed

            defaults = {name: default for name, (_, default) in parameter_cell(path).items()}
            config = given.get("config", defaults.get("config"))
            try:
                run_config(config, dict(given[key]), smoke=smoke)
            except FileNotFoundError as err:
                raise ConfigError(f"notebook {path.stem}: config={config!r}: {err}") from err
            except ValueError as err:
                raise ConfigError(f"notebook {path.stem}: {key}: {err}") from err


def load_params(path: str | Path | None) -> dict[str, dict]:
    """A JSON file mapping notebook stems (e.g. ``01_index_build``) to papermill parameters."""
    if path is None:
        return {}
    try:
        params = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise ValueError(f"cannot read notebook parameters from {path}: {err}") from err
    known = {p.stem for p in notebooks()}
    if not isinstance(params, dict) or not all(isinstance(v, dict) for v in params.values()):
        raise ValueError(f"{path}: expected an object of notebook name -> parameter object")
    unknown = set(params) - known
    if unknown:
        raise ValueError(f"{path}: unknown notebooks {sorted(unknown)}; known: {sorted(known)}")
    return params


def markdown_table(header: list, rows: list[list]) -> list[str]:
    """A notebook's table (``metrics["tables"]``) as markdown lines for ``summary.md``."""
    def cell(value) -> str:
        return "–" if value is None else str(value).replace("|", "/")

    return ["| " + " | ".join(cell(h) for h in header) + " |", "|" + "---|" * len(header),
            *("| " + " | ".join(cell(v) for v in row) + " |" for row in rows)]


TRAINING_NOTEBOOK = "04_training"
USES_TRAINED_MODEL = ("05_stie_tuning", "06_evaluation")   # get notebook 04's final model as `model`
USES_TRAINING_RUN = ("07_process_rewards",)                # get notebook 04's run folder as `ref_run`
EVALUATION_NOTEBOOK = "06_evaluation"
USES_BASELINE_RECORDS = ("08_peers",)   # get notebook 06's records folder: its prompt baselines on the base model


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during a series: which notebook it stopped, the run folder and the notebooks not finished, so
    the caller can say how to go on (``summary.json`` there lists the finished ones)."""

    def __init__(self, run_dir: Path, notebook: str, remaining: list[str]):
        super().__init__(f"interrupted during {notebook}")
        self.run_dir, self.notebook, self.remaining = run_dir, notebook, remaining


def run_notebooks(out_dir: str | Path | None = None, smoke: bool = False, only: list[str] | None = None,
                  params: dict[str, dict] | None = None, progress: bool = False) -> dict:
    """Runs the series in order. Once notebook 04 has trained a model, notebooks 05 and 06 get it as their
    ``model`` parameter and notebook 07 its run folder as ``ref_run`` (unless ``params`` names them), so the
    series studies the trained agent and compares the other recipes from the same SFT checkpoint; a run
    folder that already holds 04's trained model (a series continued with ``only``) hands that one on.
    Every notebook's ``params`` are checked first (:func:`check_params`): a bad one stops the series before
    anything runs. Ctrl-C writes the summary of the notebooks finished and raises :class:`RunInterrupted`."""
    from kunlunlab.training.pipeline import trained_model  # deferred: torch and TRL stay out of the runner process

    series = select_notebooks(only)
    check_params(series, params, smoke)
    # absolute: the notebooks run with notebooks/ as their working directory, where a relative run folder
    # would land otherwise
    run_dir = Path(out_dir).resolve() if out_dir else new_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    records = []
    trained: Path | None = None
    if TRAINING_NOTEBOOK not in {p.stem for p in series}:
        trained = trained_model(run_dir / TRAINING_NOTEBOOK)
    for problem in pairing_problems():  # the runner executes the .py sources either way
        print(f"[run] warning: {problem}", flush=True)
    started = time.perf_counter()
    try:
        _run_series(series, run_dir, smoke, params, progress, records, trained, started)
    except KeyboardInterrupt as stop:
        done = {r["notebook"] for r in records}
        remaining = [p.stem for p in series if p.stem not in done]
        _write_summary(run_dir, smoke, records, interrupted=remaining[0] if remaining else None)
        raise RunInterrupted(run_dir, remaining[0] if remaining else series[-1].stem, remaining) from stop
    return _write_summary(run_dir, smoke, records)


def _run_series(series: list[Path], run_dir: Path, smoke: bool, params: dict[str, dict] | None, progress: bool,
                records: list[dict], trained: Path | None, started: float) -> None:
    """The notebooks of ``series`` one after the other, each record appended to ``records`` as it finishes."""
    from kunlunlab.training.pipeline import trained_model  # deferred: torch and TRL stay out of the runner process

    for number, path in enumerate(series, 1):
        print(f"[run] {number}/{len(series)} {path.stem} (source {path.name}; {time.perf_counter() - started:.0f} s "
              f"elapsed) ...", flush=True)
        extra = dict((params or {}).get(path.stem, {}))
        if trained is not None and path.stem in USES_TRAINED_MODEL and "model" not in extra:
            extra["model"] = str(trained)
            print(f"[run] {path.name}: model = {trained} (trained by {TRAINING_NOTEBOOK})", flush=True)
        if trained is not None and path.stem in USES_TRAINING_RUN and "ref_run" not in extra:
            extra["ref_run"] = str(run_dir / TRAINING_NOTEBOOK)
            print(f"[run] {path.name}: ref_run = {extra['ref_run']}", flush=True)
        evaluated = run_dir / EVALUATION_NOTEBOOK / "records"
        if path.stem in USES_BASELINE_RECORDS and "baseline_records" not in extra and evaluated.is_dir():
            extra["baseline_records"] = str(evaluated)
            print(f"[run] {path.name}: baseline_records = {evaluated}", flush=True)
        record = run_notebook(path, run_dir, smoke=smoke, extra=extra, progress=progress)
        if path.stem == TRAINING_NOTEBOOK and record["ok"]:
            trained = trained_model(run_dir / path.stem)
        print(f"[run] {path.stem}: {'ok' if record['ok'] else 'FAILED: ' + record['error']} ({record['seconds']} s, "
              f"peak {record['peak_rss_gb']} GiB resident; "
              f"executed copy {record['executed']})", flush=True)
        records.append(record)


def _write_summary(run_dir: Path, smoke: bool, records: list[dict], interrupted: str | None = None) -> dict:
    """``summary.json`` and ``summary.md`` of the notebooks run (``interrupted``: the one Ctrl-C stopped)."""
    summary = {"run_dir": str(run_dir), "smoke": smoke,
               "ok": all(r["ok"] for r in records) and bool(records) and interrupted is None, "notebooks": records}
    if interrupted:
        summary["interrupted"] = interrupted
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    lines = [f"# Run {run_dir.name}", ""]
    for r in records:
        lines.append(f"## {r['notebook']} — {'ok' if r['ok'] else 'FAILED'} in {r['seconds']} s, "
                     f"peak {r['peak_rss_gb']} GiB resident")
        metrics = dict(r.get("metrics") or {})
        tables = metrics.pop("tables", {})
        for key, value in metrics.items():
            lines.append(f"- {key}: {json.dumps(value)}")
        for title, table in tables.items():
            lines += ["", f"### {title}", "", *markdown_table(table["header"], table["rows"])]
        lines.append("")
    (run_dir / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))
    return summary
