"""Keeping a finished run's records (experiments/scripts/keep_runs.py): what the readers of kept records need
survives, gzipped byte-for-byte reproducibly; token ids and log-probabilities go; an unfinished run is refused.
The script runs in this process (its ``main``), as a command once: the refusal's exit code and one line."""
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

from kunlunlab.eval.arms import arm_table
from kunlunlab.paths import jsonl_path, read_jsonl
from kunlunlab.training.records import heldout_records

SCRIPT = "experiments/scripts/keep_runs.py"


def _keep_runs(*argv, capsys) -> str:
    """``keep_runs.py ARGV`` in this process (a subprocess spends ~10 s importing on 2 cores): its stdout."""
    spec = importlib.util.spec_from_file_location("keep_runs", Path(__file__).resolve().parents[2] / SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(a) for a in argv]) == 0
    return capsys.readouterr().out


def _run(folder, finished=True):
    folder.mkdir(parents=True)
    record = {"id": "q1", "em": 100.0, "answer_source": "answer_tag", "searches": 2, "seconds": 1.5,
              "trajectory": {"prompt_ids": [1, 2, 3], "completion_ids": [4, 5, 6], "logprobs": [-0.1, -0.2, -0.3],
                             "mask": [1, 0, 1], "doc_ids": ["d1", "d2"], "text": "<think>a</think>"}}
    for stage in ("sft", "after"):
        (folder / f"eval_{stage}_world.jsonl").write_text(json.dumps(record) + "\n")
    (folder / "dapo_log.jsonl").write_text('{"step": 1, "clip_ratio/high_mean": 0.0}\n')
    (folder / "train_config.json").write_text('{"seed": 0}')
    if finished:
        (folder / "training_summary.json").write_text("{}")


def test_a_kept_run_reads_back_as_the_run_without_token_ids(tmp_path, capsys):
    _run(tmp_path / "runs" / "t.kunlun.s0")
    out = tmp_path / "kept"
    for attempt in range(2):
        stdout = _keep_runs(tmp_path / "runs", out, "t.kunlun.s0", capsys=capsys)
        if attempt == 0:
            first = (out / "t.kunlun.s0" / "eval_after_world.jsonl.gz").read_bytes()
    assert (out / "t.kunlun.s0" / "eval_after_world.jsonl.gz").read_bytes() == first  # gzip -n: reproducible
    kept = out / "t.kunlun.s0"
    assert not (kept / "eval_after_world.jsonl").exists() and jsonl_path(kept / "eval_after_world.jsonl").is_file()
    (record,) = heldout_records(kept, "world")
    assert record["trajectory"] == {"mask": [1, 0, 1], "doc_ids": ["d1", "d2"], "text": "<think>a</think>"}
    assert read_jsonl(jsonl_path(kept / "dapo_log.jsonl")) == [{"step": 1, "clip_ratio/high_mean": 0.0}]
    # the cost columns still count the model's tokens from the mask: 2 of the 3
    header, rows, _ = arm_table({"kunlun": {0: {"sft": heldout_records(kept, "world", "sft"),
                                                "rl": heldout_records(kept, "world")}}}, "kunlun")
    assert rows[0][header.index("tokens/q")] in (2, 2.0, "2", "2.0")
    assert json.loads(stdout.strip().splitlines()[-1])["kept"]["t.kunlun.s0"][:2] == ["train_config.json",
                                                                                         "training_summary.json"]


def test_an_unfinished_run_is_refused_in_one_line(tmp_path):
    _run(tmp_path / "runs" / "t.kunlun.s0", finished=False)
    proc = subprocess.run([sys.executable, SCRIPT, str(tmp_path / "runs"), str(tmp_path / "kept"), "t.kunlun.s0"],
                          capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stderr.strip().splitlines() == [
        f"keep_runs.py: {tmp_path / 'runs' / 't.kunlun.s0'} has not finished (no training_summary.json); nothing kept"]
    assert not (tmp_path / "kept").exists()


def test_a_suite_s_records_are_kept_with_their_configs(tmp_path, capsys):
    records = tmp_path / "runs" / "t.suite" / "records"
    records.mkdir(parents=True)
    (records / "world.ircot.jsonl").write_text(json.dumps({"id": "q1", "em": 0.0, "trajectory": {
        "completion_ids": [1, 2], "mask": [1, 1], "text": "x"}}) + "\n")
    (records / "world.ircot.jsonl.config.json").write_text('{"method": "ircot"}')
    _keep_runs(tmp_path / "runs", tmp_path / "kept", "t.suite", capsys=capsys)
    kept = tmp_path / "kept" / "t.suite" / "records"
    assert sorted(p.name for p in kept.iterdir()) == ["world.ircot.jsonl.config.json", "world.ircot.jsonl.gz"]
    assert read_jsonl(jsonl_path(kept / "world.ircot.jsonl")) == [
        {"id": "q1", "em": 0.0, "trajectory": {"mask": [1, 1], "text": "x"}}]
