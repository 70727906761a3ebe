"""Closed-loop load against the retrieval service: ``clients`` concurrent clients, each sending its next
request as soon as the previous one is answered, for ``duration_s`` seconds.

Closed loop, like agents in an RL rollout that wait for their search results, so the figure is the
service's capacity at that concurrency. Failures are counted, never hidden: ``errors`` are requests
whose last answer after the retries was not 200, ``lost`` are requests that never got any answer
(connection refused or reset, timeouts, on every attempt). Retries follow
:class:`~kunlunlab.retrieval.client.RetrievalClient` (backoff, ``Retry-After`` on 429/503), so a
service restart shorter than the retry budget costs latency, not requests.

    python -m kunlunlab.bench.loadtest http://127.0.0.1:8000 --queries-file q.txt --clients 32 --duration 60
"""
from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections import defaultdict
from typing import Sequence

import httpx
import numpy as np

from kunlunlab.retrieval.client import RETRY_STATUSES, bearer_headers, retry_delay


async def _post(http: httpx.AsyncClient, endpoint: str, payload: dict, retries: int, backoff: float,
                max_backoff: float, counts: dict) -> httpx.Response | None:
    """The last answer the service gave (possibly an error status), or None when no attempt got one."""
    answer: httpx.Response | None = None
    delay = 0.0
    for attempt in range(retries + 1):
        if attempt:
            counts["retries"] += 1
            await asyncio.sleep(delay)
        try:
            answer = await http.post(endpoint, json=payload)
        except httpx.HTTPError:
            delay = retry_delay(attempt, backoff, None, max_backoff)
            continue
        if answer.status_code not in RETRY_STATUSES:
            return answer
        delay = retry_delay(attempt, backoff, answer, max_backoff)
    return answer


async def run_load_async(url: str, queries: Sequence[str], clients: int, duration_s: float,
                         queries_per_request: int = 1, topk: int = 3, max_requests: int | None = None, *,
                         timeout: float = 30.0, retries: int = 5, backoff: float = 0.05, max_backoff: float = 1.0,
                         keep_answers: bool = False, api_key: str | None = None) -> dict:
    """See :func:`run_load`; for callers already inside an event loop."""
    if not queries or clients < 1 or queries_per_request < 1:
        raise ValueError("need at least one query, one client and one query per request")
    endpoint = url.rstrip("/") + "/retrieve"
    counts = {"sent": 0, "ok": 0, "errors": 0, "lost": 0, "retries": 0}
    latencies: list[float] = []
    answers: dict[str, list[list[tuple[str, float]]]] = defaultdict(list)
    last_error = ""
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(timeout=timeout, limits=limits, headers=bearer_headers(api_key)) as http:
        start = time.perf_counter()
        deadline = start + duration_s

        async def client(i: int) -> None:
            nonlocal last_error
            position = i * queries_per_request  # the clients sweep the queries side by side, not in step
            while time.perf_counter() < deadline and (max_requests is None or counts["sent"] < max_requests):
                batch = [queries[(position + j) % len(queries)] for j in range(queries_per_request)]
                position += clients * queries_per_request
                counts["sent"] += 1
                sent_at = time.perf_counter()
                payload = {"queries": batch, "topk": topk, "return_scores": True}
                answer = await _post(http, endpoint, payload, retries, backoff, max_backoff, counts)
                if answer is None:
                    counts["lost"] += 1
                elif answer.status_code != 200:
                    counts["errors"] += 1
                    last_error = f"HTTP {answer.status_code}: {answer.text[:200]}"
                else:
                    latencies.append(time.perf_counter() - sent_at)
                    counts["ok"] += 1
                    if keep_answers:
                        for query, hits in zip(batch, answer.json()["result"]):
                            answers[query].append([(h["document"]["id"], h["score"]) for h in hits])

        await asyncio.gather(*(client(i) for i in range(clients)))
        elapsed = time.perf_counter() - start
    ms = np.asarray(latencies) * 1000.0
    result = {"clients": clients, "requests": counts["sent"], "ok": counts["ok"],
              "requests_per_s": round(counts["ok"] / elapsed, 1),
              "queries_per_s": round(counts["ok"] * queries_per_request / elapsed, 1),
              "p50_ms": round(float(np.percentile(ms, 50)), 2) if len(ms) else None,
              "p99_ms": round(float(np.percentile(ms, 99)), 2) if len(ms) else None,
              "errors": counts["errors"], "lost": counts["lost"], "retries": counts["retries"],
              "seconds": round(elapsed, 2), "queries_per_request": queries_per_request, "topk": topk}
    if last_error:
        result["last_error"] = last_error
    if keep_answers:
        result["answers"] = dict(answers)
    return result


def run_load(url: str, queries: Sequence[str], clients: int, duration_s: float, queries_per_request: int = 1,
             topk: int = 3, max_requests: int | None = None, **options) -> dict:
    """Drives ``url``'s ``/retrieve`` with ``clients`` concurrent clients for ``duration_s`` seconds (or until
    ``max_requests`` are sent), each request ``queries_per_request`` of ``queries`` taken in turn.

    Returns ``clients, requests, ok, requests_per_s`` (answered with 200, per second), ``queries_per_s,
    p50_ms, p99_ms`` (latency of answered requests, retries included), ``errors, lost, retries, seconds``;
    with ``keep_answers=True`` also ``answers``: query -> one ``[(id, score), ...]`` list per answer.
    ``options``: ``timeout, retries, backoff, max_backoff, keep_answers, api_key`` (None:
    ``$KUNLUNLAB_RETRIEVER_API_KEY`` when set, as :class:`~kunlunlab.retrieval.client.RetrievalClient`)."""
    return asyncio.run(run_load_async(url, queries, clients, duration_s, queries_per_request, topk, max_requests,
                                      **options))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kunlunlab.bench.loadtest", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url")
    parser.add_argument("--queries-file", required=True, help="one query per line")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--duration", type=float, default=60.0)
    parser.add_argument("--warmup", type=float, default=0.0, help="seconds of load before the measured run")
    parser.add_argument("--queries-per-request", type=int, default=1)
    parser.add_argument("--topk", type=int, default=3)
    parser.add_argument("--retries", type=int, default=5)
    args = parser.parse_args(argv)
    with open(args.queries_file, encoding="utf-8") as fh:
        queries = [line.rstrip("\n") for line in fh if line.strip()]
    common = dict(queries_per_request=args.queries_per_request, topk=args.topk, retries=args.retries)
    if args.warmup > 0:
        run_load(args.url, queries, args.clients, args.warmup, **common)
    print(json.dumps(run_load(args.url, queries, args.clients, args.duration, **common)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
