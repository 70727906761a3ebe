"""``kunlunlab serve-llm`` bounds and cancels its work (issue 44): limits are one-line 422s, an abandoned request is
cancelled (queued or generating), a full queue is a 503, one SIGTERM stops the server, an optional bearer key.

Most tests use :class:`SlowBackend`, a stand-in that writes one token per ``step_s`` and honours the ``cancel``
event as the local backend does, so a "long" generation is long by construction and the tests take seconds; the
last three run the real model (its generation loop, the server, the ``llm-overload`` benchmark)."""
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from kunlunlab.agent.backends import SamplingConfig, Segment, text_ids
from kunlunlab.agent.errors import GenerationServiceError
from kunlunlab.agent.openai_backend import API_KEY_ENV, OpenAIBackend
from kunlunlab.agent.server import create_app
from kunlunlab.agent.transformers_backend import GenerationCancelled
from kunlunlab.http.client import free_port
from kunlunlab.http.server import ServerThread
from scripted import CharTokenizer

ROOT = Path(__file__).resolve().parents[2]
LONG = 100_000  # tokens: 1000 s at SlowBackend's pace, so finishing early means it was cancelled


class UnicodeTokenizer(CharTokenizer):
    def __len__(self):
        return 0x110000


class SlowBackend:
    """Writes "a" every ``step_s`` seconds, checking ``cancel`` before each token like the local session. Records
    each generation as [prompt, tokens written, how it ended]."""

    name = "slow-stand-in"

    def __init__(self, step_s: float = 0.01):
        self.tokenizer, self.step_s = UnicodeTokenizer(), step_s
        self.runs: list[list] = []
        self.generating = threading.Event()

    def open(self, prompts, sampling=None):
        outer = self

        class Session:
            def generate(self, rows, max_new_tokens, stop=(), cancel=None):
                run = [outer.tokenizer.decode(prompts[0]), 0, "running"]
                outer.runs.append(run)
                outer.generating.set()
                while run[1] < max_new_tokens:
                    if cancel is not None and cancel.is_set():
                        run[2] = "cancelled"
                        raise GenerationCancelled(f"cancelled after {run[1]} tokens")
                    time.sleep(outer.step_s)
                    run[1] += 1
                run[2] = "done"
                ids = [ord("a")] * run[1]
                return {r: Segment(ids, [-0.1] * len(ids), "a" * len(ids), "length") for r in rows}

        return Session()


def _post(url: str, payload: dict, timeout: float = 30.0, **kw) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json=payload, timeout=timeout, **kw)


class _Abandon(threading.Thread):
    """A client that gives up after ``timeout`` s (httpx then closes the connection), in the background;
    ``join()`` returns whether it did time out."""

    def __init__(self, url: str, payload: dict, timeout: float):
        super().__init__()
        self.args_, self.timed_out = (url, payload, timeout), False
        self.start()

    def run(self):
        url, payload, timeout = self.args_
        try:
            _post(url, payload, timeout=timeout)
        except httpx.TimeoutException:
            self.timed_out = True

    def join(self, timeout=None) -> bool:
        super().join(timeout)
        return self.timed_out


def _wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.time() + timeout
    while not predicate():
        assert time.time() < deadline, "condition not reached"
        time.sleep(0.01)


@pytest.fixture
def slow():
    backend = SlowBackend()
    with ServerThread(create_app(backend, max_tokens=LONG, max_model_len=LONG + 64, max_queue=1)) as url:
        yield url, backend


@pytest.mark.parametrize("payload,detail", [
    ({"prompt": [999999999]}, "prompt 0: token id 999999999 is out of the vocabulary (0 to 1114111)"),
    ({"prompt": [[5, 6], [-1]]}, "prompt 1: token id -1 is out of the vocabulary"),
    ({"prompt": "hi", "max_tokens": LONG + 1}, f"max_tokens is {LONG + 1}, the limit is {LONG} (max_tokens)"),
    ({"prompt": "x" * 70, "max_tokens": LONG}, f"prompt 0 is 70 tokens and max_tokens {LONG}: together over the "
                                               f"context of {LONG + 64} tokens (max_model_len)"),
    ({"prompt": ["a"] * 257}, "too many prompts: 257 in one request, the limit is 256 (max_prompts)"),
    ({"prompt": [[1], []]}, "prompt 1 is empty"),
    ({"prompt": []}, "empty prompt"),
    ({"prompt": "hi", "stop": ["</a>", ""]}, "stop strings must be non-empty"),
    ({"prompt": "hi", "max_tokens": 0}, "invalid request: max_tokens: Input should be greater than or equal to 1"),
    ({"prompt": "hi", "temperature": "hot"}, "invalid request: temperature: Input should be a valid number"),
    ({"prompt": "hi", "seed": 2 ** 64}, "invalid request: seed: Input should be less than"),
])
def test_bad_requests_are_a_422_in_one_line_and_never_reach_the_model(slow, payload, detail):
    url, backend = slow
    response = _post(url, payload)
    assert response.status_code == 422 and detail in response.json()["detail"]
    assert "\n" not in response.json()["detail"] and not backend.runs


def test_an_abandoned_generation_is_cancelled_and_the_next_request_runs_at_once(slow):
    url, backend = slow
    started = time.perf_counter()
    abandoned = _Abandon(url, {"prompt": "long", "max_tokens": LONG}, timeout=1.0)
    assert backend.generating.wait(10)
    waiting = _post(url, {"prompt": "short", "max_tokens": 3})  # queued behind the long one until its client leaves
    waited = time.perf_counter() - started
    assert abandoned.join()
    assert waiting.status_code == 200 and waiting.json()["choices"][0]["text"] == "aaa"
    (long_prompt, long_tokens, long_end), short = backend.runs
    assert long_prompt == "long" and long_end == "cancelled" and long_tokens < LONG
    assert short == ["short", 3, "done"]
    assert waited < 10  # the client's 1 s, then one token; the abandoned generation alone would take 1000 s
    health = httpx.get(url + "/health").json()
    assert health["cancelled"] == 1 and health["completed"] == 1 and not health["generating"]


def test_a_request_abandoned_in_the_queue_is_never_generated(slow):
    url, backend = slow
    with_client = threading.Thread(target=lambda: _post(url, {"prompt": "first", "max_tokens": 150}))
    with_client.start()
    assert backend.generating.wait(10)
    assert _Abandon(url, {"prompt": "gave up", "max_tokens": 5}, timeout=0.3).join()
    with_client.join()
    assert [run[0] for run in backend.runs] == ["first"] and backend.runs[0][2] == "done"
    health = httpx.get(url + "/health").json()
    assert health["completed"] == 1 and health["cancelled"] == 1 and health["queue"] == 0


def test_a_full_queue_answers_503_with_retry_after(slow):
    url, backend = slow  # max_queue=1: one request generates, one waits
    threads = [threading.Thread(target=_post, args=(url, {"prompt": p, "max_tokens": 100})) for p in ("a", "b")]
    threads[0].start()
    assert backend.generating.wait(10)
    threads[1].start()
    _wait_for(lambda: httpx.get(url + "/health").json()["queue"] == 1)
    refused = _post(url, {"prompt": "c", "max_tokens": 1})
    for thread in threads:
        thread.join()
    assert refused.status_code == 503 and refused.headers["retry-after"] == "1"
    assert refused.json()["detail"] == "queue full: 1 requests wait behind the one generating (max_queue), retry later"
    assert [run[0] for run in backend.runs] == ["a", "b"] and httpx.get(url + "/health").json()["rejected"] == 1


def test_health_states_the_limits_and_the_models_list_the_context(slow):
    url, _ = slow
    health = httpx.get(url + "/health").json()
    assert health["status"] == "ok" and health["model"] == "slow-stand-in" and health["api_key"] is False
    assert health["limits"] == {"max_tokens": LONG, "max_model_len": LONG + 64, "max_prompts": 256,
                                "max_queue": 1, "max_body_bytes": 256 * (LONG + 64) * 8 + 65536}
    assert httpx.get(url + "/v1/models").json()["data"][0]["max_model_len"] == LONG + 64


def test_a_body_over_the_limit_is_a_413_naming_it():
    with ServerThread(create_app(SlowBackend(), max_model_len=64, max_body_bytes=1000)) as url:
        declared = _post(url, {"prompt": "x" * 5000})
        streamed = httpx.post(url + "/v1/completions", content=(b"x" * 600 for _ in range(3)), timeout=10)
    assert declared.status_code == 413
    assert declared.json()["detail"] == "request body of 5013 bytes is over the limit of 1000 bytes (max_body_bytes)"
    assert streamed.status_code == 413  # no Content-Length: counted as it arrives
    assert streamed.json()["detail"] == "request body is over the limit of 1000 bytes (max_body_bytes)"


def test_the_api_key_is_required_and_the_openai_backend_sends_it(monkeypatch):
    backend = SlowBackend(step_s=0)
    with ServerThread(create_app(backend, api_key="s3cret")) as url:
        missing = _post(url, {"prompt": "hi", "max_tokens": 2})
        wrong = _post(url, {"prompt": "hi", "max_tokens": 2}, headers={"Authorization": "Bearer guess"})
        right = _post(url, {"prompt": "hi", "max_tokens": 2}, headers={"Authorization": "Bearer s3cret"})
        health = httpx.get(url + "/health")
        greedy, model = SamplingConfig(), "smollm2-135m-instruct"  # the tokenizer the client encodes with
        monkeypatch.setenv(API_KEY_ENV, "s3cret")
        from_env = OpenAIBackend(url, model, retries=0).complete([[104, 105]], 2, (), greedy)
        monkeypatch.delenv(API_KEY_ENV)
        with pytest.raises(GenerationServiceError, match="HTTP 401"):
            OpenAIBackend(url, model, retries=0).complete([[104, 105]], 2, (), greedy)
        given = OpenAIBackend(url, model, api_key="s3cret", retries=0).complete([[104]], 1, (), greedy)
    assert missing.status_code == wrong.status_code == 401 and "Authorization: Bearer" in missing.json()["detail"]
    assert right.status_code == 200 and health.status_code == 200 and health.json()["api_key"] is True
    assert from_env[0].token_ids == [97, 97] and given[0].token_ids == [97]


STAND_IN_SERVER = """
import sys
sys.path[:0] = [{tests!r}, {here!r}]
from test_llm_server import SlowBackend
from kunlunlab.agent.server import serve
serve(SlowBackend(), port={port}, max_model_len=200000)
"""


def test_the_first_sigterm_cancels_the_generation_and_stops_the_server(tmp_path):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    script = tmp_path / "server.py"
    script.write_text(STAND_IN_SERVER.format(tests=str(ROOT / "tests"), here=str(Path(__file__).parent), port=port))
    log = tmp_path / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, str(script)], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT)
    try:
        _wait_for(lambda: _alive(url), timeout=60)
        answers: list = []
        first = threading.Thread(target=lambda: answers.append(_post(url, {"prompt": "long", "max_tokens": LONG})))
        first.start()
        _wait_for(lambda: httpx.get(url + "/health").json()["generating"])
        second = threading.Thread(target=lambda: answers.append(_post(url, {"prompt": "queued", "max_tokens": 1})))
        second.start()
        _wait_for(lambda: httpx.get(url + "/health").json()["queue"] == 1)
        signalled = time.perf_counter()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=30)
        stopped = time.perf_counter() - signalled
        first.join(10)
        second.join(10)
    finally:
        proc.kill()
    text = log.read_text()
    # one SIGTERM (uvicorn re-raises it once shut down: -15); the stand-in's generation had 1000 s to go
    assert code in (0, -signal.SIGTERM) and stopped < 10, text[-2000:]
    assert "Waiting for background tasks" not in text and "Finished server process" in text
    assert [a.status_code for a in answers] == [503, 503]
    assert all(a.json()["detail"] == "the server is shutting down" for a in answers)
    assert "Traceback" not in text


def _alive(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


# ---------------------------------------------------------------------------- the real model
def test_the_local_session_stops_within_a_token_when_cancelled(backend):
    prompt = text_ids(backend.tokenizer, ", ".join(str(i) for i in range(1, 30)) + ",")  # it counts on and on
    cancel = threading.Event()
    with pytest.raises(GenerationCancelled, match="after 0 tokens"):
        cancel.set()
        backend.open([prompt]).generate([0], 50, stop=(), cancel=cancel)
    cancel.clear()
    session = backend.open([prompt])  # the prefill is not cancellable; the decode steps are
    threading.Timer(1.0, cancel.set).start()
    started = time.perf_counter()
    with pytest.raises(GenerationCancelled) as stopped:
        session.generate([0], 4000, stop=(), cancel=cancel)
    tokens = int(str(stopped.value).split("after ")[1].split()[0])
    assert tokens < 4000 and time.perf_counter() - started < 60  # 4000 tokens take minutes on 2 cores


def test_the_server_cancels_an_abandoned_generation_of_the_real_model(backend):
    counting = ", ".join(str(i) for i in range(1, 30)) + ","
    with ServerThread(create_app(backend)) as url:
        assert _Abandon(url, {"prompt": counting, "max_tokens": 4000, "temperature": 0}, timeout=1.0).join()
        started = time.perf_counter()
        short = _post(url, {"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}, timeout=120)
        waited = time.perf_counter() - started
        health = httpx.get(url + "/health").json()
    assert short.status_code == 200 and short.json()["choices"][0]["text"]
    assert health["cancelled"] == 1 and health["completed"] == 1
    assert waited < 60  # 4 tokens and at most one step of the abandoned request, not the rest of its 4000 tokens


@pytest.mark.slow
def test_the_llm_overload_benchmark_measures_the_abandoned_request_and_the_sigterm():
    """``python -m kunlunlab.bench llm-overload`` at a tiny size, on the real ``serve-llm``: the short requests after
    the abandoned one are all answered and one SIGTERM stops the server."""
    from kunlunlab.bench import LLMOverloadBenchConfig, bench_llm_overload

    result = bench_llm_overload(LLMOverloadBenchConfig(duration=3, alone=1, clients=2, short_tokens=4,
                                                       long_tokens=4000, abandon_after=1.5, short_timeout=120,
                                                       stop_timeout=60, threads=1))
    beside = result["beside_abandoned"]
    assert result["long_request_abandoned"] and beside["ok"] >= 1 and beside["ok"] == beside["requests"]
    assert result["alone"]["errors"] == 0 and result["sigterm_exit_s"] is not None
