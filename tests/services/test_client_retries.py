"""Every HTTP client waits as a busy server asks (issue 55): the retrieval client, the OpenAI-compatible generation
backend, the LLM judge and the path judge, each against a loopback server that answers 503 or 429 with
``Retry-After: 1`` twice and then 200. Each waits at least the second asked for before each retry and succeeds; a
server that never recovers ends in one error line naming it after the configured tries."""
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kunlunlab.agent.backends import SamplingConfig
from kunlunlab.agent.errors import GenerationServiceError
from kunlunlab.agent.openai_backend import OpenAIBackend
from kunlunlab.eval.judge import ChatJudgeBackend, JudgeServiceError
from kunlunlab.http.client import RetryPolicy, ServiceClient, ServiceError, retry_delay
from kunlunlab.models import resolve_llm
from kunlunlab.retrieval.client import RemoteRetriever, RetrievalServiceError
from kunlunlab.training.path_judge import JudgeUnavailableError, PathJudge

ANSWERS = {  # the 200 answer of each route, in the layout its client reads
    "/retrieve": {"result": [[{"document": {"id": "7", "contents": '"Paris"\nCapital of France.'}, "score": 0.5}]]},
    "/v1/completions": {"choices": [{"index": 0, "text": "ab", "finish_reason": "length",
                                     "logprobs": {"tokens": ["token_id:64", "token_id:65"],
                                                  "token_logprobs": [-0.5, -0.25]}}]},
    "/v1/chat/completions": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "7"}}]},
}


class BusyServer:
    """A loopback server whose POSTs get ``status`` with ``Retry-After: retry_after`` for the first ``busy`` of
    them (None: all), then the route's 200 answer; ``GET /v1/models`` and ``/health`` always answer. ``posts``:
    when each POST arrived (``time.monotonic``)."""

    def __init__(self, status: int, busy: int | None, retry_after: str = "1"):
        self.posts: list[float] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, status: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for key, value in {"Content-Type": "application/json", "Content-Length": str(len(data)),
                                   **(headers or {})}.items():
                    self.send_header(key, value)
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._answer(200, {"data": [{"id": "m"}], "ready": True})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.posts.append(time.monotonic())
                if busy is None or len(outer.posts) <= busy:
                    self._answer(status, {"detail": "queue full: retry later"}, {"Retry-After": retry_after})
                else:
                    self._answer(200, ANSWERS[self.path])

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> "BusyServer":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()


# Each client built as a caller would, its tries set to `attempts`, then asked once; what a success returns.
def _retrieval(url, attempts):
    return [h.title for h in RemoteRetriever(url, attempts=attempts, backoff=0.01).search(["capital of France"], 1)[0]]


def _generation(url, attempts):
    backend = OpenAIBackend(url, "m", tokenizer_name=resolve_llm(None), retries=attempts - 1, backoff=0.01)
    return backend.complete([[1, 2]], 2, (), SamplingConfig())[0].token_ids


def _llm_judge(url, attempts):
    return ChatJudgeBackend(url, "m", key_env=None, retries=attempts - 1, backoff=0.01).reply([{"role": "user",
                                                                                                  "content": "q"}])


def _path_judge(url, attempts):
    return PathJudge(url, "m", retries=attempts - 1, backoff=0.01).score("q", ["a"], "path so far")


CLIENTS = {  # name: (call, what a success returns, error class, the service's name in the error line)
    "retrieval client": (_retrieval, ["Paris"], RetrievalServiceError, "retrieval service"),
    "openai backend": (_generation, [64, 65], GenerationServiceError, "generation server"),
    "llm judge": (_llm_judge, "7", JudgeServiceError, "judge server"),
    "path judge": (_path_judge, 0.7, JudgeUnavailableError, "path judge"),
}


@pytest.mark.parametrize("status", [503, 429])
@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_each_client_waits_the_asked_second_and_then_succeeds(client, status):
    call, expected, _, _ = CLIENTS[client]
    with BusyServer(status, busy=2) as server:
        assert call(server.url, attempts=3) == expected
    assert len(server.posts) == 3
    gaps = [b - a for a, b in zip(server.posts, server.posts[1:])]
    assert min(gaps) >= 0.99, gaps  # Retry-After: 1 outweighs the 0.01 s backoff; the clock reads to ~1 ms


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_a_server_that_never_recovers_is_one_error_line_after_the_configured_tries(client):
    call, _, error, name = CLIENTS[client]
    with BusyServer(503, busy=None, retry_after="0") as server:
        with pytest.raises(error) as raised:
            call(server.url, attempts=3)
    message = str(raised.value)
    assert len(server.posts) == 3 and "\n" not in message
    assert message.startswith(f"{name} at {server.url}")
    assert "is unavailable after 3 attempts: HTTP 503: queue full: retry later" in message


def test_the_wait_is_the_backoff_or_the_retry_after_whichever_is_longer_and_capped():
    class Answer:
        def __init__(self, retry_after):
            self.headers = {"retry-after": retry_after} if retry_after is not None else {}

    assert retry_delay(0, 0.25) == 0.25 and retry_delay(3, 0.25) == 2.0  # 0.25 * 2**3
    assert retry_delay(0, 0.25, Answer("1")) == 1.0  # the server asks for longer
    assert retry_delay(3, 0.25, Answer("1")) == 2.0  # the backoff is longer already
    assert retry_delay(0, 0.25, Answer("3600"), max_backoff=30.0) == 30.0  # a wild header is capped
    assert retry_delay(0, 0.25, Answer("Wed, 21 Oct 2015 07:28:00 GMT")) == 0.25  # a date: the backoff stands
    with pytest.raises(ValueError, match="attempts must be at least 1, got 0"):
        RetryPolicy(attempts=0)


def test_a_refused_request_is_not_retried_and_says_where_the_key_came_from(monkeypatch):
    monkeypatch.delenv("KL_TEST_NO_KEY", raising=False)
    with BusyServer(401, busy=None) as server:
        client = ServiceClient(server.url, "test service", key_env="KL_TEST_NO_KEY", retry=RetryPolicy(attempts=5))
        with pytest.raises(ServiceError, match=r"test service at http://127\.0\.0\.1:\d+/x rejected the request "
                                               r"\(HTTP 401\): queue full: retry later; no key was sent: the "
                                               r"environment variable KL_TEST_NO_KEY is not set"):
            client.json("POST", "/x", {})
    assert len(server.posts) == 1  # a 401 will not get better by asking again
    assert client.stats["retried"] == {} and client.stats["waited_s"] == 0.0
