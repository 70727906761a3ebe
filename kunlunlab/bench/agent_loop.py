"""The real agent loop against plain batched generation (``agent-loop``), and a DAPO step at make run's size
(``dapo-step``). Run as ``python -m kunlunlab.bench agent-loop`` / ``dapo-step``; see :mod:`kunlunlab.bench`.

``agent-loop`` evaluates each method (``kunlun``, ``agent``) through :func:`kunlunlab.eval.harness.evaluate` on the
world's held-out questions at ``--batch`` rows, exactly as ``kunlunlab eval`` does, and counts the model's own
tokens (the trajectories' mask); then times transformers' plain ``generate`` in the same dtype at the same batch,
producing the same number of tokens (``min_new_tokens`` = ``max_new_tokens``, so no row stops early) from the
questions' chat prompts. ``ratio`` = agent model tokens/s over plain tokens/s. The agent's figure includes
everything an evaluation does (RDRA, retrieval, STIE, appended results); loading the model and the index is not
timed (both sides load once). ``--model``: a trained checkpoint (the untrained embedded model rarely searches).
``--repeats``: evaluations and plain runs alternate that many times and each figure is the median over the
repeats, every run listed under ``runs``: on the 2-core EPYC one plain run's tokens/s moved from 194 to 231 within
twenty minutes, so a single ratio moved by ±0.05 (docs/reference.md).

``dapo-step`` starts from a run folder whose SFT stage finished (its ``sft/final`` and ``train_config.json``) and
runs ``--steps`` DAPO steps of that run's own recipe in a temporary folder, the SFT model as the start: seconds per
step, the rollouts (summed from the stage's rollout log) and the rest (TRL's update, log-probs, saving) apart.
"""
from __future__ import annotations

import json
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


@dataclass
class AgentLoopBenchConfig:
    model: str | None = None     # a trained checkpoint folder (None: the embedded SmolLM2)
    methods: str = "kunlun,agent"
    # held-out world questions per method. The count moves both sides: the loop's last questions, finishing alone,
    # weigh less with more of them, and plain generate's rows (tokens/batch new tokens after the bare prompt) grow;
    # at 80 plain's rows span about the contexts the agent's rows do (docs/reference.md, "How fast the agent loop runs")
    questions: int = 80
    batch: int = 20
    dtype: str = "auto"          # the generation dtype of both sides (auto: bfloat16 where the CPU has it)
    repeats: int = 1             # evaluation and plain runs alternated this many times; medians reported

    def __post_init__(self):
        if self.questions < 1 or self.batch < 1 or self.repeats < 1:
            raise SystemExit(f"agent-loop: --questions, --batch and --repeats must be at least 1 (got "
                             f"{self.questions}, {self.batch}, {self.repeats})")


def _plain_generate(backend, prompts: list[list[int]], tokens_per_row: int) -> float:
    """Seconds of one ``model.generate`` call over ``prompts`` (left-padded), ``tokens_per_row`` new tokens each."""
    import torch

    tok = backend.tokenizer
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), backend.pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    start = time.perf_counter()
    with torch.no_grad():
        backend.model.generate(input_ids=ids.to(backend.device), attention_mask=mask.to(backend.device),
                               max_new_tokens=tokens_per_row, min_new_tokens=tokens_per_row, do_sample=False,
                               pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else backend.pad_id)
    return time.perf_counter() - start


def bench_agent_loop(cfg: AgentLoopBenchConfig) -> dict:
    import torch

    from kunlunlab.agent.backends import chat_prompt_ids
    from kunlunlab.agent.protocol import build_messages
    from kunlunlab.eval.harness import EvalConfig, build_pipeline, evaluate, load_data, with_checkpoint_settings

    out: dict = {"batch": cfg.batch, "questions": cfg.questions, "threads": torch.get_num_threads(),
                 "model": cfg.model or "embedded", "repeats": cfg.repeats}
    methods = [m.strip() for m in cfg.methods.split(",") if m.strip()]
    runs: dict[str, list[dict]] = {method: [] for method in methods}
    backend, setups = None, {}
    with tempfile.TemporaryDirectory() as tmp:
        for method in methods:  # load and index outside the clock
            config = with_checkpoint_settings(EvalConfig(dataset="world", method=method, limit=cfg.questions,
                                                         batch_size=cfg.batch, model=cfg.model, dtype=cfg.dtype),
                                              explicit={"method"})
            examples, passages = load_data(config)
            _, retriever, backend = build_pipeline(config, passages, backend)
            setups[method] = (config, examples, passages, retriever)
        prompts = [chat_prompt_ids(backend.tokenizer, build_messages(ex.question)) for ex in examples[:cfg.batch]]
        for repeat in range(cfg.repeats):
            for method in methods:
                config, examples, passages, retriever = setups[method]
                records = Path(tmp) / f"{method}.{repeat}.jsonl"
                start = time.perf_counter()
                summary = evaluate(config, records, backend=backend, examples=examples, passages=passages,
                                   retriever=retriever, progress=False)
                seconds = time.perf_counter() - start
                rows = [json.loads(line) for line in records.read_text().splitlines()]
                tokens = sum(sum(r["trajectory"].get("mask", [])) for r in rows)
                per_row = max(1, -(-tokens // len(prompts)))  # plain generate of the same token count
                plain = len(prompts) * per_row / _plain_generate(backend, prompts, per_row)
                runs[method].append({"seconds": round(seconds, 1), "model_tokens": tokens,
                                     "tokens_per_s": round(tokens / seconds, 1), "plain_tokens_per_s": round(plain, 1),
                                     "ratio": round(tokens / seconds / plain, 3), "em": summary.get("em"),
                                     "answer_tag_share": summary.get("tagged_share")})
    for method, done in runs.items():
        middle = {key: statistics.median(run[key] for run in done)
                  for key in ("seconds", "tokens_per_s", "plain_tokens_per_s", "ratio")}
        last = done[-1]
        out[method] = {"seconds": round(middle["seconds"], 1),
                       "seconds_per_question": round(middle["seconds"] / len(setups[method][1]), 2),
                       "model_tokens": last["model_tokens"], "tokens_per_s": round(middle["tokens_per_s"], 1),
                       "em": last["em"], "answer_tag_share": last["answer_tag_share"],
                       "plain_tokens_per_s": round(middle["plain_tokens_per_s"], 1),
                       "ratio": round(middle["ratio"], 3)}
        if cfg.repeats > 1:
            out[method]["runs"] = done
    out["dtype"] = str(next(backend.model.parameters()).dtype).removeprefix("torch.")
    return out


@dataclass
class DapoStepBenchConfig:
    sft_run: str = ""            # a `kunlunlab train` run folder whose SFT stage finished
    steps: int = 2               # DAPO steps timed (the recipe's own sizes otherwise)
    overrides: str = ""          # TrainConfig changes after the recipe's, space-separated (e.g. "dapo.micro_batch_size=2")


def bench_dapo_step(cfg: DapoStepBenchConfig) -> dict:
    from kunlunlab.retrieval.sharded import peak_rss_mb
    from kunlunlab.training.config import load_config
    from kunlunlab.training.pipeline import TrainingRun

    source = Path(cfg.sft_run)
    if not (source / "sft" / "final").is_dir() or not (source / "train_config.json").is_file():
        raise SystemExit(f"dapo-step: {source} is not a run folder with a finished SFT stage (sft/final, "
                         "train_config.json)")
    config = load_config(source / "train_config.json",
                         [f"model={source / 'sft' / 'final'}", "sft.enabled=false", f"dapo.steps={cfg.steps}",
                          f"dapo.save_steps={cfg.steps}", "eval.before=false",
                          "own_process_stages=[]", *cfg.overrides.split()])  # timed and measured in this process
    with tempfile.TemporaryDirectory() as tmp:
        run = TrainingRun(config, Path(tmp) / "run")
        start = time.perf_counter()
        run.dapo()
        total = time.perf_counter() - start
        rollouts = [json.loads(line) for line in (run.run_dir / "dapo_rollouts.jsonl").read_text().splitlines()]
    rollout_s = sum(r["seconds"] for r in rollouts)
    return {"steps": cfg.steps, "seconds_total": round(total, 1), "rollout_calls": len(rollouts),
            "rollout_s_per_step": round(rollout_s / cfg.steps, 1),
            "update_and_overhead_s_per_step": round((total - rollout_s) / cfg.steps, 1),
            "seconds_per_step": round(total / cfg.steps, 1),
            "rollouts_generated_per_step": round(sum(r.get("generated", r["rollouts"]) for r in rollouts) / cfg.steps, 1),
            "overrides": cfg.overrides,
            "inference_dtype": config.inference_dtype,
            "peak_rss_gib": round(peak_rss_mb() / 1024, 2)}
