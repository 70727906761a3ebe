"""A smoke training run with LoRA adapters (peft through TRL's ``peft_config``) and TensorBoard tracking: each
stage trains an adapter and leaves a whole merged model that loads like any checkpoint, and the trainers' and
the evaluations' numbers are in event files inside the run folder, read back here with TensorBoard's reader."""
import json

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from kunlunlab.models import load_llm
from kunlunlab.training.pipeline import SMOKE_OVERRIDES, train
from kunlunlab.training.config import load_config

# BM25 retrieval (no corpus embedding) and no HotpotQA keep the run to the stages themselves
OVERRIDES = {**SMOKE_OVERRIDES, "hotpot": False, "index_kind": "bm25", "eval.before": False,
             "lora.enabled": True, "lora.r": 4, "lora.alpha": 8, "lora.target_modules": ["q_proj", "v_proj"],
             "sft.learning_rate": 1e-2, "report_to": "tensorboard"}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("lora")
    summary = train(load_config(None, OVERRIDES), run_dir)
    return run_dir, summary


def _scalars(folder) -> dict[str, list[float]]:
    values = {}
    for events in folder.rglob("events.out.tfevents.*"):
        acc = EventAccumulator(str(events.parent))
        acc.Reload()
        for tag in acc.Tags()["scalars"]:
            values.setdefault(tag, []).extend(e.value for e in acc.Scalars(tag))
    return values


def test_lora_stages_leave_whole_models_with_the_adapter_merged(run):
    run_dir, summary = run
    assert summary["steps_by_stage"] == {"sft": 2, "dapo": 1}
    base, _ = load_llm()
    base_params = dict(base.named_parameters())
    for stage in ("sft", "dapo"):
        final = run_dir / stage / "final"
        assert not (final / "adapter_config.json").exists(), f"{stage}: an adapter instead of a whole model"
        model, _ = load_llm(str(final))
        params = dict(model.named_parameters())
        assert set(params) == set(base_params), stage  # no lora_A/lora_B left, no base_model prefix
    sft, _ = load_llm(str(run_dir / "sft" / "final"))
    sft_params = dict(sft.named_parameters())
    # the adapter was on q_proj and v_proj only: those moved, the MLP and the norms did not
    moved = {n for n, p in sft_params.items() if not torch.equal(p, base_params[n])}
    assert moved and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in moved), sorted(moved)[:5]


def test_trainers_and_evaluations_write_tensorboard_events_inside_the_run(run):
    run_dir, _ = run
    sft, dapo, evals = _scalars(run_dir / "sft"), _scalars(run_dir / "dapo"), _scalars(run_dir / "runs" / "eval")
    assert any(tag.endswith("loss") for tag in sft), sorted(sft)
    assert any("reward" in tag for tag in dapo), sorted(dapo)
    state = json.loads((run_dir / "state.json").read_text())
    assert evals["eval_after/world/em"] == [pytest.approx(state["eval_after"]["world"]["em"])]
    # the jsonl logs are written either way
    assert (run_dir / "sft_log.jsonl").is_file() and (run_dir / "dapo_rollouts.jsonl").is_file()
