"""The prepared GPU check (experiments/scripts/gpu_check.py) runs every part at toy size on the CPU and writes
one JSON with each part's numbers: the script a GPU session runs first is itself tested here.

Its tests (marker ``gpuenv``) belong to the environments a GPU node installs: ``make test-gpuenv``
(experiments/scripts/gpu_env.py) runs the check once in each and points ``KUNLUNLAB_GPU_CHECK_REPORT`` at its JSON,
so these tests read that run instead of a second one; ``make test`` leaves them out (``pytest -m gpuenv`` runs them in
this environment, the check included)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kunlunlab.paths import PROJECT_ROOT

pytestmark = pytest.mark.slow

# the report of a check already run in this environment (gpu_env.py): its stdout lies beside its folder
REPORT_ENV = "KUNLUNLAB_GPU_CHECK_REPORT"

PARTS = ("generation", "agreement_fp32", "lora_step", "dapo_step", "full_step", "exact_search", "end_to_end")


@pytest.fixture(scope="module")
def check(tmp_path_factory):
    if os.environ.get(REPORT_ENV):
        out = Path(os.environ[REPORT_ENV])
        return out.parent, json.loads(out.read_text()), out.parent.with_suffix(".stdout").read_text()
    folder = tmp_path_factory.mktemp("out")
    out = folder / "gpu_check.json"
    done = subprocess.run([sys.executable, "experiments/scripts/gpu_check.py", "--tiny", "--out", str(out)],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, json.loads(out.read_text()), done.stdout


@pytest.mark.gpuenv
def test_every_part_reports_numbers_and_the_json_is_the_last_line(check):
    folder, report, stdout = check
    assert json.loads(stdout.strip().splitlines()[-1]) == report
    for part in PARTS:
        assert "error" not in report[part] and "skipped" not in report[part], (part, report[part])
    assert report["packages"]["transformers"] == report["transformers"]
    search = report["exact_search"]
    assert search["gpu"]["backend"] == "torch" and search["cpu"]["backend"] == "faiss"
    assert search["gpu"]["n"] == search["cpu"]["n"] == 20000


@pytest.mark.gpuenv
def test_only_the_json_and_the_log_are_written_beside_it(check):
    """A device call brings back 8 files of 16 MiB at most: the DAPO checkpoint and the end-to-end run go to /tmp."""
    folder, report, _ = check
    assert sorted(p.name for p in folder.iterdir()) == ["gpu_check.json", "gpu_check.log"]
    assert "$ kunlunlab train" in (folder / "gpu_check.log").read_text()


@pytest.mark.gpuenv
def test_generation_compares_the_engine_s_greedy_tokens_with_generate_s(check):
    gen = check[1]["generation"]
    assert gen["engine_tokens"] == gen["batch"] * gen["new_tokens"] and gen["engine_over_generate"] > 0
    # float32 on the CPU: the engine's greedy tokens are generate's, row for row
    assert gen["greedy_rows_identical"] == 1.0 and gen["greedy_shared_prefix"] == 1.0
    assert gen["generate_batch_vs_single_shared_prefix"] == 1.0


@pytest.mark.gpuenv
def test_the_float32_agreement_pads_prompts_of_different_lengths_and_matches_generate_alone(check):
    agree = check[1]["agreement_fp32"]
    assert agree["dtype"] == "float32" and agree["prompt_tokens"][0] < agree["prompt_tokens"][1]
    assert agree["engine_vs_single_generate"] == {"rows_identical": 1.0, "shared_prefix": 1.0}
    assert agree["padded_generate_vs_single_generate"] == {"rows_identical": 1.0, "shared_prefix": 1.0}


@pytest.mark.gpuenv
def test_training_parts_train_what_they_should(check):
    report = check[1]
    # LoRA trains a small fraction of what the full-parameter step trains
    assert 0 < report["lora_step"]["trainable_params"] < report["full_step"]["trainable_params"] / 100
    assert report["dapo_step"]["steps"] == 1 and report["dapo_step"]["sequences"] == 4


@pytest.mark.gpuenv
def test_the_end_to_end_run_trains_with_the_lora_recipe_and_evaluates_before_and_after(check):
    e2e = check[1]["end_to_end"]
    train, evaluate = e2e["train"], e2e["eval"]
    assert train["rc"] == 0 and evaluate["rc"] == 0
    assert train["steps"] == {"sft": 1, "dapo": 2}
    assert set(train["stage_seconds"]) == {"sft", "dapo"} and all(s > 0 for s in train["stage_seconds"].values())
    assert set(train["peak_gpu_gb_per_stage"]) == {"eval_before", "sft", "dapo", "eval_after"}  # None on a CPU
    assert train["heldout_questions"] == 4 and len(train["world_em_before_after"]) == 2
    assert evaluate["n"] == 4


def test_the_gpu_check_says_so_in_one_line_when_there_is_no_gpu(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    done = subprocess.run([sys.executable, "experiments/scripts/gpu_check.py", "--out", str(tmp_path / "x.json")],
                          cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "gpu_check: no CUDA GPU visible (use --tiny to test the script on a CPU)"]
