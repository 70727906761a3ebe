"""The LJ judge's chat route end to end through ``kunlunlab eval --judge-url``: a stand-in server on 127.0.0.1
answers both the answering model (``/v1/completions``, always "\\boxed{Qxzzyv}", so every prediction needs the
judge) and the judge (``/v1/chat/completions``, scripted replies). Checked: verdicts, the fixed prompt, the
key read from the named environment variable, cache hits on a second run, ``unparsed`` for a reply that is
neither yes nor no, and a failing or dead server reported as an error, never as a verdict."""
import json

import pytest
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from kunlunlab.cli import build_parser, eval_config_from_args, main
from kunlunlab.eval.harness import EvalConfig, make_judge_backend
from kunlunlab.eval.judge import JUDGE_SYSTEM, ChatJudgeBackend, JudgeServiceError
from kunlunlab.models import resolve_llm
from kunlunlab.http.client import free_port
from kunlunlab.http.server import ServerThread

PREDICTION = "Qxzzyv"  # no world gold answer matches it, so no verdict comes from the rules


def stand_in(replies: list[str], chat_status: int = 200, models_status: int = 200) -> tuple[FastAPI, dict]:
    """The stand-in server and what it saw: chat requests (body and Authorization header) in order."""
    app, seen = FastAPI(), {"chat": [], "auth": [], "models": 0}

    @app.get("/v1/models")
    def models():
        seen["models"] += 1
        return JSONResponse({"data": [{"id": "judge-model"}]}, status_code=models_status)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await request.json()
        n = len(body["prompt"]) if isinstance(body["prompt"][0], list) else 1
        return {"choices": [{"index": i, "text": f"The answer is \\boxed{{{PREDICTION}}}.", "finish_reason": "stop"}
                            for i in range(n)]}

    @app.post("/v1/chat/completions")
    async def chat(request: Request):
        seen["chat"].append(await request.json())
        seen["auth"].append(request.headers.get("authorization"))
        if chat_status != 200:
            return JSONResponse({"error": "judge overloaded"}, status_code=chat_status)
        return {"choices": [{"index": 0, "message": {"role": "assistant", "content": replies[len(seen["chat"]) - 1]}}]}

    return app, seen


@pytest.fixture()
def eval_args(tmp_path, monkeypatch):
    """argv for a 3-question naive_gen eval over the world, both models on ``url``; the judge cache in tmp_path."""
    model = resolve_llm(None)  # the answering model's tokenizer, resolved before the cache moves
    monkeypatch.setenv("KUNLUNLAB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KL_TEST_JUDGE_KEY", "sk-test-123")

    def argv(url: str, out: str, *extra: str) -> list[str]:
        return ["eval", "--dataset", "world", "--method", "naive_gen", "--limit", "3", "--index-kind", "bm25",
                "--llm-url", url, "--model", model, "--judge", "judge-model", "--judge-url", url,
                "--judge-key-env", "KL_TEST_JUDGE_KEY", "--out", str(tmp_path / out), *extra]

    return argv


def summary_of(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_chat_judge_verdicts_cache_and_unparsed_through_kunlunlab_eval(eval_args, tmp_path, capsys):
    app, seen = stand_in(["Yes.", "no", "Perhaps so"])
    with ServerThread(app) as url:
        assert main(eval_args(url, "first.jsonl")) == 0
        first = summary_of(capsys)
        # "Yes." -> 1, "no" -> 0, "Perhaps so" -> 0 and unparsed; all three judged by the server
        assert first["judge"]["stats"] == {"cached": 0, "judged": 3, "rule": 0, "unparsed": 1}
        records = [json.loads(line) for line in (tmp_path / "first.jsonl").read_text().splitlines()]
        assert [r["prediction"] for r in records] == [PREDICTION] * 3
        assert [r["lj"] for r in records] == [1.0, 0.0, 0.0] and first["lj"] == 0.3333  # the summary rounds to 4 places
        assert first["judge"]["model"] == "judge-model" and first["judge"]["self_judged"] is False
        assert seen["models"] == 1  # the check before any question runs
        # the fixed prompt, the served name, temperature 0, the key from the named variable
        body = seen["chat"][0]
        assert body["model"] == "judge-model" and body["temperature"] == 0.0 and body["max_tokens"] == 4
        assert body["messages"][0] == {"role": "system", "content": JUDGE_SYSTEM}
        user = body["messages"][1]["content"]
        assert user.startswith(f"Question: {records[0]['question']}\n") and f"Predicted answer: {PREDICTION}" in user
        assert " | ".join(records[0]["golds"]) in user
        assert seen["auth"] == ["Bearer sk-test-123"] * 3

        assert main(eval_args(url, "second.jsonl")) == 0  # same questions and predictions: all from the cache
        second = summary_of(capsys)
        assert second["judge"]["stats"] == {"cached": 3, "judged": 0, "rule": 0, "unparsed": 0}
        assert len(seen["chat"]) == 3 and second["lj"] == first["lj"]


def test_a_failing_judge_server_is_an_error_not_a_verdict(eval_args, tmp_path, capsys):
    # Chat requests fail (HTTP 503, retried 3 times, the default): the eval stops with one line; no records and no LJ
    # are written.
    app, seen = stand_in([], chat_status=503)
    with ServerThread(app) as url:
        assert main(eval_args(url, "failing.jsonl")) == 1
    assert len(seen["chat"]) == 4 and not (tmp_path / "failing.jsonl").exists()
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("kunlunlab eval: a generation server failed, evaluation stopped:")
    assert "HTTP 503" in err and "judge overloaded" in err
    # A server that fails everything, or none at all: one error line before any question runs.
    app, seen = stand_in([], chat_status=500, models_status=500)
    with ServerThread(app) as url:
        assert main(eval_args(url, "dead.jsonl")) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("kunlunlab eval: judge server") and "HTTP 500" in err and "\n" not in err
    assert seen["chat"] == [] and not (tmp_path / "dead.jsonl").exists()
    assert main(eval_args(f"http://127.0.0.1:{free_port()}", "none.jsonl")) == 2
    assert "is unavailable after 4 attempts: ConnectError" in capsys.readouterr().err


def test_a_refused_key_names_the_environment_variable(monkeypatch):
    monkeypatch.delenv("KL_TEST_NO_SUCH_KEY", raising=False)
    app, _ = stand_in([], models_status=401)
    with ServerThread(app) as url:
        with pytest.raises(JudgeServiceError, match="HTTP 401.*KL_TEST_NO_SUCH_KEY is not set"):
            ChatJudgeBackend(url, "judge-model", key_env="KL_TEST_NO_SUCH_KEY")


def test_judge_api_flag_selects_the_route_and_chat_is_the_default():
    def config(*flags: str) -> EvalConfig:
        return eval_config_from_args(build_parser().parse_args(["eval", "--dataset", "world", *flags]))

    assert config().judge_api == "chat" and config().judge_key_env == "OPENAI_API_KEY"
    chosen = config("--judge-url", "http://x", "--judge", "m", "--judge-api", "completions", "--judge-key-env", "K")
    assert (chosen.judge_api, chosen.judge_key_env) == ("completions", "K")
    with pytest.raises(ValueError, match="judge_api must be 'chat' or 'completions'"):
        EvalConfig(judge_api="rest")
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "--dataset", "world", "--judge-api", "rest"])
    # completions: the token-id backend of the answering side, with the judge's tokenizer loaded here
    app, seen = stand_in([])
    with ServerThread(app) as url:
        backend = make_judge_backend(EvalConfig(judge=resolve_llm(None), judge_url=url, judge_api="completions"), None)
        assert type(backend).__name__ == "OpenAIBackend" and seen["models"] == 0
