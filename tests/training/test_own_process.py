"""A training stage in its own process (``own_process_stages``, make run's notebook 04 on a CPU, issue 54): the
stage trains in a child that gives its heap back when it exits, and the run goes on from the stage's final model,
with the child's messages and progress bar shown by the parent and a failing child reported in one error."""
import json

import pytest
import torch

from kunlunlab.models import load_llm
from kunlunlab.training import pipeline
from kunlunlab.training.config import load_config
from kunlunlab.training.own_process import StageProcessError, run_in_own_process
from kunlunlab.training.pipeline import SMOKE_OVERRIDES, TrainingRun
from kunlunlab.training.progress import BarFromEvents, EventBar

CONFIG = "experiments/configs/training/train_embedded_cpu.json"


def _refuse(*args, **kwargs):
    raise AssertionError("a stage of own_process_stages trained in the parent process")


@pytest.mark.slow
def test_sft_and_dapo_train_in_child_processes_and_the_run_reads_them_back(tmp_path, tiny_model, monkeypatch, capfd):
    # the parent cannot train: had it trained either stage itself, these would fail the run
    monkeypatch.setattr(pipeline, "run_sft", _refuse)
    monkeypatch.setattr(pipeline, "run_dapo", _refuse)
    cfg = load_config(CONFIG, {**SMOKE_OVERRIDES, "hotpot": False, "model": tiny_model,
                               "own_process_stages": ["sft", "dapo"]})
    said = []
    run = TrainingRun(cfg, tmp_path, progress=said.append)
    run.evaluate("before")
    run.mix()
    run.sft()
    sft_weights = load_llm(str(tmp_path / "sft" / "final"))[0].state_dict()
    assert all(torch.equal(value, sft_weights[name]) for name, value in run.model.state_dict().items())
    run.dapo()
    run.evaluate("after")
    summary = run.finish()

    state = json.loads((tmp_path / "state.json").read_text())
    assert state["sft_done"] and state["dapo_done"] and summary["steps_by_stage"] == {"sft": 2, "dapo": 1}
    assert set(state["seconds"]) >= {"sft", "dapo"}  # the children's records, kept when the parent wrote after them
    dapo_weights = load_llm(str(tmp_path / "dapo" / "final"))[0].state_dict()
    assert all(torch.equal(value, dapo_weights[name]) for name, value in run.model.state_dict().items())
    # the DAPO child trained on from SFT's model, not the base model: its weights moved a little from SFT's
    base_weights = load_llm(tiny_model)[0].state_dict()
    trained = [name for name in sft_weights if not torch.equal(sft_weights[name], base_weights[name])]
    assert trained
    assert all((dapo_weights[n] - sft_weights[n]).abs().max() < (sft_weights[n] - base_weights[n]).abs().max()
               for n in trained)
    # the children's lines reached the parent's progress; their bars were redrawn here (tqdm writes to stderr)
    assert any(line.startswith("SFT done: 2 steps") for line in said)
    assert any(line.startswith("DAPO done: 1 steps") for line in said)
    err = capfd.readouterr().err
    assert "SFT: 100%" in err and "2/2" in err and "DAPO: 100%" in err
    assert (tmp_path / "sft" / "process.log").is_file() and (tmp_path / "dapo" / "process.log").is_file()


def test_a_failing_stage_process_is_one_error_quoting_its_log(tmp_path):
    with pytest.raises(StageProcessError) as caught:
        run_in_own_process(tmp_path, "sft", print)  # no train_config.json: the child cannot start the run
    message = str(caught.value)
    assert message.startswith("the sft stage's process exited with 1")
    assert "train_config.json" in message and str(tmp_path / "sft" / "process.log") in message


def test_own_process_stages_refuse_callbacks_and_unknown_stages(tmp_path, tiny_model):
    with pytest.raises(ValueError, match=r"own_process_stages: unknown stage\(s\) \['eval'\]"):
        load_config(CONFIG, {"own_process_stages": ["eval"]})
    cfg = load_config(CONFIG, {**SMOKE_OVERRIDES, "model": tiny_model, "own_process_stages": ["dapo"]})
    with pytest.raises(ValueError, match="cannot call this process's trainer callbacks"):
        TrainingRun(cfg, tmp_path, dapo_callbacks=[object()])


def test_a_childs_bar_events_redraw_the_same_bar(capsys):
    bar = EventBar(total=4, initial=1, desc="DAPO")
    bar.update(2)
    bar.set_postfix({"reward": "0.5"})
    bar.close()
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 4
    redrawn = BarFromEvents()
    assert redrawn.feed(lines[0]) and redrawn.bar.total == 4 and redrawn.bar.n == 1
    assert redrawn.feed(lines[1]) and redrawn.bar.n == 3
    assert redrawn.feed(lines[2]) and redrawn.bar.postfix == "reward=0.5"
    assert redrawn.feed(lines[3]) and redrawn.bar is None
    assert not redrawn.feed("SFT done: 2 steps in 1.0 s")
