"""The training config defines each value once: keys that moved are read with one warning line, fields the
chosen settings make inert are named in one warning line, the shipped configs carry none of either, and the
dataclass defaults are the `kunlun` recipe. Expected values are written out by hand."""
from __future__ import annotations

import dataclasses
import json
import logging
import re
import warnings

import pytest

from kunlunlab.configs import leaf_paths, read_config_file
from kunlunlab.paths import PROJECT_ROOT
from kunlunlab.studies.training_variants import reference_mismatch
from kunlunlab.training.config import DAPOStageConfig, SFTStageConfig, TrainConfig, inert_fields, load_config
from kunlunlab.training.dapo import grpo_args
from kunlunlab.training.dpo import DPOStageConfig, dpo_args
from kunlunlab.training.rewards import RewardConfig
from kunlunlab.training.sft import sft_args
from kunlunlab.training.mixing import MixingConfig
from kunlunlab.data.splits import load_splits
from kunlunlab.training.pipeline import RunFolderConflict, check_run_folder, mix_training_data

CPU = PROJECT_ROOT / "experiments/configs/training/train_embedded_cpu.json"
SHIPPED = sorted((PROJECT_ROOT / "experiments/configs/training").glob("train_*.json"))
KEPT = sorted((PROJECT_ROOT / "experiments/results").glob("**/train_config.json"))


def _warnings(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.name == "kunlunlab.training.config" and r.levelno == logging.WARNING]


def test_mixing_keeps_no_copy_of_the_runs_retrieval_sizes_or_seed():
    assert not {"top_k", "max_result_chars", "seed"} & {f.name for f in dataclasses.fields(MixingConfig)}
    with pytest.raises(TypeError):
        MixingConfig(top_k=2)


def test_a_moved_key_is_read_with_one_warning_line_and_has_no_effect(tmp_path, caplog):
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"top_k": 1, "seed": 5, "mixing": {"top_k": 4, "max_result_chars": 90, "epochs": 2}}))
    with caplog.at_level(logging.WARNING):
        cfg = load_config(path)
    assert (cfg.top_k, cfg.max_result_chars, cfg.seed, cfg.mixing.epochs) == (1, 300, 5, 2)
    assert _warnings(caplog) == [f"{path}: mixing.top_k, mixing.max_result_chars moved to top_k, max_result_chars; "
                                 "the value given here is ignored (as it always was: the run's own value applied)"]


def test_every_kept_run_record_loads(caplog):
    assert len(KEPT) >= 30
    for path in KEPT:
        load_config(path)
    # this record's SFT data was written with one passage per search although its mixing section says 2
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        cfg = load_config(PROJECT_ROOT / "experiments/results/planfree_makerun/train_config.json")
    assert (cfg.top_k, cfg.max_result_chars, cfg.seed) == (1, 300, 0)
    assert sum("mixing.top_k, mixing.max_result_chars, mixing.seed moved" in m for m in _warnings(caplog)) == 1


def test_fields_made_inert_are_named_in_one_warning_line(tmp_path, caplog):
    path = tmp_path / "inert.json"
    path.write_text(json.dumps({"agent": {"rdra": {"use_plan": False, "plan_k": 1, "plan_tokens": 48,
                                                   "max_plan_queries": 3}},  # 3 is the default: not named
                                "lora": {"enabled": True}, "sft": {"train_layers": 4}}))
    with caplog.at_level(logging.WARNING):
        load_config(path)
    assert _warnings(caplog) == [f"{path}: set but inert, without effect: agent.rdra.plan_k, agent.rdra.plan_tokens "
                                 "(with agent.rdra.use_plan=false); sft.train_layers (with lora.enabled=true)"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # --set overrides count as set
        load_config(None, ["mixing.stie_feedback_share=0", "mixing.stie_wrong_first=0.9"])
    assert _warnings(caplog) == ["config: set but inert, without effect: mixing.stie_wrong_first "
                                 "(with mixing.stie_feedback_share=0)"]
    caplog.clear()
    with caplog.at_level(logging.WARNING):  # with the plan on, the same sizes are read: nothing to report
        load_config(None, {"agent.rdra.plan_k": 1, "agent.rdra.plan_tokens": 48, "sft.train_layers": 4})
    assert _warnings(caplog) == []


def test_shipped_configs_set_no_inert_or_moved_key(caplog):
    assert {p.name for p in SHIPPED} >= {"train_embedded_cpu.json", "train_qwen7b_lora_1gpu.json",
                                         "train_qwen_multigpu.json"}
    for path in SHIPPED:
        with caplog.at_level(logging.WARNING):
            cfg = load_config(path)
        assert not leaf_paths(read_config_file(path)) & set(inert_fields(cfg)), path
    assert _warnings(caplog) == []


def test_make_runs_config_resolves_to_its_recipe():
    cfg = load_config(CPU)
    assert (cfg.top_k, cfg.max_result_chars, cfg.seed, cfg.index_kind, cfg.embedder) == (1, 300, 0, "flat", None)
    rdra = cfg.agent.rdra
    assert (rdra.use_plan, rdra.background_k, rdra.max_docs, rdra.max_doc_chars) == (False, 3, 3, 300)
    m = cfg.mixing
    assert (m.rdra_background, m.stie_feedback_share, m.stie_wrong_first, m.first_turn_samples, m.hotpot_share,
            m.samples_per_epoch, m.background_facts) == (True, 0.25, 0.5, 40, 0.2, 64, 0.0)
    assert cfg.sft.train_layers == 12 and cfg.agent.method == cfg.eval.method == "kunlun"
    # plan-free RDRA never reads these, so whatever their values the run is the same
    assert {"agent.rdra.plan_k", "agent.rdra.plan_tokens", "agent.rdra.max_plan_queries", "agent.rdra.background_share",
            "mixing.plan_samples"} <= set(inert_fields(cfg))
    multi = load_config(PROJECT_ROOT / "experiments/configs/training/train_qwen_multigpu.json")
    assert (multi.top_k, multi.max_result_chars, multi.mixing.rdra_background, multi.mixing.plan_samples,
            multi.mixing.stie_feedback_share) == (3, 600, False, 0, 0.0)


def test_the_defaults_are_the_kunlun_recipe():
    cfg = TrainConfig()
    assert cfg.agent.method == cfg.eval.method == "kunlun" and cfg.agent.rdra.use_plan is True
    assert (cfg.mixing.rdra_background, cfg.mixing.plan_samples, cfg.mixing.stie_feedback_share) == (True, 12, 0.25)
    assert not {"mixing.plan_samples", "mixing.background_facts", "mixing.stie_wrong_first", "agent.rdra.plan_k",
                "sft.train_layers"} & set(inert_fields(cfg))  # every part of the recipe acts


def test_sft_data_uses_the_runs_retrieval_sizes_and_seed():
    sizes = {"world_passages": 600, "train_questions": 24, "hotpot": False, "index_kind": "bm25",
             "mixing.epochs": 1, "mixing.samples_per_epoch": 4, "mixing.first_turn_samples": 0,
             "mixing.plan_samples": 0, "mixing.stie_feedback_share": 0.0, "mixing.rdra_background": False}
    cfg = load_config(None, {**sizes, "top_k": 1, "max_result_chars": 40, "seed": 3})
    trajs = mix_training_data(cfg, load_splits(cfg.splits()))
    blocks = [s["text"] for t in trajs for s in t.segments if s["role"] == "env"]
    assert len(trajs) == 4 and blocks
    passages = [line for b in blocks for line in b.splitlines() if re.match(r"\(\d+\) ", line)]
    assert passages and not any(line.startswith("(2) ") for line in passages)  # top_k 1: one passage a query
    assert max(len(line) for line in passages) <= len("(1) ") + 40 + len("…")  # max_result_chars 40
    again = mix_training_data(cfg, load_splits(cfg.splits()))
    other = load_config(None, {**sizes, "top_k": 1, "max_result_chars": 40, "seed": 4})
    assert [t.question for t in again] == [t.question for t in trajs]        # the seed draws the mix ...
    assert [t.question for t in mix_training_data(other, load_splits(other.splits()))] != [t.question for t in trajs]


def test_a_run_folder_of_the_same_effective_config_resumes(tmp_path):
    cfg = load_config(CPU)
    saved = cfg.to_dict()
    saved["mixing"].update({"top_k": 2, "max_result_chars": 300, "seed": 0})  # written before the keys moved
    saved["agent"]["rdra"].update({"plan_k": 1, "plan_tokens": 48})           # inert: RDRA runs plan-free
    (tmp_path / "train_config.json").write_text(json.dumps(saved))
    check_run_folder(cfg, tmp_path)
    saved["sft"]["learning_rate"] = 1e-4
    (tmp_path / "train_config.json").write_text(json.dumps(saved))
    with pytest.raises(RunFolderConflict, match=r"differs in \['agent', 'mixing', 'sft'\]"):
        check_run_folder(cfg, tmp_path)


def test_a_reference_run_recorded_before_the_move_is_not_reported_as_different():
    reference = {"top_k": 1, "mixing": {"top_k": 2, "max_result_chars": 300, "seed": 0, "epochs": 3}}
    assert reference_mismatch(reference, {"top_k": 1, "mixing": {"epochs": 3}}) == ([], [])
    assert reference_mismatch(reference, {"top_k": 2, "mixing": {"epochs": 3}}) == ([], ["top_k"])


@pytest.mark.parametrize("checkpointing", [False, True])
def test_the_trainers_arguments_use_no_deprecated_names(tmp_path, checkpointing):
    """The executed notebooks carry no FutureWarning from the package's own calls: SFT, DAPO and DPO arguments
    name activation checkpointing as the installed transformers does (``activation_checkpointing`` from 5.23,
    ``gradient_checkpointing`` before: the lock's 5.22 and the GPU side's 5.17), and the value reaches the arguments."""
    from kunlunlab.training.compat import checkpointing_args

    (name,) = checkpointing_args(checkpointing)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        built = [sft_args(SFTStageConfig(), tmp_path / "sft", 0, gradient_checkpointing=checkpointing),
                 grpo_args(DAPOStageConfig(), RewardConfig(), tmp_path / "dapo", 0, gradient_checkpointing=checkpointing,
                           world_size=1),
                 dpo_args(DPOStageConfig(), tmp_path / "dpo", 0, gradient_checkpointing=checkpointing)]
    assert [getattr(args, name) for args in built] == [checkpointing] * 3
