"""Training on more than one process: the SFT and DAPO stages under ``accelerate launch --num_processes 2``
on CPU (gloo), with the embedded model at the smoke sizes. The run trains LoRA adapters and generate their DAPO rollouts on an OpenAI-compatible server (``kunlunlab
serve-llm`` standing in for ``trl vllm-serve``; only TRL's weight sync, which needs CUDA, is replaced), as the
multi-GPU recipe does: every rank reaches the server at the address of its own arguments.

The launched script is ``kunlunlab train`` (``tests/multiprocess_train.py`` adds a recorder of the rewards
each rank computed and got back from TRL's gather). Checked: both ranks exit 0; in every DAPO step both
ranks hold the same gathered rewards, made of each rank's own rollouts in rank order; the one
``dapo_rollouts.jsonl`` record of the step covers both ranks' rollouts and agrees with TRL's logged
reward; both ranks' rollouts reached the generation server and it answered each request; each rank evaluates
half of the held-out questions and the main process writes them all; the saved ``sft/final`` and
``dapo/final`` are whole models (adapters merged) that load with ``load_llm`` and have the embedded model's
parameter names and shapes. About 2.5 minutes on 2 CPU cores. ``make test-gpuenv`` runs it in the environments a
multi-GPU node installs; ``make test`` deselects it (``-m "not multiprocess"``)."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kunlunlab.data.splits import world_questions
from kunlunlab.paths import cache_dir
from kunlunlab.training.pipeline import run_config

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parents[1] / "multiprocess_train.py"
PROCESSES = 2
# The smoke sizes (SMOKE_OVERRIDES: 2 SFT steps of batch 2, 1 DAPO step of 1 question × 2 samples per
# process) without HotpotQA or the evaluation before; one held-out question after; an exact (flat) index of the
# embedded embedder, built once by the main process and loaded by the other; one SFT checkpoint, so saving one under two processes is exercised too. The overlong
# penalty starts at the first model token (-model_tokens/160): the untrained model earns no format or
# accuracy reward in 32-token turns, and all-zero rewards would make the comparison across ranks empty.
OVERRIDES = ["hotpot=false", "index_kind=flat", "eval.before=false", "eval.world_questions=2",
             "eval.hotpot_questions=0", "sft.save_steps=2", "bf16=false", "dapo.prompts_per_step=2",
             "rewards.overlong_max_tokens=160", "rewards.overlong_buffer=160", "lora.enabled=true", "lora.r=4",
             "lora.alpha=8", 'lora.target_modules=["q_proj","v_proj"]', "sft.learning_rate=1e-2",
             "dapo.use_vllm=true"]
RUN_TIMEOUT = 600


def _gloo_missing() -> str | None:
    import torch.distributed as dist

    if not dist.is_available():
        return "torch was built without torch.distributed"
    if not dist.is_gloo_available():
        return "torch.distributed has no gloo backend (needed for multi-process training on CPU)"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(cache: Path | None = None) -> dict:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", TOKENIZERS_PARALLELISM="false",
               OMP_NUM_THREADS="1", ACCELERATE_USE_CPU="1", CUDA_VISIBLE_DEVICES="", TRL_EXPERIMENTAL_SILENCE="1",
               KUNLUNLAB_TEST_GENERATION_SERVER="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    if cache is not None:
        env["KUNLUNLAB_CACHE"] = str(cache)
    return env


def _cache_without_embeddings(folder: Path) -> Path:
    """A cache folder sharing the converted models of this process's cache but no corpus embeddings: a corpus an
    earlier test embedded would otherwise be read from the cache, and no rank would embed it."""
    folder.mkdir(parents=True, exist_ok=True)
    for part in ("models", "onnx"):
        (cache_dir() / part).mkdir(parents=True, exist_ok=True)
        (folder / part).symlink_to(cache_dir() / part, target_is_directory=True)
    return folder


def _run(cmd: list[str], what: str, cache: Path | None = None) -> tuple[float, str]:
    """Runs ``cmd`` (one thread per process, whatever else the machine runs): (seconds, output); fails with
    the output's tail."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=_env(cache), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # the launcher and its ranks (their own session)
        out, _ = proc.communicate()
        pytest.fail(f"{what} ran past {RUN_TIMEOUT} s (a rank waiting on a collective?):\n{out[-6000:]}")
    assert proc.returncode == 0, f"{what} exited {proc.returncode}:\n{out[-6000:]}"
    return time.perf_counter() - t0, out


def _train_args(run_dir: Path, server: str) -> list[str]:
    return ["train", "--run-dir", str(run_dir), "--smoke", "--set", *OVERRIDES, f"dapo.vllm_server_url={server}"]


@pytest.fixture(scope="module")
def generation_server(tmp_path_factory):
    """``kunlunlab serve-llm`` on a free loopback port (the embedded model); its access log in a file."""
    import httpx

    log = tmp_path_factory.mktemp("server") / "access.log"
    port = _free_port()
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "kunlunlab.cli", "serve-llm", "--port", str(port)], cwd=ROOT,
                                env=_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):
            try:
                if httpx.get(f"{url}/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None, log.read_text()[-3000:]
            time.sleep(0.5)
        else:
            pytest.fail(f"serve-llm did not answer in 120 s:\n{log.read_text()[-3000:]}")
        yield url, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def _launch_args() -> list[str]:
    # `--cpu` would start ONE process (accelerate's simple launcher runs several CPU processes only through
    # mpirun); `--multi_gpu` starts them through torchrun, and ACCELERATE_USE_CPU=1 with no visible GPU
    # makes them CPU processes of a gloo group
    return [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(PROCESSES),
            "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
            "--main_process_port", str(_free_port())]


@pytest.fixture(scope="module")
def runs(module_scratch, generation_server):
    missing = _gloo_missing()
    if missing:
        pytest.skip(missing)
    server, log = generation_server
    multi = module_scratch("multi")
    # the server has converted the embedded model into the cache already (two ranks converting it at the same
    # time would race on the cache folder)
    cache = _cache_without_embeddings(module_scratch("cache"))
    launched, out = _run(_launch_args() + [str(SCRIPT), *_train_args(multi, server)], "accelerate launch", cache)
    return {"cfg": run_config(None, OVERRIDES, smoke=True), "multi": multi, "out": out, "seconds": launched,
            "server": server, "server_log": log}


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _total(row: list, weights: list[float]) -> float:  # TRL's weighted nansum of one completion's rewards
    return sum(w * v for w, v in zip(weights, row) if v is not None)


def test_both_ranks_finish_both_stages(runs):
    multi, out = runs["multi"], runs["out"]
    # every rank reports its stages (exit code 0 checked by the fixture) and its evaluation
    assert out.count("SFT done: 2 steps") == PROCESSES and out.count("DAPO done: 1 steps") == PROCESSES, out[-4000:]
    assert out.count("eval after: world EM") == PROCESSES, out[-4000:]
    # each rank evaluated one of the two held-out questions; the main process wrote both, in question order
    records = _jsonl(multi / "eval_after_world.jsonl")
    _, _, heldout = world_questions(runs["cfg"].splits())
    assert [r["id"] for r in records] == [q.id for q in heldout] and len(records) == 2
    assert not list(multi.glob("eval_after_world.rank*.jsonl"))
    state = json.loads((multi / "state.json").read_text())
    assert state["sft_done"] and state["dapo_done"]
    assert state["steps"] == {"sft": 2, "dapo": 1}
    assert (multi / "training_summary.json").is_file()  # the main process evaluated after training
    # finished stages keep their final model; their resumption checkpoints are removed
    assert (multi / "sft" / "final").is_dir() and not list(multi.glob("*/checkpoint-*"))
    # both processes mixed the same data and one wrote it whole: every trajectory the summary counts
    summary = json.loads((multi / "training_summary.json").read_text())
    assert len(_jsonl(multi / "trajectories.jsonl")) == summary["trajectories"] > 0
    ranks = sorted(p.name for p in multi.glob("rank*_rewards.jsonl"))
    assert ranks == [f"rank{r}_rewards.jsonl" for r in range(PROCESSES)], "a rank did not reach DAPO's rewards"


def test_both_ranks_see_the_same_gathered_rewards(runs):
    multi, cfg = runs["multi"], runs["cfg"]
    by_rank = [_jsonl(multi / f"rank{r}_rewards.jsonl") for r in range(PROCESSES)]
    steps = cfg.dapo.steps
    prompts_per_rank = cfg.dapo.prompts_per_step // PROCESSES  # prompts_per_step counts every process's questions
    per_rank = prompts_per_rank * cfg.dapo.num_generations
    assert [len(rows) for rows in by_rank] == [steps] * PROCESSES
    for step_rows in zip(*by_rank):
        assert [r["rank"] for r in step_rows] == list(range(PROCESSES))
        assert {r["processes"] for r in step_rows} == {PROCESSES} and len({r["step"] for r in step_rows}) == 1
        gathered = step_rows[0]["gathered"]
        assert len(gathered) == PROCESSES * per_rank and len(gathered[0]) == len(cfg.rewards.weights)
        assert all(row[-1] < 0 for row in gathered), "every completion has an overlong penalty (OVERRIDES)"
        for r in step_rows:
            assert r["gathered"] == gathered, f"rank {r['rank']} holds other rewards than rank 0"
            # each rank rolled out whole groups of its own questions; its rewards sit at its slot
            assert len(r["questions"]) == per_rank and len(set(r["questions"])) == prompts_per_rank
            assert gathered[r["rank"] * per_rank:(r["rank"] + 1) * per_rank] == r["local"]
        assert not set(step_rows[0]["questions"]) & set(step_rows[1]["questions"]), "both ranks got one question"

    # dapo_rollouts.jsonl: one record per step, written once, for the rollouts of both ranks; its mean reward
    # (SearchRollout's own scoring) is TRL's mean over the gathered rewards, as logged in dapo_log.jsonl
    rollouts = _jsonl(multi / "dapo_rollouts.jsonl")
    assert [r["step"] for r in rollouts] == list(range(steps))
    logged = [row for row in _jsonl(multi / "dapo_log.jsonl") if "reward" in row]
    for record, step_rows, log_row in zip(rollouts, zip(*by_rank), logged):
        assert record["processes"] == PROCESSES and record["rollouts"] == PROCESSES * per_rank
        totals = [_total(row, cfg.rewards.weights) for row in step_rows[0]["gathered"]]
        assert record["reward"] == pytest.approx(sum(totals) / len(totals), abs=1e-5)
        assert log_row["reward"] == pytest.approx(record["reward"], abs=1e-5)


def test_the_corpus_is_embedded_once_by_the_main_process_and_loaded_by_the_other(runs):
    multi, cfg = runs["multi"], runs["cfg"]
    embedded = {r: json.loads((multi / f"rank{r}_embedded.json").read_text())["passages"] for r in range(PROCESSES)}
    assert embedded == {0: cfg.world_passages, 1: 0}  # before, every rank encoded the whole corpus itself
    assert (multi / "index" / "world" / "manifest.json").is_file()


def test_the_evaluation_during_training_searches_the_index_built_once(runs):
    """Both ranks evaluated their share of the held-out questions (test_both_ranks_finish_both_stages) on the
    run's world index: the main process built it once, the other loaded it, and no evaluation built another
    (before, every rank built an index over the passages for every evaluation)."""
    multi = runs["multi"]
    builds = {r: json.loads((multi / f"rank{r}_embedded.json").read_text())["index_builds"] for r in range(PROCESSES)}
    assert builds == {0: 1, 1: 0}
    assert json.loads((multi / "state.json").read_text())["eval_after"]["world"]["n"] == 2


def test_every_rank_rolls_out_through_the_generation_server(runs):
    multi, cfg = runs["multi"], runs["cfg"]
    per_rank = cfg.dapo.prompts_per_step // PROCESSES * cfg.dapo.num_generations
    calls = {r: _jsonl(multi / f"rank{r}_server_calls.jsonl") for r in range(PROCESSES)}
    for rank, rows in calls.items():
        assert rows, f"rank {rank} never reached the generation server"
        assert {row["url"] for row in rows} == {runs["server"] + "/v1"}  # the OpenAI client's base URL
        assert max(row["prompts"] for row in rows) == per_rank  # the rank's whole rollout batch in one request
    # TRL pushes the weights from the main process before the step's rollout (the stand-in takes 2 s there and
    # returns at once on the other rank, as under ZeRO-2): no rank may sample before the push has ended
    pushed = _jsonl(multi / "rank0_syncs.jsonl")[0]
    assert pushed["end"] - pushed["start"] >= 2.0
    for rank, rows in calls.items():
        assert min(row["time"] for row in rows) >= pushed["end"], f"rank {rank} sampled before the weights were pushed"
    # the server answered every request of both runs (its access log: one line per request)
    sent = sum(len(rows) for rows in calls.values())
    assert runs["server_log"].read_text().count('"POST /v1/completions HTTP/1.1" 200') == sent


def test_final_models_are_whole_models_of_the_embedded_model_s_shape(runs):
    from kunlunlab.eval.harness import AGENT_SETTINGS_FILE
    from kunlunlab.models import load_llm

    def shapes(model):
        return {name: tuple(p.shape) for name, p in model.named_parameters()}

    base, _ = load_llm()
    base_params = dict(base.named_parameters())
    for stage in ("sft", "dapo"):
        final = runs["multi"] / stage / "final"
        assert (final / AGENT_SETTINGS_FILE).is_file()
        multi, tok = load_llm(str(final))
        assert shapes(multi) == shapes(base), stage
        assert tok("<search>")["input_ids"], stage
        if stage == "sft":  # two processes trained the adapters, merged into the attention projections
            moved = {n for n, p in multi.named_parameters() if not p.detach().equal(base_params[n].detach())}
            assert moved and all(n.endswith(("q_proj.weight", "v_proj.weight")) for n in moved), sorted(moved)[:4]
