"""Where things live: the cache, the shared benchmark data, the run folders."""
from __future__ import annotations

import os
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Cache for converted checkpoints, embeddings and indexes (``KUNLUNLAB_CACHE`` overrides)."""
    root = Path(os.environ.get("KUNLUNLAB_CACHE", Path.home() / ".cache" / "kunlunlab"))
    root.mkdir(parents=True, exist_ok=True)
    return root


def shared_data_dir() -> Path | None:
    """The benchmark data folder (``KUNLUNLAB_DATA`` overrides ``../shared/data``); None when absent."""
    env = os.environ.get("KUNLUNLAB_DATA")
    candidates = [Path(env)] if env else [PROJECT_ROOT.parent / "shared" / "data", PROJECT_ROOT / "shared" / "data"]
    for path in candidates:
        if path.is_dir():
            return path
    return None


def new_run_dir(base: str | Path | None = None, name: str | None = None) -> Path:
    """A fresh ``experiments/runs/<timestamp>`` folder."""
    base = Path(base) if base else PROJECT_ROOT / "experiments" / "runs"
    run = base / (name or time.strftime("%Y%m%d-%H%M%S"))
    run.mkdir(parents=True, exist_ok=True)
    return run


def notebook_run_dir(run_dir: str | Path | None, notebook: str) -> Path:
    """The folder a notebook writes into: ``run_dir`` when given (``make run`` passes one), else a new
    ``experiments/runs/<timestamp>-<notebook>`` folder, so two interactive runs never share one and nothing
    lands in ``notebooks/``."""
    if run_dir:
        path = Path(run_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = PROJECT_ROOT / "experiments" / "runs"
    path, n = base / f"{stamp}-{notebook}", 1
    while path.exists():
        n += 1
        path = base / f"{stamp}-{notebook}-{n}"
    path.mkdir(parents=True)
    return path


def jsonl_path(path: str | Path) -> Path:
    """``path``, or ``path.gz`` where only the compressed file is there: kept records under experiments/results are
    stored gzipped (the tree travels to a GPU machine within 64 MiB), and every reader finds them either way."""
    path = Path(path)
    compressed = path.with_name(path.name + ".gz")
    return compressed if not path.is_file() and compressed.is_file() else path


def read_jsonl(path: str | Path) -> list[dict]:
    """The JSON lines of ``path`` (or of ``path.gz``, see :func:`jsonl_path`), blank lines skipped."""
    import gzip
    import json

    path = jsonl_path(path)
    text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
