"""What a device call carries stays within its 64 MiB with room to spare: the tracked tree plus the GPU check's wheels
and tokenizer (.gpu_check/, recorded in experiments/configs/gpu_check/carried.json by gpu_check_prepare.sh) at most
40 MiB. Kept per-question records are stored gzipped (every reader takes ``x.jsonl.gz`` for ``x.jsonl``:
kunlunlab.paths.read_jsonl); uncompressed they were 27.9 MB of a 30 MB tree, 55 of the 64 MiB with .gpu_check."""
import json
import subprocess
from pathlib import Path

import pytest

from kunlunlab.paths import PROJECT_ROOT

LIMIT_MIB = 40


def _tracked() -> list[Path]:
    done = subprocess.run(["git", "ls-files", "-z"], cwd=PROJECT_ROOT, capture_output=True)
    if done.returncode != 0:
        pytest.skip("not a git checkout")
    return [PROJECT_ROOT / name for name in done.stdout.decode().split("\0") if name]


def test_the_tracked_tree_and_what_the_gpu_check_carries_stay_under_40_mib():
    files = [p for p in _tracked() if p.is_file()]
    tracked = sum(p.stat().st_size for p in files)
    carried = json.loads((PROJECT_ROOT / "experiments/configs/gpu_check/carried.json").read_text())["bytes"]
    by_folder: dict[str, int] = {}
    for p in files:
        top = "/".join(p.relative_to(PROJECT_ROOT).parts[:2])
        by_folder[top] = by_folder.get(top, 0) + p.stat().st_size
    largest = sorted(by_folder.items(), key=lambda kv: -kv[1])[:5]
    assert tracked + carried <= LIMIT_MIB * 2**20, (
        f"tracked {tracked / 2**20:.1f} MiB + .gpu_check {carried / 2**20:.1f} MiB > {LIMIT_MIB} MiB; largest: {largest}")


def test_kept_records_are_stored_compressed():
    raw = [str(p.relative_to(PROJECT_ROOT)) for p in _tracked()
           if p.parts[-3:-1] and "results" in p.parts and p.suffix == ".jsonl"]
    assert raw == [], f"gzip these (gzip -n -9), readers take the .gz: {raw}"


def test_a_compressed_record_reads_as_the_plain_one(tmp_path):
    import gzip

    from kunlunlab.paths import jsonl_path, read_jsonl

    rows = [{"id": "q1", "em": 1.0}, {"id": "q2", "em": 0.0}]
    (tmp_path / "eval_after_world.jsonl.gz").write_bytes(gzip.compress("\n".join(map(json.dumps, rows)).encode()))
    assert jsonl_path(tmp_path / "eval_after_world.jsonl").name == "eval_after_world.jsonl.gz"
    assert read_jsonl(tmp_path / "eval_after_world.jsonl") == rows
