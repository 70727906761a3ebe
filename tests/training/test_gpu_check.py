"""The prepared GPU check (experiments/scripts/gpu_check.py) runs every part at toy size on the CPU and writes
one JSON with each part's numbers: the script a GPU session runs first is itself tested here."""
import json
import subprocess
import sys

import pytest

from kunlunlab.paths import PROJECT_ROOT

pytestmark = pytest.mark.slow


def test_the_gpu_check_runs_every_part_at_toy_size_and_writes_one_json(tmp_path):
    out = tmp_path / "gpu_check.json"
    done = subprocess.run([sys.executable, "experiments/scripts/gpu_check.py", "--tiny", "--out", str(out)],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert json.loads(done.stdout.strip().splitlines()[-1]) == report  # the JSON is also the last line printed
    for part in ("generation", "lora_step", "full_step", "dapo_step", "exact_search"):
        assert "error" not in report[part], (part, report[part])
    gen = report["generation"]
    assert gen["engine_tokens"] == gen["batch"] * gen["new_tokens"] and gen["engine_over_generate"] > 0
    # LoRA trains a small fraction of what the full-parameter step trains
    assert 0 < report["lora_step"]["trainable_params"] < report["full_step"]["trainable_params"] / 100
    assert report["dapo_step"]["steps"] == 1 and report["dapo_step"]["sequences"] == 4
    search = report["exact_search"]
    assert search["gpu"]["backend"] == "torch" and search["cpu"]["backend"] == "faiss"
    assert search["gpu"]["n"] == search["cpu"]["n"] == 20000


def test_the_gpu_check_says_so_in_one_line_when_there_is_no_gpu(tmp_path):
    pytest.importorskip("torch")
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    done = subprocess.run([sys.executable, "experiments/scripts/gpu_check.py", "--out", str(tmp_path / "x.json")],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "gpu_check: no CUDA GPU visible (use --tiny to test the script on a CPU)"]
