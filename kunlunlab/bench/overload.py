"""Both servers beside work that would hold them (issue 44): ``llm-overload`` and ``retriever-overload``. Run as
``python -m kunlunlab.bench llm-overload`` / ``retriever-overload``; see :mod:`kunlunlab.bench`.

Each server runs as ``kunlunlab serve-llm`` / ``serve-retriever`` in its own process, started with no flag beyond
its port (so the same benchmark measures an older checkout, whose command line lacks the new limits), and is driven
from this one by asyncio clients. Every request is bounded by a client timeout: one that is not answered in time
counts at its timeout, so a p99 over requests that timed out is a lower bound (``timed_out`` says how many). Last,
the server gets one SIGTERM: ``sigterm_exit_s`` is how long it took to exit (None: it had not exited after
``stop_timeout`` seconds and was killed).

Heavy dependencies are imported inside the benchmark functions, so ``python -m kunlunlab.bench --help`` loads none."""
from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np

API_KEY_VARIABLES = ("KUNLUNLAB_LLM_API_KEY", "KUNLUNLAB_RETRIEVER_API_KEY")  # the servers' default --api-key
COUNTING = ", ".join(str(i) for i in range(1, 30)) + ","  # a greedy small model counts on for thousands of tokens


@dataclass
class LLMOverloadBenchConfig:
    duration: float = 30.0       # seconds of short requests after the long one is abandoned
    alone: float = 10.0          # seconds of short requests before, with nothing else in flight (the reference)
    clients: int = 4             # closed-loop clients of short requests
    short_tokens: int = 8
    long_tokens: int = 8000      # the abandoned request's max_tokens (with its prompt inside the model's 8192)
    abandon_after: float = 2.0   # its client gives up after this many seconds and closes the connection
    short_timeout: float = 30.0
    stop_timeout: float = 30.0
    model: str | None = None
    threads: int = 0             # the server's torch threads (OMP_NUM_THREADS; 0: torch's default)


@dataclass
class RetrieverOverloadBenchConfig:
    duration: float = 60.0       # seconds of one-query requests beside the maximal ones
    alone: float = 10.0          # seconds of one-query requests with nothing else in flight (the reference)
    n: int = 2000                # synthetic-world passages in the served flat index
    small_clients: int = 4       # closed-loop clients of one-query requests (topk 3)
    big_clients: int = 1         # closed-loop clients of maximal requests
    big_queries: int = 256       # queries per maximal request (the service's max_queries)
    big_query_chars: int = 2048  # characters per query (max_query_chars)
    big_topk: int = 100          # (max_topk)
    timeout: float = 120.0
    stop_timeout: float = 30.0
    threads: int = 0             # the server's torch/FAISS threads (serve-retriever --threads; 0: their default)
    seed: int = 0


class _Server:
    """``python -m kunlunlab.cli <args>`` on a free loopback port, its log in a temporary file."""

    def __init__(self, args: list[str], ready_path: str, env: dict | None = None, start_timeout: float = 300.0):
        from kunlunlab.retrieval.client import free_port

        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = tempfile.NamedTemporaryFile(prefix="kunlunlab-bench-server-", suffix=".log", delete=False)
        base = {k: v for k, v in os.environ.items() if k not in API_KEY_VARIABLES}  # an open loopback server
        self.proc = subprocess.Popen([sys.executable, "-m", "kunlunlab.cli", *args, "--port", str(self.port)],
                                     stdout=self.log, stderr=subprocess.STDOUT, env={**base, **(env or {})})
        deadline = time.time() + start_timeout
        while True:
            if self.proc.poll() is not None or time.time() > deadline:
                self.proc.kill()
                self.proc.wait()
                tail = self.tail()
                self.log.close()
                os.unlink(self.log.name)
                raise RuntimeError(f"the server did not start: {tail}")
            try:
                if httpx.get(self.url + ready_path, timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)

    def tail(self) -> str:
        return Path(self.log.name).read_text(errors="replace")[-2000:]

    def sigterm(self, timeout: float) -> float | None:
        """Seconds from one SIGTERM to the process's exit; None when it had not exited by ``timeout`` (killed)."""
        start = time.perf_counter()
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
            return round(time.perf_counter() - start, 2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None
        finally:
            self.log.close()
            os.unlink(self.log.name)


def _summary(latencies: list[float], timed_out: int, errors: int) -> dict:
    """p50/p99/max in ms over every request, those that timed out counted at their timeout."""
    ms = np.asarray(latencies) * 1000.0
    pick = (lambda q: round(float(np.percentile(ms, q)), 1)) if len(ms) else (lambda q: None)
    return {"requests": len(latencies) + errors, "ok": len(latencies) - timed_out, "timed_out": timed_out,
            "errors": errors, "p50_ms": pick(50), "p99_ms": pick(99), "max_ms": round(float(ms.max()), 1) if len(ms)
            else None}


async def _closed_loop(http: httpx.AsyncClient, url: str, payloads, clients: int, duration: float,
                       timeout: float) -> dict:
    """``clients`` clients, each sending its next payload when the previous one is answered, for ``duration`` s."""
    latencies: list[float] = []
    counts = {"timed_out": 0, "errors": 0}
    deadline = time.perf_counter() + duration

    async def client(i: int) -> None:
        k = i
        while time.perf_counter() < deadline:
            payload = payloads(k)
            k += clients
            sent = time.perf_counter()
            try:
                response = await http.post(url, json=payload, timeout=timeout)
            except httpx.TimeoutException:
                counts["timed_out"] += 1
                latencies.append(timeout)
                continue
            except httpx.HTTPError:
                counts["errors"] += 1
                continue
            if response.status_code != 200:
                counts["errors"] += 1
                continue
            latencies.append(time.perf_counter() - sent)

    await asyncio.gather(*(client(i) for i in range(clients)))
    return _summary(latencies, counts["timed_out"], counts["errors"])


def bench_llm_overload(cfg: LLMOverloadBenchConfig) -> dict:
    """``serve-llm`` (the embedded model unless ``model``): short requests alone, then while a client abandons a
    ``long_tokens`` request after ``abandon_after`` s; then one SIGTERM."""
    args = ["serve-llm", "--device", "cpu"] + (["--model", cfg.model] if cfg.model else [])
    env = {"OMP_NUM_THREADS": str(cfg.threads)} if cfg.threads else {}
    server = _Server(args, "/v1/models", env)
    endpoint = server.url + "/v1/completions"

    def short(k: int) -> dict:
        return {"prompt": f"Question {k}: what is the capital of France? Answer:", "max_tokens": cfg.short_tokens,
                "temperature": 0}

    async def run() -> dict:
        async with httpx.AsyncClient() as http:
            await http.post(endpoint, json=short(0), timeout=120)  # the first call's one-off costs
            alone = await _closed_loop(http, endpoint, short, cfg.clients, cfg.alone, cfg.short_timeout)
            print(f"short requests alone: {alone}", flush=True)
            abandoned = False
            try:
                await http.post(endpoint, json={"prompt": COUNTING, "max_tokens": cfg.long_tokens, "temperature": 0},
                                timeout=cfg.abandon_after)
            except httpx.TimeoutException:
                abandoned = True  # httpx closes the connection: the server sees its client leave
            beside = await _closed_loop(http, endpoint, short, cfg.clients, cfg.duration, cfg.short_timeout)
            print(f"short requests after a {cfg.long_tokens}-token request was abandoned: {beside}", flush=True)
            return {"alone": alone, "beside_abandoned": beside, "long_request_abandoned": abandoned}

    try:
        result = asyncio.run(run())
    finally:
        exit_s = server.sigterm(cfg.stop_timeout)
    print(f"SIGTERM to exit: {exit_s if exit_s is not None else f'not within {cfg.stop_timeout:g}'} s", flush=True)
    return {**result, "sigterm_exit_s": exit_s, "clients": cfg.clients, "short_tokens": cfg.short_tokens,
            "long_tokens": cfg.long_tokens, "abandon_after_s": cfg.abandon_after, "short_timeout_s": cfg.short_timeout,
            "duration_s": cfg.duration, "cpus": os.cpu_count()}


def bench_retriever_overload(cfg: RetrieverOverloadBenchConfig) -> dict:
    """``serve-retriever`` over a flat index of ``n`` world passages: one-query requests alone, then beside
    ``big_clients`` clients sending maximal requests (``big_queries`` queries of ``big_query_chars`` characters,
    ``big_topk``), each of new queries so that no query cache helps; then one SIGTERM."""
    from kunlunlab.data.questions import make_questions
    from kunlunlab.data.world import World
    from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
    from kunlunlab.retrieval.store import save_retriever

    world = World.generate(n_passages=max(cfg.n, 200), seed=cfg.seed)
    passages = world.passages[:cfg.n]
    questions = make_questions(world, 500, seed=cfg.seed + 1)
    small_queries = list(dict.fromkeys(hop.question for q in questions for hop in q.chain))
    rng = np.random.default_rng(cfg.seed)
    texts = [p.contents for p in passages]

    def long_query() -> str:
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < cfg.big_query_chars:
            words.extend(texts[int(rng.integers(len(texts)))].split())
        return " ".join(words)[:cfg.big_query_chars]

    with tempfile.TemporaryDirectory() as tmp:
        retriever = build_retriever(passages, IndexConfig(kind="flat"), progress=True)
        folder = save_retriever(retriever, Path(tmp) / "flat")
        del retriever
        args = ["serve-retriever", "--index", str(folder)] + (["--threads", str(cfg.threads)] if cfg.threads else [])
        server = _Server(args, "/health")
        endpoint = server.url + "/retrieve"

        def small(k: int) -> dict:
            return {"queries": [small_queries[k % len(small_queries)]], "topk": 3}

        def big(k: int) -> dict:
            return {"queries": [long_query() for _ in range(cfg.big_queries)], "topk": cfg.big_topk}

        async def run() -> dict:
            limits = httpx.Limits(max_connections=cfg.small_clients + cfg.big_clients + 4)
            async with httpx.AsyncClient(limits=limits) as http:
                alone = await _closed_loop(http, endpoint, small, cfg.small_clients, cfg.alone, cfg.timeout)
                print(f"one-query requests alone: {alone}", flush=True)
                beside, maximal = await asyncio.gather(
                    _closed_loop(http, endpoint, small, cfg.small_clients, cfg.duration, cfg.timeout),
                    _closed_loop(http, endpoint, big, cfg.big_clients, cfg.duration, cfg.timeout))
                print(f"one-query requests beside maximal ones: {beside}", flush=True)
                print(f"maximal requests: {maximal}", flush=True)
                return {"alone": alone, "beside_maximal": beside, "maximal": maximal}

        try:
            result = asyncio.run(run())
        finally:
            exit_s = server.sigterm(cfg.stop_timeout)
    print(f"SIGTERM to exit: {exit_s if exit_s is not None else f'not within {cfg.stop_timeout:g}'} s", flush=True)
    return {**result, "sigterm_exit_s": exit_s, "n": cfg.n, "small_clients": cfg.small_clients,
            "big_clients": cfg.big_clients, "big_queries": cfg.big_queries, "big_query_chars": cfg.big_query_chars,
            "big_topk": cfg.big_topk, "duration_s": cfg.duration, "cpus": os.cpu_count()}
