"""Benchmarks that print their figures, JSON as the last line.

    python -m kunlunlab.bench retrieval [--n 100000] [--mode world|gaussian] [--queries 1000]
    python -m kunlunlab.bench rollout [--batch 8] [--searches 3] [--n 10000]
    python -m kunlunlab.bench agent-loop [--model CHECKPOINT] [--methods kunlun,agent] [--questions 40] [--batch 20]
    python -m kunlunlab.bench dapo-step --sft-run RUN_FOLDER [--steps 2]
    python -m kunlunlab.bench answer-block [--batch 8] [--tokens 32] [--repeats 3]
    python -m kunlunlab.bench service [--clients 32] [--duration 60] [--n 20000]
    python -m kunlunlab.bench llm-overload [--duration 30] [--clients 4] [--long-tokens 8000]
    python -m kunlunlab.bench retriever-overload [--duration 60] [--small-clients 4] [--big-clients 1]
    python -m kunlunlab.bench encode [--n 10000] [--precisions float32,onnx,bfloat16,int8]
    python -m kunlunlab.bench build [--n 10000] [--index-n 1000000] [--engine stream|ray]
    python -m kunlunlab.bench exact-search [--device cuda] [--n 21000000|max] [--dtype float16] [--queries 64]

``retrieval``: exact Flat vs IVF-PQ vs the clustering retriever, one query at a time, the same
FAISS thread count for every index, recall@10 against exact top-10, measured by
:func:`kunlunlab.retrieval.evaluation.compare_indexes` (the comparison notebook 01 draws). ``world``
mode embeds synthetic-world passages with the embedder (cached after the first run) and queries with the
sub-questions of the world's gold chains (the queries an agent actually issues); ``gaussian``
mode draws a mixture of Gaussians, for 1M+ vectors without the embedding cost.

``rollout``: token throughput of the multi-turn rollout (generation, one batched retrieval call
per turn, result blocks prefilled into the KV cache) against plain batched generation of the same
number of tokens per row on the same model and prompts (EOS does not end a plain row: it decodes the
row's count); the rollout's appended tokens prefilled alone (``ratio_plain_plus_prefill``: what a loop
whose only extra cost were those prefills would reach); plus retrieval time per call and STIE time per
round. The embedded model does not search on its own before training, so the benchmark opens each turn
with a scripted ``<search>`` (``RolloutConfig.result_suffix``): the tokens the model writes, the
retrieval calls and the appended results are all real.

``agent-loop`` and ``dapo-step`` (:mod:`kunlunlab.bench.agent_loop`, issue 54): the evaluation of ``kunlun`` and
``agent`` as ``kunlunlab eval`` runs it, in model tokens/s beside plain ``generate`` of as many tokens at the same
batch and dtype; seconds per DAPO step of a run's own recipe from its SFT model, rollouts and update apart.

``answer-block``: the cost of STIE's generation block (eq. 13) in the local session. One batch, half of the
rows opened inside an answer box (``<short_answer>\\boxed{``), half before a search; passes interleaved over
three modes: ``none`` (no row blocked: the path of every row without blocked answers), ``answering`` (the
rows inside the box carry the block of an answer repeated K times, from a real STIE controller) and ``all``
(every row carries it). Generated tokens/s per mode (median of ``--repeats`` passes), the ratio to ``none``,
the host time of the block's checks per step and its share of the pass (the load-independent figure), and
whether the rows without a block generated the same tokens as in ``none``. One torch thread by default:
with two on the shared 2-core machine single passes varied 0.8-54 s (OpenMP threads spinning against other
jobs), with one 0.77-1.32 s.

``exact-search``: exact top-k of one batch of queries over N random unit vectors by the flat index on a
device (FAISS on the CPU; on a GPU faiss-gpu or torch's matrix product in float16/bfloat16), the vectors
drawn on the device itself; ``--n max`` sizes N to 80 % of the free memory.

``service``: the retrieval service under ``--clients`` concurrent closed-loop clients, micro-batching
on and then off (one request per search), same index and queries; requests/s, p50/p99 latency,
errors, lost requests and ``batching_speedup`` (requests/s with batching / without).

``llm-overload`` and ``retriever-overload`` (:mod:`kunlunlab.bench.overload`, issue 44): each server in its own
process, started with its defaults. ``llm-overload``: p50/p99 of short completions from ``--clients`` closed-loop
clients alone, then after a client abandoned a ``--long-tokens`` request (the client timed out after
``--abandon-after`` s and closed its connection). ``retriever-overload``: p50/p99 of one-query requests alone, then
beside clients sending maximal requests (256 queries of 2048 characters, topk 100). Both end with one SIGTERM and
report the seconds to exit; requests that time out count at their timeout (a lower bound).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict

from kunlunlab.bench.agent_loop import AgentLoopBenchConfig, DapoStepBenchConfig, bench_agent_loop, bench_dapo_step
from kunlunlab.bench.answer_block import AnswerBlockBenchConfig, bench_answer_block
from kunlunlab.bench.build import BuildBenchConfig, bench_build
from kunlunlab.bench.encode import EncodeBenchConfig, bench_encode
from kunlunlab.bench.exact_search import ExactSearchBenchConfig, bench_exact_search
from kunlunlab.bench.overload import (LLMOverloadBenchConfig, RetrieverOverloadBenchConfig, bench_llm_overload,
                                      bench_retriever_overload)
from kunlunlab.bench.retrieval import RetrievalBenchConfig, bench_retrieval, gaussian_mixture, gaussian_vectors
from kunlunlab.bench.rollout import RolloutBenchConfig, bench_rollout
from kunlunlab.bench.service import ServiceBenchConfig, bench_service


# name -> (help, config dataclass, benchmark); each config field is a flag (--field-name), a bool one a
# --flag / --no-flag pair
BENCHMARKS = {
    "retrieval": ("Flat vs IVF-PQ vs clustering retriever", RetrievalBenchConfig, bench_retrieval),
    "rollout": ("multi-turn rollout vs plain batched generation; STIE cost", RolloutBenchConfig, bench_rollout),
    "agent-loop": ("kunlun/agent evaluation in model tokens/s vs plain generate of as many tokens",
                   AgentLoopBenchConfig, bench_agent_loop),
    "dapo-step": ("seconds per DAPO step of a run's recipe from its SFT model, rollouts and update apart",
                  DapoStepBenchConfig, bench_dapo_step),
    "answer-block": ("cost of STIE's generation block (eq. 13) in the local session", AnswerBlockBenchConfig,
                     bench_answer_block),
    "encode": ("query encoding: queries/s at batch 1/8/64 per precision, recall@10 change", EncodeBenchConfig,
               bench_encode),
    "service": ("retrieval service under concurrent clients, micro-batching on vs off", ServiceBenchConfig,
                bench_service),
    "llm-overload": ("serve-llm: short requests while an abandoned long one is in flight; SIGTERM to exit",
                     LLMOverloadBenchConfig, bench_llm_overload),
    "retriever-overload": ("serve-retriever: one-query requests beside maximal ones; SIGTERM to exit",
                           RetrieverOverloadBenchConfig, bench_retriever_overload),
    "build": ("peak memory and time of a streamed (sharded) index build", BuildBenchConfig, bench_build),
    "exact-search": ("exact top-k of a batch of queries over N random vectors on a device (--n max: the most that "
                     "fit in 80%% of free memory)", ExactSearchBenchConfig, bench_exact_search),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kunlunlab.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="which", required=True)
    for name, (help_text, config, _) in BENCHMARKS.items():
        command = sub.add_parser(name, help=help_text)
        for field_name, value in asdict(config()).items():
            flag = "--" + field_name.replace("_", "-")
            if isinstance(value, bool):
                command.add_argument(flag, action=argparse.BooleanOptionalAction, default=value)
            else:
                command.add_argument(flag, type=type(value) if value is not None else str, default=value)
    args = parser.parse_args(argv)
    _, config, bench = BENCHMARKS[args.which]
    cfg = config(**{k: getattr(args, k) for k in asdict(config())})
    try:
        result = bench(cfg)
    except ValueError as err:
        if args.which != "exact-search":
            raise
        # a device without a GPU, an N that does not fit, a bad dtype: one line
        print(f"python -m kunlunlab.bench exact-search: {err}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


__all__ = ["AgentLoopBenchConfig", "AnswerBlockBenchConfig", "DapoStepBenchConfig", "bench_agent_loop", "bench_dapo_step", "BuildBenchConfig", "EncodeBenchConfig", "ExactSearchBenchConfig",
           "LLMOverloadBenchConfig", "RetrievalBenchConfig", "RetrieverOverloadBenchConfig", "RolloutBenchConfig",
           "ServiceBenchConfig", "bench_answer_block", "bench_build", "bench_encode", "bench_exact_search",
           "bench_llm_overload", "bench_retrieval", "bench_retriever_overload", "bench_rollout", "bench_service",
           "gaussian_mixture", "gaussian_vectors", "main"]
