"""DAPO's batch geometry as a user states it and TRL receives it; `kunlunlab train --dry-run` prints it
without loading anything and refuses a geometry that does not divide, in one line. The commands run in this
process (``kunlunlab.cli.main``; a subprocess spends ~9 s importing on 2 cores): their exit code through the
installed console script is tests/project/test_cli.py's."""
import json
from types import SimpleNamespace

import pytest

from kunlunlab.cli import main
from kunlunlab.training.config import DAPOStageConfig, load_config
from kunlunlab.training.geometry import GeometryError, batch_plan, world_size_from_env
from kunlunlab.paths import PROJECT_ROOT

MULTI_GPU = PROJECT_ROOT / "experiments/configs/training/train_qwen_multigpu.json"
ONE_GPU = PROJECT_ROOT / "experiments/configs/training/train_qwen7b_lora_1gpu.json"


def test_a_rollout_batch_splits_into_updates_micro_batches_and_processes():
    # 56 prompts x 8 samples over 7 processes: 64 sequences each; 4 updates of 16; micro-batch 2 -> 8 accumulations
    plan = batch_plan(DAPOStageConfig(prompts_per_step=56, num_generations=8, micro_batch_size=2,
                                      updates_per_generation=4, steps=500), world_size=7)
    assert (plan.prompts_per_process, plan.sequences_per_process) == (8, 64)
    assert (plan.micro_batch_size, plan.gradient_accumulation_steps, plan.updates_per_generation) == (2, 8, 4)
    assert plan.sequences_per_update == 16 * 7 and plan.rollout_batches == 125
    # TRL generates once per steps_per_generation micro-batches and steps the optimizer every accumulation
    assert plan.trl_args() == {"per_device_train_batch_size": 2, "gradient_accumulation_steps": 8,
                               "steps_per_generation": 32, "num_iterations": 1}


def test_the_cpu_default_is_one_update_over_the_whole_batch_as_make_run_measured_it():
    plan = batch_plan(DAPOStageConfig(), world_size=1)
    assert plan.trl_args() == {"per_device_train_batch_size": 8, "gradient_accumulation_steps": 1,
                               "steps_per_generation": 1, "num_iterations": 1}


@pytest.mark.parametrize("fields, world, message", [
    ({"prompts_per_step": 32}, 7, "multiple of 7"),
    ({"prompts_per_step": 2, "num_generations": 3, "updates_per_generation": 4}, 1, "do not split into"),
    ({"micro_batch_size": 3}, 1, "does not divide the 8 sequences"),
    ({"steps": 7, "updates_per_generation": 2}, 1, "not a multiple of dapo.updates_per_generation=2"),
    ({"updates_per_generation": 0}, 1, "at least 1"),
])
def test_a_geometry_that_does_not_divide_is_refused_naming_the_numbers(fields, world, message):
    with pytest.raises(GeometryError, match=message):
        batch_plan(DAPOStageConfig(**fields), world_size=world)


def test_world_size_comes_from_the_launcher(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert world_size_from_env() == 4
    monkeypatch.setenv("WORLD_SIZE", "four")
    with pytest.raises(GeometryError, match="WORLD_SIZE"):
        world_size_from_env()


def _command(capsys, *argv) -> SimpleNamespace:
    """``kunlunlab ARGV``: its exit code, stdout and stderr."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return SimpleNamespace(returncode=code, stdout=out, stderr=err)


def _dry_run(capsys, *args):
    return _command(capsys, "train", "--dry-run", *args)


def test_dry_run_prints_the_multi_gpu_recipe_plan_as_one_json_line(capsys):
    done = _dry_run(capsys, "--config", str(MULTI_GPU), "--world-size", "7")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout.strip().splitlines()[-1])
    for key in ("world_size", "prompts_per_step", "generations_per_prompt", "micro_batch_size",
                "gradient_accumulation_steps", "updates_per_generation", "model_dtype", "device", "generation"):
        assert key in plan, key
    # the goals: a micro-batch that fits 80 GB with a 7B model, and updates that let clip-higher bind
    assert plan["micro_batch_size"] <= 8 and plan["updates_per_generation"] >= 2
    assert (plan["world_size"], plan["model_dtype"], plan["device"], plan["generation"]) == (
        7, "bfloat16", "cuda", "vllm-server")
    one = json.loads(_dry_run(capsys, "--config", str(ONE_GPU)).stdout.strip().splitlines()[-1])
    assert one["lora"] and one["gradient_checkpointing"] and one["updates_per_generation"] >= 2


def test_dry_run_refuses_an_inconsistent_geometry_in_one_line(capsys):
    done = _dry_run(capsys, "--set", "dapo.micro_batch_size=3")
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        "kunlunlab train: dapo.micro_batch_size=3 does not divide the 8 sequences each process feeds one update "
        "(8 per rollout batch / 1 updates)"]


def test_recipes_load_and_every_shipped_training_config_has_a_valid_geometry():
    for path in sorted((PROJECT_ROOT / "experiments/configs/training").glob("*.json")):
        if path.name.startswith("deepspeed"):
            continue
        cfg = load_config(path)
        world = 7 if cfg.dapo.use_vllm else 1
        batch_plan(cfg.dapo, world)  # raises on a shipped config that does not divide


def test_a_device_this_machine_lacks_is_one_line_for_train_and_serve_llm(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    train = _command(capsys, "train", "--set", "device=cuda")
    serve = _command(capsys, "serve-llm", "--device", "cuda")
    for done, command in ((train, "train"), (serve, "serve-llm")):
        assert done.returncode != 0 and "Traceback" not in done.stderr, done.stderr[-2000:]
        assert done.stderr.strip().splitlines()[-1] == (
            f"kunlunlab {command}: device 'cuda' asked for, but torch sees no CUDA GPU (use device=auto or cpu)")
    # a dry run plans for hardware this machine lacks: the recipe's device is reported as configured
    assert json.loads(_dry_run(capsys, "--set", "device=cuda").stdout.strip().splitlines()[-1])["device"] == "cuda"
