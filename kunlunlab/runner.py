"""Runs the notebook series headlessly with papermill (what `make run` does).

Each notebook gets ``run_dir`` (its own folder inside the run) and ``smoke`` as parameters, writes its
figures and a ``metrics.json`` there; the runner gathers those into ``summary.json``/``summary.md``.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from kunlunlab.paths import PROJECT_ROOT, new_run_dir

NOTEBOOK_DIR = PROJECT_ROOT / "notebooks"


def notebooks(only: list[str] | None = None) -> list[Path]:
    found = sorted(p for p in NOTEBOOK_DIR.glob("[0-9][0-9]_*.ipynb"))
    if only:
        found = [p for p in found if any(p.name.startswith(prefix) for prefix in only)]
    return found


def run_notebook(path: Path, run_dir: Path, smoke: bool = False, extra: dict | None = None) -> dict:
    import papermill as pm

    out_dir = run_dir / path.stem
    out_dir.mkdir(parents=True, exist_ok=True)
    params = {"run_dir": str(out_dir), "smoke": smoke, **(extra or {})}
    start = time.perf_counter()
    record = {"notebook": path.name, "executed": str(run_dir / path.name)}
    try:
        pm.execute_notebook(str(path), str(run_dir / path.name), parameters=params, cwd=str(path.parent),
                            kernel_name="python3", progress_bar=False)
        record["ok"] = True
    except pm.PapermillExecutionError as err:
        record.update(ok=False, error=f"{err.ename}: {err.evalue}", cell=err.exec_count)
    record["seconds"] = round(time.perf_counter() - start, 1)
    metrics = out_dir / "metrics.json"
    record["metrics"] = json.loads(metrics.read_text()) if metrics.is_file() else None
    return record


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
USES_TRAINED_MODEL = ("05_stie_tuning", "06_evaluation")


def run_notebooks(out_dir: str | Path | None = None, smoke: bool = False, only: list[str] | None = None,
                  params: dict[str, dict] | None = None) -> dict:
    """Runs the series in order. Once notebook 04 has trained a model, notebooks 05 and 06 get it as their
    ``model`` parameter (unless ``params`` names one), so the series studies the trained agent."""
    from kunlunlab.training.pipeline import trained_model

    run_dir = Path(out_dir) if out_dir else new_run_dir()
    run_dir.mkdir(parents=True, exist_ok=True)
    records = []
    trained: Path | None = None
    for path in notebooks(only):
        print(f"[run] {path.name} ...", flush=True)
        extra = dict((params or {}).get(path.stem, {}))
        if trained is not None and path.stem in USES_TRAINED_MODEL and "model" not in extra:
            extra["model"] = str(trained)
            print(f"[run] {path.name}: model = {trained} (trained by {TRAINING_NOTEBOOK})", flush=True)
        record = run_notebook(path, run_dir, smoke=smoke, extra=extra)
        if path.stem == TRAINING_NOTEBOOK and record["ok"]:
            trained = trained_model(run_dir / path.stem)
        print(f"[run] {path.name}: {'ok' if record['ok'] else 'FAILED: ' + record['error']} ({record['seconds']}s)",
              flush=True)
        records.append(record)
    summary = {"run_dir": str(run_dir), "smoke": smoke, "ok": all(r["ok"] for r in records) and bool(records),
               "notebooks": records}
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    lines = [f"# Run {run_dir.name}", ""]
    for r in records:
        lines.append(f"## {r['notebook']} — {'ok' if r['ok'] else 'FAILED'} in {r['seconds']} s")
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
