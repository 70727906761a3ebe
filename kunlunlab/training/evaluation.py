"""Evaluation inside a training run: the held-out evaluations before and after training, the prompt baselines
on a recipe's questions, and the agent settings a checkpoint carries.

Its own module because it is one job the training stages do not share: it wires the evaluation pipeline
(:func:`kunlunlab.eval.harness.evaluate`) to the model being trained, spreads the questions over the processes of
an ``accelerate launch`` and reduces the records to the numbers ``training_summary.json`` reports.
:meth:`kunlunlab.training.pipeline.TrainingRun.evaluate` calls :func:`heldout_evaluation` and caches its result in
``state.json``.
"""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from kunlunlab.agent.protocols import get_protocol
from kunlunlab.agent.transformers_backend import TransformersBackend
from kunlunlab.data.splits import TrainingData, load_splits
from kunlunlab.eval.harness import EvalConfig, apply_agent_settings, evaluate
from kunlunlab.eval.metrics import summarize
from kunlunlab.eval.records import RecordWriter, evaluation_identity, read_records, records_of_same_evaluation
from kunlunlab.training.config import TrainConfig
from kunlunlab.training.dapo import gather_across
from kunlunlab.training.records import write_log
from kunlunlab.training.rewards import format_compliant, parse_completion


def format_compliance(records: list[dict], protocol: str = "search_think") -> float | None:
    """The share of trajectories that follow the agent's protocol end to end: this project's check for the
    search-think protocol, a peer's own format check for its protocol (the completion after the assistant prefix)."""
    texts = [r["trajectory"].get("text") for r in records if isinstance(r.get("trajectory"), dict)]
    texts = [t for t in texts if t is not None]
    if not texts:
        return None
    spoken = get_protocol(protocol)
    if spoken.answer_modes:  # this project's protocol: the dual-mode reward's parse record
        return round(sum(format_compliant(parse_completion(t)) for t in texts) / len(texts), 4)
    return round(sum(spoken.format_ok(t[len(spoken.assistant_prefix):] if t.startswith(spoken.assistant_prefix) else t)
                     for t in texts) / len(texts), 4)


def agent_settings(cfg: TrainConfig) -> dict:
    """The whole agent configuration a checkpoint was trained for: method, RDRA and STIE as configured, the
    retrieval (index kind, embedder, passages per search and their length) and the evaluation's budgets.
    Written beside its weights as ``kunlunlab_agent.json``; ``kunlunlab eval``, ``kunlunlab suite`` and
    notebooks 05-07 apply it wherever they are not told otherwise, so a checkpoint is evaluated as trained."""
    return {"method": cfg.eval.method, "index_kind": cfg.index_kind, "embedder": cfg.embedder,
            "top_k": cfg.passages_per_search, "max_result_chars": cfg.max_result_chars,
            "max_turn_tokens": cfg.eval.max_turn_tokens, "max_total_tokens": cfg.eval.max_total_tokens,
            "max_searches": cfg.search_limit(cfg.eval.max_total_tokens), "use_rdra": cfg.eval.method == "kunlun",
            "use_stie": cfg.eval.method == "kunlun",
            "rdra": asdict(cfg.agent.rdra), "stie": asdict(cfg.agent.stie)}


def evaluate_model(model, tokenizer, cfg: TrainConfig, examples, passages, dataset: str, out: Path,
                   share: tuple[int, int] = (0, 1), retrieval=None, index=None) -> dict:
    """EM / F1 / format compliance of the current model with the evaluation pipeline, on the model's own device.
    ``share``: (process index, processes) under ``accelerate launch``: every process evaluates every
    ``processes``-th question and the records are gathered (a collective: every process calls it), so a GPU
    run's evaluation is spread over the GPUs instead of running on one while the others wait. The main process
    writes ``out`` (records in question order); every process returns the same summary. ``retrieval`` (a
    configured :class:`~kunlunlab.training.config.RetrievalSource`): the searches go to its service or saved
    index instead of an index over ``passages``. ``index``: an opened retriever over ``passages`` (the run's,
    built once per launch) that every process searches instead of building its own."""
    if not examples:
        return {}
    rank, processes = share
    model.eval()
    backend = TransformersBackend(model=model, tokenizer=tokenizer, dtype=cfg.inference_dtype)
    backend.name = cfg.model or "smollm2-135m-instruct"
    shard = examples[rank::processes]  # empty on a process past the last question: it still joins the gather
    remote = retrieval is not None and retrieval.configured
    out = Path(out)
    shard_out = out if processes == 1 else out.with_name(f"{out.stem}.rank{rank}{out.suffix}")
    records, summary = [], {"wall_seconds": 0.0}
    if shard:
        # the world's index kind and embedder stay explicit: with a service or saved index (the real data's) the
        # checkpoint settings leave them out, and the service is still checked against the run's embedder
        ec = apply_agent_settings(EvalConfig(dataset=dataset, limit=len(shard), judge=None, index_kind=cfg.index_kind,
                                             embedder=cfg.embedder, batch_size=cfg.eval.batch_size,
                                             seed=cfg.world_seed, retriever_url=retrieval.url if remote else None,
                                             index_dir=retrieval.index_dir if remote else None), agent_settings(cfg))
        opened = None if remote else index
        summary = evaluate(ec, shard_out, backend=backend, examples=shard,
                           passages=None if remote or opened is not None else passages, retriever=opened,
                           progress=rank == 0)
        records = [json.loads(line) for line in shard_out.read_text().splitlines()]
    if processes > 1:
        parts = gather_across([(records, summary["wall_seconds"])], processes)
        order = {ex.id: i for i, ex in enumerate(examples)}
        records = sorted((r for part, _ in parts for r in part), key=lambda r: order[r["id"]])
        shard_out.unlink(missing_ok=True)
        if rank == 0:
            write_log(out, records)
        summary = {**summarize(records), "wall_seconds": max(seconds for _, seconds in parts)}
    return {"n": summary["n"], "em": summary["em"], "f1": summary["f1"], "acc": summary["acc"],
            "em_tagged": summary.get("em_tagged"), "em_fallback": summary.get("em_fallback"),
            "n_tagged": summary.get("n_tagged"), "n_fallback": summary.get("n_fallback"),
            "format_compliance": format_compliance(records, cfg.agent.protocol),
            "searches": summary["searches_per_question"],
            "agent_searches": summary.get("agent_searches_per_question"),
            "long_share": summary.get("long_share"), "fact_coverage": summary.get("fact_coverage"),
            "seconds": summary["wall_seconds"]}


def heldout_evaluation(model, tokenizer, cfg: TrainConfig, data: TrainingData, run_dir: Path, tag: str,
                       share: tuple[int, int] = (0, 1), indexes=None) -> dict:
    """The run's evaluation ``tag`` ("before", "after"): :func:`evaluate_model` on each held-out set the data
    has (world questions, the HotpotQA half, the long-answer questions, the real RL prompts where a corpus or
    service answers them), records to ``<run_dir>/eval_<tag>_<set>.jsonl``; one summary per set, by name.
    ``indexes(passages, name)``: the run's retriever over a corpus, built once per launch (issue 53: each rank
    of a multi-GPU run rebuilt every evaluation's index on the CPU); None: each evaluation builds its own."""
    run_dir = Path(run_dir)

    def one(examples, passages, dataset: str, name: str, retrieval=None) -> dict:
        remote = retrieval is not None and retrieval.configured
        index = indexes(passages, name) if indexes is not None and passages and not remote else None
        return evaluate_model(model, tokenizer, cfg, examples, passages, dataset, run_dir / f"eval_{tag}_{name}.jsonl",
                              share, retrieval, index)

    result = {"world": one(data.heldout, data.passages, "world", "world")}
    if data.hotpot_heldout:
        result["hotpotqa_distractor"] = one(data.hotpot_heldout, data.hotpot_passages, "hotpotqa_distractor",
                                            "hotpot", cfg.retrieval)
    if data.heldout_summary:  # the long-answer mode: which mode the model picks, and its summaries' coverage
        result["world_summary"] = one(data.heldout_summary, data.passages, "world", "summary")
    if data.rl_heldout and (cfg.retrieval.configured or data.rl_passages):  # else there is no corpus
        result["rl_heldout"] = one(data.rl_heldout, data.rl_passages or None, "rl_heldout", "rl", cfg.retrieval)
    return result


def evaluate_baselines(cfg: TrainConfig, methods, out_dir: Path, progress=print,
                       reuse: Path | None = None) -> dict[str, dict]:
    """Table 2's prompt baselines as the paper runs them: on ``cfg.model``, the backbone a recipe starts from (None:
    the embedded SmolLM2-135M-Instruct, untrained), on the recipe's held-out world questions with its agent settings
    (budgets, top-k, index), so each baseline answers exactly what the trained arms answered. Records go to
    ``<out_dir>/world.<method>.jsonl`` and resume where a run stopped; returns each method's summary. ``reuse``: a
    folder of ``world.<method>.jsonl`` records of the same evaluation over more questions (notebook 06's, when its
    settings are the arms'): the arms' questions are taken from there instead of answered again
    (:func:`~kunlunlab.eval.records.records_of_same_evaluation`)."""
    held = load_splits(cfg.splits())
    backend = TransformersBackend(cfg.model, device=cfg.device)
    settings = agent_settings(cfg)
    summaries = {}
    for method in methods:
        eval_cfg = apply_agent_settings(EvalConfig(dataset="world", limit=len(held.heldout), judge=None,
                                                   index_kind=cfg.index_kind, embedder=cfg.embedder,
                                                   batch_size=cfg.eval.batch_size, seed=cfg.world_seed),
                                        {**settings, "method": method})
        out = Path(out_dir) / f"world.{method}.jsonl"
        kept = records_of_same_evaluation(eval_cfg, Path(reuse) / out.name, held.heldout) if reuse else None
        if kept is not None and not read_records(out)[0]:  # evaluate() below reads them back as finished
            writer = RecordWriter(out, evaluation_identity(eval_cfg), append=False)
            writer.write([json.dumps(r) for r in kept])
            writer.finish()
            progress(f"{method}: {len(kept)} records reused from {Path(reuse) / out.name}")
        summaries[method] = evaluate(eval_cfg, out, backend=backend,
                                     examples=held.heldout, passages=held.passages, resume=True)
        progress(f"{method}: EM {summaries[method]['em']}")
    return summaries


__all__ = ["agent_settings", "evaluate_baselines", "evaluate_model", "format_compliance", "heldout_evaluation"]
