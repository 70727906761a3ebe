"""The cost of STIE's generation block, eq. (13), in the local session (``answer-block``). Run as ``python -m kunlunlab.bench answer-block``; see :mod:`kunlunlab.bench`.

Heavy dependencies (torch, faiss, the embedder, the models) are imported inside the benchmark functions, so
``python -m kunlunlab.bench --help`` loads none of them."""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


@dataclass
class AnswerBlockBenchConfig:
    batch: int = 8           # half the rows open an answer box, half a search
    tokens: int = 32         # generated tokens per row and pass (stop strings off)
    repeats: int = 5         # passes per mode, interleaved; the median is reported
    threads: int = 1         # torch threads: on a shared 2-core machine 2 threads spin against other jobs
    model: str | None = None
    seed: int = 0


def bench_answer_block(cfg: AnswerBlockBenchConfig) -> dict:
    """See the module docstring; torch's thread count is restored afterwards."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        return _bench_answer_block(cfg)
    finally:
        torch.set_num_threads(threads)


def _bench_answer_block(cfg: AnswerBlockBenchConfig) -> dict:
    import torch

    from kunlunlab.agent.backends import chat_prompt_ids
    from kunlunlab.agent.protocol import build_messages
    from kunlunlab.agent.stie import RoundInput, STIEController
    from kunlunlab.agent.transformers_backend import TransformersBackend
    from kunlunlab.data.questions import make_questions
    from kunlunlab.data.world import World

    torch.manual_seed(cfg.seed)
    backend = TransformersBackend(cfg.model)
    world = World.generate(n_passages=200, seed=cfg.seed)
    questions = [q.question for q in make_questions(world, cfg.batch, seed=cfg.seed + 1)]
    openers = ["<think>I know this.</think>\n<short_answer>\\boxed{", "<think>I need to look this up.</think>\n<search>"]
    prompts = [chat_prompt_ids(backend.tokenizer, build_messages(q), openers[i % 2]) for i, q in enumerate(questions)]
    controller = STIEController()
    for k in range(controller.config.repeat_k):  # one answer K times: eq. (13) blocks it
        controller.step(0, RoundInput(world.passages[0].title, 0.5, [str(k)]))
    block = controller.answer_block(0)
    answering = [i for i in range(cfg.batch) if i % 2 == 0]
    modes = {"none": [], "answering": answering, "all": list(range(cfg.batch))}
    backend.answer_closers()  # the one-time vocabulary scan is not part of a pass

    def one_pass(rows: list[int]) -> tuple[float, float, dict]:
        session = backend.open(prompts)
        session.block_answers({i: block for i in rows})
        start = time.perf_counter()
        out = session.generate(range(cfg.batch), cfg.tokens, stop=())
        return time.perf_counter() - start, session.block_check_s, out

    one_pass([])  # warm-up
    seconds, checks = {m: [] for m in modes}, {m: [] for m in modes}
    outputs = {}
    for _ in range(cfg.repeats):
        for mode, rows in modes.items():
            elapsed, check, out = one_pass(rows)
            seconds[mode].append(elapsed)
            checks[mode].append(check)
            outputs[mode] = out
    tokens = {m: sum(len(seg.token_ids) for seg in outputs[m].values()) for m in modes}
    per_s = {m: tokens[m] / float(np.median(seconds[m])) for m in modes}
    unblocked = [i for i in range(cfg.batch) if i not in answering]
    return {"batch": cfg.batch, "tokens_per_row": cfg.tokens, "repeats": cfg.repeats, "blocked": list(block.answers),
            **{f"tokens_per_s_{m}": round(per_s[m], 2) for m in modes},
            **{f"ratio_{m}": round(per_s[m] / per_s["none"], 3) for m in modes if m != "none"},
            "seconds": {m: [round(x, 3) for x in seconds[m]] for m in modes},
            # the host work of the block itself, per generation step, and its share of the pass: robust to load
            **{f"block_check_ms_per_step_{m}": round(1000 * float(np.median(checks[m])) / cfg.tokens, 3) for m in modes},
            **{f"block_check_share_{m}": round(sum(checks[m]) / sum(seconds[m]), 4) for m in modes},
            "interventions_answering": sum(seg.interventions for seg in outputs["answering"].values()),
            "unblocked_rows_unchanged": all(outputs["answering"][i].token_ids == outputs["none"][i].token_ids
                                            for i in unblocked),
            "threads": torch.get_num_threads()}
