import json
import subprocess
import sys
from pathlib import Path

import pytest

from kunlunlab.cli import build_parser, eval_config_from_args, main
from kunlunlab.retrieval import load_retriever


def test_build_index_then_load(tmp_path, capsys):
    out = tmp_path / "idx"
    assert main(["build-index", "--corpus", "world", "--n", "400", "--kind", "bm25", "--out", str(out)]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["n"] == 400 and report["kind"] == "bm25"
    hits = load_retriever(out).search(["Who founded a company?"], k=3)
    assert len(hits[0]) == 3


# ---------------------------------------------------------------------------- kunlunlab eval
def _one_error_line(capsys, argv) -> str:
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code != 0 and captured.out == ""
    assert len(lines) == 1 and lines[0].startswith("kunlunlab eval: ") and "Traceback" not in captured.err
    return lines[0]


def test_eval_unknown_dataset_and_method_are_one_line_errors(capsys):
    assert "'no_such_set' is neither 'world'" in _one_error_line(capsys, ["eval", "--dataset", "no_such_set"])
    assert "method='magic': expected one of 'naive_gen'" in _one_error_line(capsys, ["eval", "--dataset", "world",
                                                                                     "--method", "magic"])


def test_eval_malformed_data_file_is_a_one_line_error(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "Who?", "golden_answers": ["x"]}\n{oops\n')
    line = _one_error_line(capsys, ["eval", "--dataset", str(bad)])
    assert str(bad) in line and "line 2" in line and "invalid JSON" in line


def test_eval_missing_benchmark_folder_is_a_one_line_error(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("KUNLUNLAB_DATA", str(tmp_path / "absent"))
    assert "no benchmark data folder" in _one_error_line(capsys, ["eval", "--dataset", "bamboogle"])


def test_eval_malformed_checkpoint_settings_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "kunlunlab_agent.json").write_text('{"top_k": "three"}')
    line = _one_error_line(capsys, ["eval", "--dataset", "world", "--model", str(tmp_path)])
    assert "kunlunlab_agent.json" in line and "'top_k' must be int" in line


def test_eval_error_exit_has_no_traceback_in_a_subprocess():
    proc = subprocess.run([sys.executable, "-m", "kunlunlab.cli", "eval", "--dataset", "no_such_set"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("kunlunlab eval: ")


def test_eval_flags_beat_checkpoint_settings_beat_defaults(tmp_path):
    (tmp_path / "kunlunlab_agent.json").write_text(json.dumps({"method": "agent", "top_k": 1, "stie_rounds": 4,
                                                               "use_stie": True, "max_searches": 3}))
    args = build_parser().parse_args(["eval", "--dataset", "world", "--model", str(tmp_path), "--top-k", "5",
                                      "--no-stie", "--no-rdra"])
    config = eval_config_from_args(args)
    r = config.rollout
    assert (config.method, r.top_k, config.stie.max_rounds, r.max_searches) == ("agent", 5, 4, 3)
    assert config.use_stie is False and config.use_rdra is False  # flags win over the saved use_stie=True
    assert r.max_turn_tokens == 256 and config.judge is None  # neither given nor saved: defaults
    plain = eval_config_from_args(build_parser().parse_args(["eval", "--dataset", "world", "--stie-rounds", "2"]))
    assert (plain.method, plain.rollout.top_k, plain.stie.max_rounds, plain.use_rdra) == ("kunlun", 3, 2, True)


def test_eval_applies_the_checkpoints_retrieval_and_stie_below_flags_and_set(tmp_path):
    (tmp_path / "kunlunlab_agent.json").write_text(json.dumps({
        "method": "kunlun", "index_kind": "bm25", "embedder": "intfloat/e5-base-v2", "top_k": 1,
        "stie": {"delta1": 0.7, "max_rounds": 4}}))
    saved = eval_config_from_args(build_parser().parse_args(["eval", "--dataset", "world", "--model", str(tmp_path)]))
    assert (saved.index_kind, saved.embedder, saved.stie.delta1, saved.stie.max_rounds) == \
        ("bm25", "intfloat/e5-base-v2", 0.7, 4)
    args = build_parser().parse_args(["eval", "--dataset", "world", "--model", str(tmp_path), "--index-kind", "flat",
                                      "--embedder", "all-MiniLM-L6-v2", "--set", "stie.delta1=0.5"])
    config = eval_config_from_args(args)
    assert (config.index_kind, config.embedder, config.stie.delta1, config.stie.max_rounds) == \
        ("flat", "all-MiniLM-L6-v2", 0.5, 4)  # the checkpoint's round budget stays


def test_suite_flags_name_the_index_and_embedder():
    args = build_parser().parse_args(["suite", "--index-kind", "bm25", "--embedder", "intfloat/e5-base-v2"])
    assert (args.index_kind, args.embedder) == ("bm25", "intfloat/e5-base-v2")
    plain = build_parser().parse_args(["suite"])
    assert (plain.index_kind, plain.embedder) == (None, None)  # None: the checkpoint's, else the defaults


def test_eval_config_file_and_set_sit_between_flags_and_checkpoint(tmp_path, capsys):
    (tmp_path / "kunlunlab_agent.json").write_text(json.dumps({"method": "agent", "top_k": 1, "max_searches": 3}))
    cfg_file = tmp_path / "eval.json"
    cfg_file.write_text(json.dumps({"_comment": "x", "dataset": "world", "limit": 7, "rollout": {"top_k": 2},
                                    "rdra": {"background_k": 4}, "index_kind": "bm25"}))
    args = build_parser().parse_args(["eval", "--config", str(cfg_file), "--model", str(tmp_path),
                                      "--set", "rdra.plan_k=3", "limit=9", "--top-k", "6"])
    config = eval_config_from_args(args)
    assert (config.dataset, config.limit, config.index_kind) == ("world", 9, "bm25")  # --set beats the file
    assert config.rollout.top_k == 6                             # the flag beats the file and the checkpoint
    assert (config.method, config.rollout.max_searches) == ("agent", 3)  # not in the file: the checkpoint's
    assert (config.rdra.background_k, config.rdra.plan_k) == (4, 3)
    shipped = build_parser().parse_args(["eval", "--config", "experiments/configs/eval/world_kunlun.json"])
    assert eval_config_from_args(shipped).rdra.max_docs == 3
    cfg_file.write_text(json.dumps({"dataset": "world", "top_k": 2}))  # a rollout field at the top level
    assert main(["eval", "--config", str(cfg_file)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kunlunlab eval: ") and "unknown keys ['top_k']" in err and "\n" not in err
    assert main(["eval", "--config", str(tmp_path / "missing.json")]) == 2
    assert "eval config not found" in capsys.readouterr().err
    assert main(["eval", "--method", "kunlun"]) == 2
    assert "no dataset" in capsys.readouterr().err


def test_eval_without_out_writes_a_new_run_folder(tmp_path, monkeypatch, capsys):
    import kunlunlab.paths as paths

    original = paths.new_run_dir
    monkeypatch.setattr(paths, "new_run_dir", lambda base=None, name=None: original(tmp_path, name))
    assert main(["eval", "--dataset", "world", "--method", "naive_gen", "--limit", "1", "--index-kind", "bm25",
                 "--set", "rollout.max_turn_tokens=16"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    records = tmp_path.glob("eval-world-naive_gen-*/records.jsonl")
    out = next(records)
    assert summary["out"] == str(out) and str(out) in lines[0]
    assert len(out.read_text().splitlines()) == 1 and (out.parent / "summary.json").is_file()
    assert summary["lj"] is None and summary["judge"] is None


@pytest.mark.parametrize("flag", ["--judge", "--judge-url", "--stie-rounds", "--no-rdra", "--no-stie"])
def test_eval_help_lists_the_flag(flag, capsys):
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert flag in capsys.readouterr().out


# ---------------------------------------------------------------------------- kunlunlab suite
def _suite_records(ems: list[float], method: str) -> list[dict]:
    return [{"id": f"q{i}", "em": em, "f1": em, "lj": None, "searches": 2} for i, em in enumerate(ems)]


def test_suite_writes_table2_and_ablations_from_the_records(tmp_path, monkeypatch, capsys):
    """The CLI maps flags and --set onto SuiteConfig and turns the suite's records into the same tables as
    notebook 06 (values below are the hand-computed means of the records)."""
    import kunlunlab.studies.suite as suite

    seen = {}

    def fake_run_suite(cfg, out_dir, backend=None, progress=print):
        seen["cfg"] = cfg
        result = suite.SuiteResult()
        result.records = {"world": {"naive_rag": _suite_records([0, 0, 0, 0], "naive_rag"),
                                    "kunlun": _suite_records([1, 1, 0, 0], "kunlun")}}
        result.ablations = {"world": {"kunlun": result.records["world"]["kunlun"],
                                      "−RDRA": _suite_records([1, 0, 0, 0], "−RDRA")}}
        result.summaries = [{"dataset": "world", "variant": "kunlun", "em": 0.5}]
        return result

    monkeypatch.setattr(suite, "run_suite", fake_run_suite)
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    out = tmp_path / "suite"
    code = main(["suite", "--model", str(checkpoint), "--out", str(out),
                 "--set", "world_questions=7", 'baselines=["naive_rag"]', 'ablations=["−RDRA"]'])
    assert code == 0
    assert seen["cfg"].world_questions == 7 and seen["cfg"].baselines == ("naive_rag",)
    assert seen["cfg"].model == str(checkpoint)
    tables = (out / "tables.md").read_text()
    assert "## Table 2 (EM / LJ %)" in tables and "## Ablations on world" in tables  # notebook 06's titles
    # each row names its model: the baseline on the untrained backbone, kunlun on the checkpoint
    assert "| naive_rag | SmolLM2-135M-Instruct (embedded) | 0.0 | – |" in tables
    assert f"| kunlun | {checkpoint} | 50.0 | – |" in tables
    assert "| −RDRA | 4 | 25.0 | 25.0 | 2.0 | -25.0 [" in tables
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["out"] == str(out) and last["em"] == {"world/kunlun": 0.5}
    assert json.loads((out / "suite_summary.json").read_text())["config"]["world_questions"] == 7


@pytest.mark.parametrize("argv, message", [
    (["suite", "--set", "no_such_key=1"], "unknown keys ['no_such_key']"),
    (["suite", "--model", "/no/such/checkpoint"], "checkpoint not found: /no/such/checkpoint"),
    (["suite", "--set", 'ablations=["−NOPE"]'], "ablations[0]='−NOPE': expected one of '−RDRA'"),
    (["suite", "--config", "/no/such/suite.json"], "suite config not found"),
])
def test_suite_input_errors_are_one_line(argv, message, capsys):
    code = main(argv)
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("kunlunlab suite: ") and message in lines[0]
    assert "Traceback" not in captured.err


def test_train_arms_script_refuses_an_incomplete_arm_list():
    """experiments/scripts/train_arms.sh needs OUT, the common sets and NAME/SETS pairs; anything else is a
    usage line and exit 2, before any training starts."""
    from kunlunlab.paths import PROJECT_ROOT

    script = PROJECT_ROOT / "experiments" / "scripts" / "train_arms.sh"
    for args in ([], ["out"], ["out", "common", "only_a_name"]):
        proc = subprocess.run(["bash", str(script), *args], capture_output=True, text=True, timeout=30)
        assert proc.returncode == 2 and proc.stderr.startswith("usage: ")


# ---------------------------------------------------------------------------- one convention for every command
# bad input: one line on stderr, exit 2; a fault during the work: one line, exit 1; Ctrl-C: one line, exit 130
KUNLUNLAB = [str(Path(sys.executable).parent / "kunlunlab")] if (Path(sys.executable).parent / "kunlunlab").is_file() \
    else [sys.executable, "-m", "kunlunlab.cli"]


def _tiny_corpus(tmp_path, n: int = 5) -> str:
    path = tmp_path / f"corpus{n}.jsonl"
    path.write_text("".join(json.dumps({"id": str(i), "contents": f'"T{i}"\npassage {i}'}) + "\n" for i in range(n)))
    return str(path)


def _index_folder(tmp_path) -> str:
    folder = tmp_path / "old_index"
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"kind": "flat", "n": 7}))
    (folder / "index.faiss").write_text("")
    return str(folder)


def _params(tmp_path, params: dict) -> str:
    path = tmp_path / "params.json"
    path.write_text(json.dumps(params))
    return str(path)


# (case, argv given tmp_path, what the one stderr line says); every one exits 2 before any work starts
BAD_INPUT = [
    ("train --set dapo.learning_rate=abc", lambda t: ["train", "--dry-run", "--set", "dapo.learning_rate=abc"],
     "kunlunlab train: config: dapo.learning_rate='abc': expected a number > 0"),
    ("train --set sft.learning_rate=abc (no --dry-run)", lambda t: ["train", "--set", "sft.learning_rate=abc"],
     "kunlunlab train: config: sft.learning_rate='abc': expected a number > 0"),
    ("train --set sft.batch_size=-4", lambda t: ["train", "--dry-run", "--set", "sft.batch_size=-4"],
     "kunlunlab train: config: sft.batch_size=-4: expected an integer > 0"),
    ("train --set sft.batch_size=0", lambda t: ["train", "--dry-run", "--set", "sft.batch_size=0"],
     "kunlunlab train: config: sft.batch_size=0: expected an integer > 0"),
    ("eval --set rollout.top_k=abc", lambda t: ["eval", "--dataset", "world", "--set", "rollout.top_k=abc"],
     "kunlunlab eval: eval config: rollout.top_k='abc': expected an integer > 0"),
    ("build-index, 5 passages, default kind", lambda t: ["build-index", "--corpus", _tiny_corpus(t), "--out", str(t / "i")],
     "kunlunlab build-index: a corpus of 5 passages is too small for --kind cluster, which needs at least 16"),
    ("build-index, 5 passages, --kind ivfpq",
     lambda t: ["build-index", "--corpus", _tiny_corpus(t), "--kind", "ivfpq", "--out", str(t / "i")],
     "kunlunlab build-index: a corpus of 5 passages is too small for --kind ivfpq, which needs at least 1024"),
    ("build-index, --out holds another index",
     lambda t: ["build-index", "--corpus", _tiny_corpus(t), "--kind", "flat", "--out", _index_folder(t)],
     "holds a flat index of 7 passages: pass --overwrite to replace it"),
    ("build-index --engine stream, 5 passages",
     lambda t: ["build-index", "--corpus", _tiny_corpus(t), "--engine", "stream", "--out", str(t / "i")],
     "kunlunlab build-index: a corpus of 5 passages is too small for --kind cluster"),
    ("build-index --kind nope", lambda t: ["build-index", "--kind", "nope", "--out", str(t / "i")],
     "kunlunlab build-index: argument --kind: invalid choice: 'nope'"),
    ("run-notebooks --only 99_nope", lambda t: ["run-notebooks", "--only", "99_nope", "--out", str(t / "r")],
     "kunlunlab run-notebooks: no notebook matches --only 99_nope; the notebooks: 01_index_build"),
    ("run-notebooks --params, unknown notebook",
     lambda t: ["run-notebooks", "--params", _params(t, {"99_nope": {}}), "--out", str(t / "r")],
     "unknown notebooks ['99_nope']"),
    ("run-notebooks --params, unknown parameter",
     lambda t: ["run-notebooks", "--only", "03", "--params", _params(t, {"03_reward_design": {"w_nope": 1}}),
                "--out", str(t / "r")],
     "kunlunlab run-notebooks: notebook 03_reward_design: unknown keys ['w_nope']"),
    ("run-notebooks --params, wrong type",
     lambda t: ["run-notebooks", "--only", "03", "--params", _params(t, {"03_reward_design": {"w_format": "high"}}),
                "--out", str(t / "r")],
     "kunlunlab run-notebooks: notebook 03_reward_design: w_format='high': expected a number"),
    ("run-notebooks --params, bad training override",
     lambda t: ["run-notebooks", "--only", "04", "--params",
                _params(t, {"04_training": {"overrides": {"sft.batch_size": 0}}}), "--out", str(t / "r")],
     "kunlunlab run-notebooks: notebook 04_training: overrides: experiments/configs/training/train_embedded_cpu.json: "
     "sft.batch_size=0: expected an integer > 0"),
    ("serve-retriever --index missing", lambda t: ["serve-retriever", "--index", str(t / "none")],
     "kunlunlab serve-retriever: no index at"),
    ("train-router --epochs 0", lambda t: ["train-router", "--epochs", "0", "--out", str(t / "r.pt")],
     "kunlunlab train-router: argument --epochs: '0': expected an integer >= 1"),
    ("compare-runs x", lambda t: ["compare-runs", "x"], "kunlunlab compare-runs: expected label=run_folder"),
    ("suite --set no_such_key=1", lambda t: ["suite", "--set", "no_such_key=1"], "unknown keys ['no_such_key']"),
]


@pytest.mark.slow
def test_bad_input_is_one_line_on_stderr_and_exit_2_from_the_real_command(tmp_path):
    """The first case of each command as a subprocess of the installed ``kunlunlab`` (about 4 s each: imports): what
    only the real command can show (its exit code through the console script, nothing printed at import). Every
    case runs in process in the test below."""
    probe = tmp_path / "probe"  # a case's command is its argv's first word (building it may write input files)
    probe.mkdir()
    first_of_each = {argv(probe)[0]: (case, argv, message) for case, argv, message in reversed(BAD_INPUT)}
    assert len(first_of_each) == 8
    for number, (case, argv, message) in enumerate(first_of_each.values()):
        folder = tmp_path / str(number)
        folder.mkdir()
        proc = subprocess.run([*KUNLUNLAB, *argv(folder)], capture_output=True, text=True, timeout=300)
        lines = proc.stderr.strip().splitlines()
        assert (proc.returncode, len(lines)) == (2, 1), (case, proc.returncode, proc.stderr[-2000:])
        assert message in lines[0] and lines[0].startswith("kunlunlab "), (case, lines[0])
        assert not (folder / "i").exists() and not (folder / "r").exists(), case  # nothing started


@pytest.mark.parametrize("case, argv, message", BAD_INPUT, ids=[c for c, _, _ in BAD_INPUT])
def test_bad_input_is_one_line_and_exit_2_in_process(case, argv, message, tmp_path, capsys):
    try:
        code = main(argv(tmp_path))
    except SystemExit as stop:  # argparse exits itself (after its one line), as for --help
        code = stop.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def test_argparse_errors_are_one_line_too(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["train", "--world-size", "0"])
    assert stop.value.code == 2
    assert capsys.readouterr().err == ("kunlunlab train: argument --world-size: '0': expected an integer >= 1 "
                                       "(see kunlunlab train --help)\n")


def test_ctrl_c_during_training_says_what_was_kept_and_how_to_resume(tmp_path, monkeypatch, capsys):
    import kunlunlab.training.pipeline as pipeline

    def interrupted(config, run_dir, progress=print):
        raise KeyboardInterrupt

    monkeypatch.setattr(pipeline, "train", interrupted)
    run_dir = tmp_path / "run"
    assert main(["train", "--smoke", "--run-dir", str(run_dir), "--set", "dapo.steps=2", "hotpot=false"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"kunlunlab train: interrupted; {run_dir} keeps every finished stage and the last checkpoint "
                   "(train_config.json, state.json): resume with "
                   f"`kunlunlab train --run-dir {run_dir} --smoke --set dapo.steps=2 hotpot=false`"]


def test_a_ctrl_c_a_command_does_not_answer_is_one_line_and_exit_130(monkeypatch, capsys):
    import kunlunlab.training.records as records

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(records, "compare_runs", interrupted)
    assert main(["compare-runs", "a=x", "b=y"]) == 130
    assert capsys.readouterr().err == "kunlunlab compare-runs: interrupted; nothing was written; the run folders " \
                                      "are unchanged\n"


def test_a_ctrl_c_answered_inside_an_exec_still_exits_130_under_python_m(tmp_path):
    """A Ctrl-C that lands inside an ``exec`` of a source string (as when a library creates a dataclass) and
    is answered by a command: ``python -m`` exits 130 like any other answered Ctrl-C, not by SIGINT (-2), which
    CPython does when that exec's interrupt record is left set (the cause of a rare failure of the build-index
    Ctrl-C test below)."""
    script = tmp_path / "answered_inside_exec.py"
    script.write_text(
        "import os, signal, sys, threading\n"
        "from kunlunlab.cli import _interrupted\n"
        "threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "try:\n"
        "    exec('import time\\nfor _ in range(500): time.sleep(0.01)')\n"
        "    code = 0\n"
        "except KeyboardInterrupt:\n"
        "    code = _interrupted('demo', 'nothing was kept')\n"
        "sys.exit(code)\n")
    import signal

    proc = subprocess.run([sys.executable, "-m", script.stem], cwd=tmp_path, capture_output=True, text=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL), timeout=120)
    assert (proc.returncode, proc.stderr.strip()) == (130, "kunlunlab demo: interrupted; nothing was kept")


@pytest.mark.slow
def test_ctrl_c_during_a_real_training_run_is_one_line_and_resumes(tmp_path):
    """SIGINT to ``kunlunlab train --smoke`` once it has started working: one line naming the command that
    resumes the run, exit 130, no traceback; the run folder keeps its config."""
    import signal
    import time

    run_dir = tmp_path / "run"
    # SIGINT at its default: a suite started in the background hands its children SIGINT ignored
    proc = subprocess.Popen([*KUNLUNLAB, "train", "--smoke", "--run-dir", str(run_dir)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.time() + 300
    while not (run_dir / "state.json").is_file() and time.time() < deadline:  # the work has started
        time.sleep(0.5)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last == f"kunlunlab train: interrupted; {run_dir} keeps every finished stage and the last checkpoint " \
                   f"(train_config.json, state.json): resume with `kunlunlab train --run-dir {run_dir} --smoke`"
    assert (run_dir / "train_config.json").is_file()
