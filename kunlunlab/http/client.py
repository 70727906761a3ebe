"""One way every client here talks to a service: base URL, bearer key, timeout, retries, and one error line.

The retrieval client, the OpenAI-compatible generation backend, the LLM judge and the path judge all send their
requests through :class:`ServiceClient`, so a busy server is waited for the same way everywhere (issue 55: the
generation backend retried at once and gave up on 429, and each judge carried its own loop):

* a connection failure (refused, reset, timed out) and HTTP 429, 500, 502, 503, 504 are tried again, at most
  ``RetryPolicy.attempts`` tries in all;
* before try ``n + 1`` the client waits ``backoff * 2**(n - 1)`` seconds, or the server's ``Retry-After`` (in
  seconds) when it asks for longer, both capped at ``max_backoff`` so a bad header cannot stall a caller;
* any other answer is handed back as it is: a 4xx will not get better by asking again;
* after the last try one error (the caller's class) names the service, its URL, the tries and the last status
  with the server's ``detail``.

httpx only: the agent, training and evaluation load no web framework (``tests/project/test_layers.py``).
"""
from __future__ import annotations

import json
import os
import socket
import time
from contextlib import suppress
from dataclasses import dataclass

import httpx

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})  # overload or a restart: worth another try


class ServiceError(RuntimeError):
    """A service could not be reached, or refused or garbled a request. Each client raises its own subclass."""


def bearer_headers(api_key: str | None, env: str | None = None) -> dict[str, str]:
    """``Authorization: Bearer`` for ``api_key``, or for the key in the environment variable ``env`` when
    ``api_key`` is None; no header when neither is set (the servers ask for no key by default). ``api_key=""``
    sends none whatever the environment."""
    key = (os.environ.get(env) if env else None) if api_key is None else api_key
    return {"Authorization": f"Bearer {key}"} if key else {}


def openai_base(url: str) -> str:
    """An OpenAI-compatible server's API root: ``http://host:8000``, ``…/`` and ``…/v1`` all give ``…/v1``."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


def retry_delay(attempt: int, backoff: float, response: httpx.Response | None = None,
                max_backoff: float = 5.0) -> float:
    """Seconds before try ``attempt + 2`` (``attempt`` counts from 0): ``backoff * 2**attempt``, or the
    server's ``Retry-After`` (in seconds) when it asks for longer, both capped at ``max_backoff``."""
    delay = backoff * 2 ** attempt
    if response is not None:
        with suppress(ValueError):  # absent, or an HTTP date: the backoff stands
            delay = max(delay, float(response.headers.get("retry-after", "")))
    return min(delay, max_backoff)


@dataclass(frozen=True)
class RetryPolicy:
    """``attempts`` tries in all (1: no retry); the waits between them are :func:`retry_delay`'s."""

    attempts: int = 3
    backoff: float = 0.25
    max_backoff: float = 5.0

    def __post_init__(self):
        if self.attempts < 1:
            raise ValueError(f"attempts must be at least 1, got {self.attempts}")
        if self.backoff < 0 or self.max_backoff < 0:
            raise ValueError(f"backoff and max_backoff must be >= 0, got {self.backoff} and {self.max_backoff}")

    @classmethod
    def from_retries(cls, retries: int, backoff: float, max_backoff: float) -> "RetryPolicy":
        """The policy of a client whose knob counts the retries after the first try."""
        if retries < 0:
            raise ValueError(f"retries must be at least 0, got {retries}")
        return cls(retries + 1, backoff, max_backoff)


def _detail(response: httpx.Response) -> str:
    """The server's reason on one line: a JSON body's ``detail`` or ``error`` (FastAPI, OpenAI), else the text."""
    text = response.text
    with suppress(ValueError):
        body = response.json()
        if isinstance(body, dict):
            reason = body.get("detail", body.get("error"))
            if isinstance(reason, dict):  # OpenAI's {"error": {"message": ...}}
                reason = reason.get("message", reason)
            if reason is not None:
                text = reason if isinstance(reason, str) else json.dumps(reason)
    return " ".join(text[:300].split())


class ServiceClient:
    """One service's client: ``url`` (with ``v1``, fixed up to the OpenAI API root), a bearer key (``api_key``,
    else the environment variable ``key_env``, else none), a per-request ``timeout`` and ``retry``.

    ``name`` ("retrieval service", "judge server", ...) and ``error`` (a :class:`ServiceError` or any exception
    class) make its failures one line in the caller's terms; ``hint`` ends the line of a service that stayed
    unavailable (what to start or change). ``stats`` counts requests, retries by status and the seconds waited.
    ``transport`` replaces the network (``httpx.MockTransport``); ``sleep`` the wait (tests)."""

    def __init__(self, url: str, name: str, *, error: type[Exception] = ServiceError,
                 retry: RetryPolicy = RetryPolicy(), timeout: float = 30.0, api_key: str | None = None,
                 key_env: str | None = None, v1: bool = False, hint: str = "", transport=None, sleep=time.sleep):
        if not url:
            raise ValueError(f"the {name} needs a URL")
        self.url = openai_base(url) if v1 else url.rstrip("/")
        self.name, self.error, self.retry, self.hint, self._sleep = name, error, retry, hint, sleep
        headers = bearer_headers(api_key, key_env)
        if api_key is not None or not key_env:
            self.key_note = "" if headers else "; no key was sent"
        else:
            self.key_note = (f"; the key comes from the environment variable {key_env}" if headers else
                             f"; no key was sent: the environment variable {key_env} is not set")
        self.http = httpx.Client(timeout=timeout, headers=headers, transport=transport)
        self.stats: dict = {"requests": 0, "retried": {}, "waited_s": 0.0}

    def request(self, method: str, path: str, payload=None) -> httpx.Response:
        """The first answer that is neither a connection failure nor a retryable status; after
        ``retry.attempts`` tries, ``error`` naming the service and the last failure."""
        policy, last = self.retry, ""
        for attempt in range(policy.attempts):
            self.stats["requests"] += 1
            response = None
            try:
                response = self.http.request(method, self.url + path, json=payload)
            except httpx.HTTPError as err:  # connection refused, reset, timeout, ...
                last, status = f"{type(err).__name__}: {' '.join(str(err).split())}", "unreachable"
            else:
                if response.status_code not in RETRY_STATUSES and response.status_code < 500:
                    return response
                last, status = f"HTTP {response.status_code}: {_detail(response)}", response.status_code
            if attempt + 1 < policy.attempts:
                delay = retry_delay(attempt, policy.backoff, response, policy.max_backoff)
                self.stats["retried"][status] = self.stats["retried"].get(status, 0) + 1
                self.stats["waited_s"] += delay
                self._sleep(delay)
        tries = f"{policy.attempts} attempt" + ("s" if policy.attempts > 1 else "")
        raise self.error(f"{self.name} at {self.url} is unavailable after {tries}: {last}{self.hint}")

    def check(self, response: httpx.Response, path: str, ok: tuple[int, ...] = (200,)) -> httpx.Response:
        """``response`` when its status is in ``ok``; else ``error``: the request was refused, with the detail
        (and, on 401/403, where the key came from)."""
        if response.status_code in ok:
            return response
        note = self.key_note if response.status_code in (401, 403) else ""
        raise self.error(f"{self.name} at {self.url}{path} rejected the request (HTTP {response.status_code}): "
                         f"{_detail(response)}{note}")

    def json_of(self, response: httpx.Response, path: str):
        """:meth:`check`, then the body as JSON (``error`` when it is not JSON)."""
        response = self.check(response, path)
        try:
            return response.json()
        except ValueError as err:
            raise self.error(f"{self.name} at {self.url}{path} answered with a body that is not JSON: "
                             f"{response.text[:100]!r}") from err

    def json(self, method: str, path: str, payload=None):
        """The JSON answer to one request (:meth:`request`, then :meth:`json_of`)."""
        return self.json_of(self.request(method, path, payload), path)

    def close(self) -> None:
        self.http.close()


def free_port() -> int:
    """A free TCP port on loopback, for a server started in a test or a notebook."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


__all__ = ["RETRY_STATUSES", "RetryPolicy", "ServiceClient", "ServiceError", "bearer_headers", "free_port",
           "openai_base", "retry_delay"]
