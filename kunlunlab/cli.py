"""``kunlunlab`` command line: subcommands mirror the notebooks.

    kunlunlab build-index --corpus world --n 20000 --kind cluster --out indexes/world20k
    kunlunlab serve-retriever --index indexes/world20k --port 8000
    kunlunlab eval --dataset bamboogle --method kunlun --limit 20 --out runs/bamboogle.jsonl
    kunlunlab train --config experiments/configs/training/train_embedded_cpu.json --run-dir runs/train1
    kunlunlab run-notebooks            # what `make run` does

Every command answers with one convention: bad input (a flag, a config value, a file, a corpus, an ``--out``)
is one line on stderr and exit 2, before any work starts; a fault during the work (a service down past its
retries, a notebook that fails, the disk) is one line and exit 1; Ctrl-C is one line saying what was kept and
how to go on, exit 130. A traceback means a bug.
"""
from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

from kunlunlab.cli_parsers import (build_index_parser, compare_runs_parser, comparison_parser, eval_parser,
                                  rerun_parser,
                                  run_notebooks_parser, serve_llm_parser, serve_retriever_parser, suite_parser,
                                  train_parser, train_router_parser)
from kunlunlab.data.types import Passage

# the commands import what they run inside their functions: `kunlunlab --help` loads no model library

BAD_INPUT, FAULT, INTERRUPTED = 2, 1, 130  # the exit codes of the convention (module docstring)
# What a Ctrl-C keeps, for the commands that do not say it themselves.
INTERRUPTED_KEPT = {
    "eval": "the records finished so far stay in the records file named above: rerun the same command with "
            "--out <that file> to resume",
    "suite": "the records finished so far stay in the folder named above: rerun with --out <that folder> to resume",
    "serve-retriever": "the index folder is unchanged", "serve-llm": "nothing was written",
    "compare-runs": "nothing was written; the run folders are unchanged"}


def load_corpus_arg(corpus: str, n: int, seed: int) -> list[Passage]:
    """``--corpus``: see :func:`kunlunlab.data.loaders.load_named_corpus` (a bad name is a FileNotFoundError,
    a malformed line a ValueError: the caller's one line)."""
    from kunlunlab.data.loaders import load_named_corpus

    return load_named_corpus(corpus, n, seed)


def cmd_build_index(args: argparse.Namespace) -> int:
    """A bad corpus (missing, empty, a line without ``contents``, too small for the kind), preset, setting or
    ``--out`` ends in one line, exit 2. The index is built in a new folder beside ``--out`` and renamed to it at
    the end: a failed or interrupted build leaves nothing, and ``--overwrite`` replaces an old index whole."""
    from dataclasses import replace

    from kunlunlab.models import ModelNotAvailableError
    from kunlunlab.retrieval.clustered import ClusterConfig
    from kunlunlab.retrieval.factory import load_preset
    from kunlunlab.retrieval.indexes import IVFPQConfig
    from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
    from kunlunlab.retrieval.sharded import check_corpus_size
    from kunlunlab.retrieval.store import building_into, check_out_folder, save_retriever

    try:
        if args.preset:  # the published setting's index; --device / --passage-precision say how to compute it
            if args.kind is not None or args.embedder is not None:
                raise ValueError("--preset sets the index kind and embedder: drop --kind / --embedder")
            preset = load_preset(args.preset)
            config = replace(preset.index, **{k: getattr(args, k) for k in ("device", "passage_precision")
                                              if getattr(args, k) is not None})
            args.corpus = args.corpus or preset.corpus
        else:
            config = IndexConfig(kind=args.kind or "cluster", embedder=args.embedder,
                                 passage_precision=args.passage_precision or "float32", device=args.device or "cpu",
                                 ivfpq=IVFPQConfig(nlist=args.nlist or 1024, m=args.pq_m, nprobe=args.nprobe),
                                 cluster=ClusterConfig(nlist=args.nlist, nlist_method=args.nlist_method,
                                                       pq_m=args.pq_m, candidate_budget=args.candidate_budget))
        args.corpus = args.corpus or "world"
        args.kind = config.kind
        check_out_folder(args.out, args.overwrite)  # before anything is read or embedded
    except (FileNotFoundError, ValueError) as err:
        return _fail("build-index", err)
    start = time.perf_counter()
    if args.engine != "inprocess":
        return _build_index_sharded(args, config, start)
    try:  # a missing file, a malformed line (DataFormatError), an empty or too small corpus, no such embedder
        passages = load_corpus_arg(args.corpus, args.n, args.seed)
        if not passages:
            raise ValueError(f"corpus {args.corpus} holds no passages")
        check_corpus_size(config, len(passages))
        with building_into(args.out, args.overwrite) as folder:
            save_retriever(build_retriever(passages, config, progress=True), folder)
    except (ModelNotAvailableError, FileNotFoundError, ValueError) as err:
        return _fail("build-index", err)
    except OSError as err:  # the disk, not the input: full, read-only
        return _fail("build-index", f"the build failed, nothing was written to {args.out}: {err}", FAULT)
    except KeyboardInterrupt:
        return _interrupted("build-index", f"nothing was written to {args.out} (the partial build was removed); "
                                           "run the command again to build the index")
    print(json.dumps({"out": str(args.out), "kind": config.kind, "n": len(passages),
                      "seconds": round(time.perf_counter() - start, 1)}))
    return 0


def _build_index_sharded(args: argparse.Namespace, config, start: float) -> int:
    """``build-index --engine stream|ray``: a corpus file streams from disk; ``world`` and the named
    corpora are generated/read first (they fit in memory by construction). Built beside ``--out`` as in
    process: a malformed line or Ctrl-C leaves no ``corpus.jsonl.partial`` nor shards behind."""
    from kunlunlab.data.loaders import NAMED_CORPORA
    from kunlunlab.retrieval.sharded import ShardedBuildConfig, build_sharded
    from kunlunlab.retrieval.store import building_into

    named = args.corpus == "world" or args.corpus in NAMED_CORPORA
    try:
        cfg = ShardedBuildConfig(engine=args.engine, shard_rows=args.shard_rows, block_rows=args.block_rows,
                                 address=args.address, num_cpus=args.num_cpus, actors=args.actors,
                                 keep_shards=args.keep_shards)
        if not named and not Path(args.corpus).is_file():
            raise FileNotFoundError(f"no corpus file {args.corpus} (a FlashRAG {{id, contents}} jsonl, or 'world', "
                                    "'hotpotqa_distractor', '2wiki')")
        source = load_corpus_arg(args.corpus, args.n, args.seed) if named else Path(args.corpus)
        with building_into(args.out, args.overwrite) as folder:
            manifest = build_sharded(source, config, folder, cfg, log=lambda line: print(line, file=sys.stderr))
    except (FileNotFoundError, ValueError) as err:  # a malformed corpus line (DataFormatError), too few passages
        return _fail("build-index", err)
    except KeyboardInterrupt:
        return _interrupted("build-index", f"nothing was written to {args.out} (the partial build and its shards "
                                           "were removed); run the command again to build the index")
    print(json.dumps({"out": str(args.out), "kind": args.kind, "n": manifest["n"],
                      "seconds": round(time.perf_counter() - start, 1), "build": manifest["build"]}))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    """A missing, corrupt or mismatched index, an embedder that is not here or a limit below 1: one line, exit 2."""
    import os

    from kunlunlab.models import ModelNotAvailableError
    from kunlunlab.retrieval.client import API_KEY_ENV
    from kunlunlab.retrieval.retriever import IndexConfig
    from kunlunlab.retrieval.service import serve
    from kunlunlab.retrieval.store import load_retriever

    try:  # the index's device: where its embedder encodes queries and an exact index searches
        retriever = load_retriever(args.index, embedder=args.embedder,
                                   index_config=IndexConfig(kind="flat", device=args.device))
        if retriever.encoder is not None:
            retriever.encoder.set_query_precision(args.query_precision)
        if args.threads:
            import faiss
            import torch

            torch.set_num_threads(args.threads)
            faiss.omp_set_num_threads(args.threads)
    except (OSError, ValueError, ModelNotAvailableError) as err:  # ModelNotAvailableError: the manifest's embedder
        return _fail("serve-retriever", err)
    try:
        serve(retriever, host=args.host, port=args.port, added_latency_ms=args.added_latency_ms,
              micro_batching=not args.no_micro_batching, batch_window_ms=args.batch_window_ms,
              max_batch_queries=args.max_batch_queries, max_batch_chars=args.max_batch_chars,
              max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
              api_key=args.api_key or os.environ.get(API_KEY_ENV))
    except ValueError as err:  # a limit below 1
        return _fail("serve-retriever", err)
    return 0


def cmd_serve_llm(args: argparse.Namespace) -> int:
    import os

    from kunlunlab.agent.openai_backend import API_KEY_ENV
    from kunlunlab.agent.server import serve
    from kunlunlab.agent.transformers_backend import TransformersBackend
    from kunlunlab.models import ModelNotAvailableError

    try:  # a model that is not here, a device this machine lacks, a limit below 1: one line
        backend = TransformersBackend(args.model, device=args.device, dtype=args.dtype)
        serve(backend, host=args.host, port=args.port, max_model_len=args.max_model_len, max_tokens=args.max_tokens,
              max_prompts=args.max_prompts, max_queue=args.max_queue, max_body_bytes=args.max_body_bytes,
              api_key=args.api_key or os.environ.get(API_KEY_ENV))
    except (ModelNotAvailableError, ValueError) as err:
        return _fail("serve-llm", err)
    return 0


def cmd_run_notebooks(args: argparse.Namespace) -> int:
    """Every notebook's parameters are checked before the first cell runs (unknown notebook, ``--only`` prefix
    or parameter, wrong type: one line, exit 2); a notebook that fails: one line naming it, exit 1; Ctrl-C:
    one line saying what was kept and how to go on, exit 130."""
    from kunlunlab.runner import RunInterrupted, check_params, load_params, run_notebooks, select_notebooks

    try:
        params = load_params(args.params)
        check_params(select_notebooks(args.only), params, args.smoke)
    except ValueError as err:
        return _fail("run-notebooks", err)
    try:
        summary = run_notebooks(out_dir=args.out, smoke=args.smoke, only=args.only, params=params,
                                progress=not args.no_progress)
    except RunInterrupted as stop:
        again = ["kunlunlab", "run-notebooks", "--out", str(stop.run_dir), "--only", *stop.remaining]
        again += ["--smoke"] * args.smoke + (["--params", args.params] if args.params else [])
        return _interrupted("run-notebooks", f"stopped in {stop.notebook}; the notebooks finished before it are "
                            f"in {stop.run_dir} (summary.json): go on with `{shlex.join(again)}`")
    print(json.dumps({"run_dir": summary["run_dir"], "ok": summary["ok"]}))
    failed = [r for r in summary["notebooks"] if not r["ok"]]
    if failed:
        first = failed[0]
        return _fail("run-notebooks", f"{len(failed)} notebook(s) failed, first {first['notebook']} "
                                      f"({first['error']}; cell {first.get('cell')} of its executed copy); executed "
                                      f"copies and summary.json in {summary['run_dir']}", FAULT)
    return 0


EVAL_AGENT_FLAGS = ("method", "top_k", "max_searches", "max_turn_tokens", "max_total_tokens", "max_result_chars",
                    "stie_rounds", "use_rdra", "use_stie")   # named as in kunlunlab_agent.json
EVAL_FLAG_FIELDS = ("dataset", "limit", "model", "llm_url", "judge", "judge_url", "judge_api", "judge_key_env",
                    "corpus", "index_kind", "embedder", "batch_size", "seed", "network_url", "router",
                    "retriever_url", "index_dir", "device", "prompt") + EVAL_AGENT_FLAGS


def _fail(command: str, err: BaseException | str, code: int = BAD_INPUT) -> int:
    """One line on stderr, no traceback, and the convention's exit code: 2 when the user's input was wrong (the
    default), 1 (:data:`FAULT`) when the work failed."""
    print(f"kunlunlab {command}: " + " ".join(str(err).split()), file=sys.stderr)
    return code


def _interrupted(command: str, kept: str) -> int:
    """Ctrl-C: one line saying what was kept and how to go on, exit 130 (the shell's code for SIGINT).

    The ``exec`` of a source string clears CPython's record of an unanswered KeyboardInterrupt: one that lands
    inside such an exec (a dataclass or namedtuple being created, which happens lazily in the libraries)
    leaves that record set even though it is answered here, and ``python -m`` then ends the process by SIGINT
    after the exit code is chosen (CPython 3.11 and 3.12: ``run_eval_code_obj`` sets it, ``Py_RunMain`` reads
    it; the record is reset at the start of every such exec). Seen as a rare returncode -2 of ``python -m
    kunlunlab.cli build-index`` under Ctrl-C; ``tests/project/test_cli.py`` raises the interrupt inside an exec."""
    print(f"kunlunlab {command}: interrupted; " + " ".join(kept.split()), file=sys.stderr)
    exec("None")  # a constant source string: resets the interrupt record (docstring)
    return INTERRUPTED


def _eval_error(err: BaseException | str) -> int:
    return _fail("eval", err)


def eval_config_from_args(args: argparse.Namespace):
    """The EvalConfig for ``kunlunlab eval``, one typed config like ``train``'s: explicit flag > ``--set`` >
    ``--config`` file > the checkpoint's kunlunlab_agent.json > EvalConfig default (flags default to None so
    that "not given" is visible here). Budget flags land in ``rollout`` (``--top-k`` is ``rollout.top_k``),
    ``--stie-rounds`` in ``stie.max_rounds``."""
    from kunlunlab.eval.harness import AGENT_SETTING_PATHS, EvalConfig, with_checkpoint_settings
    from kunlunlab.configs import apply_overrides, build_dataclass, leaf_paths, read_config_file

    values = read_config_file(args.config, "eval config") if args.config else {}
    values = apply_overrides(values, list(args.set or []))
    flags = {AGENT_SETTING_PATHS.get(k, k): getattr(args, k) for k in EVAL_FLAG_FIELDS if getattr(args, k) is not None}
    values = apply_overrides(values, flags)
    if "dataset" not in values:
        raise ValueError("no dataset: pass --dataset or set dataset in --config")
    config = build_dataclass(EvalConfig, values, "eval config")
    return with_checkpoint_settings(config, explicit=leaf_paths(values))


def cmd_eval(args: argparse.Namespace) -> int:
    """Data, corpus and models load before any question runs, so input errors end in one line (exit 2). Each
    record is on disk as its question finishes; a rerun with the same ``--out`` resumes after the last complete
    one, and ``--out`` holding another evaluation's records is refused before any model loads. A service that
    fails mid-run (exit 1) or Ctrl-C (exit 130) ends in one line saying how many records were kept and where."""
    import re

    from kunlunlab.agent.errors import GenerationServiceError
    from kunlunlab.eval.harness import (EvalRetrievalError, evaluate, load_data, make_backend, make_judge_backend,
                                        open_eval_retriever)
    from kunlunlab.eval.records import RecordsConflict, kept_records, read_records
    from kunlunlab.models import ModelNotAvailableError
    from kunlunlab.paths import new_run_dir
    from kunlunlab.retrieval.encoder import passages_embedded
    from kunlunlab.retrieval.client import RetrievalServiceError

    try:  # unknown method or key, malformed config file or kunlunlab_agent.json, bad numbers
        config = eval_config_from_args(args)
    except (FileNotFoundError, ValueError) as err:
        return _eval_error(err)
    try:  # unknown dataset or missing file, DataFormatError (a ValueError), missing benchmark data folder
        examples, passages = load_data(config)
    except (FileNotFoundError, ValueError) as err:
        return _eval_error(err)
    try:  # --retriever-url down or not ready; --index missing, corrupt or built with another embedder/corpus
        retriever = open_eval_retriever(config, passages)
    except (RetrievalServiceError, ModelNotAvailableError, OSError, ValueError) as err:
        return _eval_error(err)
    out = Path(args.out) if args.out else None
    resumed = 0
    if out is not None:  # --out with records of this evaluation resumes after them; another one's is refused
        if out.is_dir():
            return _eval_error(f"--out {out} is a folder: give the records file's path, e.g. {out / 'records.jsonl'}")
        try:
            resumed = len(kept_records(config, out, examples, retriever)[0])
        except RecordsConflict as err:
            return _eval_error(err)

    def stopped(why: str | None) -> int:
        """One line: why the evaluation stopped (None: Ctrl-C, exit 130; else a fault, exit 1), the records it
        kept and where, how to go on."""
        kept = len(read_records(out)[0]) if out is not None else 0
        where = f"in {out}" if out is not None and out.exists() else "(nothing written)"
        again = "rerun the same command to resume" if args.out else f"rerun with --out {out} to resume"
        said = f"{kept} of {len(examples)} records kept {where}" + (f": {again}" if kept else "")
        return _interrupted("eval", said) if why is None else _fail("eval", f"{why}; {said}", FAULT)

    try:
        backend = make_backend(config)
        judge_backend = make_judge_backend(config, backend)
    except (ModelNotAvailableError, OSError) as err:
        return _eval_error(err)
    except KeyboardInterrupt:
        return stopped(None)
    run_dir = None
    if out is None:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(config.dataset).stem) or "data"
        name = f"eval-{slug}-{config.method}-" + time.strftime("%Y%m%d-%H%M%S")
        run_dir = new_run_dir(name=name)
        while (run_dir / "records.jsonl").exists():  # another eval of the same pair started this second
            run_dir = new_run_dir(name=f"{name}-{time.perf_counter_ns() % 10**6}")
        out = run_dir / "records.jsonl"
    resuming = f" (resuming after {resumed} of {len(examples)} questions)" if resumed else ""
    print(f"kunlunlab eval: records go to {out}{resuming}", flush=True)
    try:  # each finished question is on disk as it finishes: a fault or Ctrl-C keeps them for a rerun
        summary = evaluate(config, out, backend=backend, judge_backend=judge_backend, examples=examples,
                           passages=passages, retriever=retriever, resume=True)
    except EvalRetrievalError as err:  # the service died mid-run: no score from answers without documents
        return stopped(f"retrieval failed, evaluation stopped: {err}")
    except GenerationServiceError as err:  # the judge's (or the answering model's) server failed mid-run
        return stopped(f"a generation server failed, evaluation stopped: {err}")
    except OSError as err:  # writing the records: a full disk, a folder that went read-only
        return stopped(f"evaluation stopped: {err}")
    except KeyboardInterrupt:
        return stopped(None)
    summary["passages_embedded"] = passages_embedded()  # this process; 0 through a service or a saved index
    if run_dir is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    summary.pop("config")
    summary["out"] = str(out)
    print(json.dumps(summary, default=str))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    """Config, geometry and hardware are checked before anything loads (``--dry-run`` stops there); a bad value,
    a run folder of another config or a model not here: one line, exit 2; a service down past its retries:
    one line, exit 1; Ctrl-C: the run folder keeps every finished stage and the last checkpoint, exit 130."""
    import logging

    from kunlunlab.paths import new_run_dir
    from kunlunlab.retrieval.client import RetrievalServiceError
    from kunlunlab.retrieval.store import IndexMismatchError
    from kunlunlab.training.pipeline import RunFolderConflict, run_config, train, training_plan

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from kunlunlab.models import ModelNotAvailableError

    try:
        config = run_config(args.config, list(args.set or []), smoke=args.smoke)
        plan = training_plan(config, args.world_size, check_hardware=not args.dry_run)  # GeometryError: a ValueError
    except (FileNotFoundError, ValueError, ModelNotAvailableError) as err:  # also device=cuda without a GPU
        return _fail("train", err)
    if args.dry_run:  # the resolved plan, nothing loaded
        print(plan.to_json())
        return 0
    run_dir = Path(args.run_dir) if args.run_dir else new_run_dir(name=time.strftime("train-%Y%m%d-%H%M%S"))
    try:
        summary = train(config, run_dir, progress=lambda msg: print(msg, flush=True))
    except (RunFolderConflict, IndexMismatchError, FileNotFoundError, ModelNotAvailableError) as err:
        return _fail("train", err)
    except RetrievalServiceError as err:  # a service down past its retries stops with one line
        return _fail("train", err, FAULT)
    except KeyboardInterrupt:
        again = ["kunlunlab", "train", "--run-dir", str(run_dir)] + (["--config", args.config] if args.config else [])
        again += ["--smoke"] * args.smoke + (["--set", *args.set] if args.set else [])
        return _interrupted("train", f"{run_dir} keeps every finished stage and the last checkpoint (train_config.json, "
                                     f"state.json): resume with `{shlex.join(again)}`")
    print(json.dumps({**summary, "run_dir": str(run_dir)}))
    return 0


def _training_runs(command: str, runs_root: Path, again: list[str], work):
    """``(work(), None)``, or ``(None, exit code)`` after one line for what a command training runs into
    ``runs_root`` can meet: a refused folder, a missing file or model (2), a retrieval service failing (1), Ctrl-C
    (130, saying how to resume with ``again``)."""
    from kunlunlab.models import ModelNotAvailableError
    from kunlunlab.retrieval.client import RetrievalServiceError
    from kunlunlab.training.pipeline import RunFolderConflict

    try:
        return work(), None
    except (RunFolderConflict, FileNotFoundError, ModelNotAvailableError) as err:
        return None, _fail(command, err)
    except RetrievalServiceError as err:
        return None, _fail(command, err, FAULT)
    except KeyboardInterrupt:
        return None, _interrupted(command, f"the finished runs and the interrupted one's checkpoints stay in "
                                           f"{runs_root}: `{shlex.join(again)}` reuses the finished and resumes the "
                                           "interrupted one")


def cmd_rerun(args: argparse.Namespace) -> int:
    """A kept training result rerun by name (``experiments/configs/runs/<name>.json``), the runs it starts
    from first; without a name, the names and what each reproduces."""
    from kunlunlab.training.pipeline import SMOKE_OVERRIDES
    from kunlunlab.training.reruns import UnknownRunError, read_run_config, rerun, rerun_plan, run_names

    if not args.name:
        specs = {name: read_run_config(name) for name in run_names()}
        runs = {name: {k: spec[k] for k in ("record", "note")} for name, spec in specs.items()}
        for name, info in runs.items():
            print(f"{name:34} {info['note']}")
        print(json.dumps(runs))
        return 0
    runs_root = Path(args.runs_dir)
    try:
        plan = rerun_plan(args.name, runs_root)
    except (UnknownRunError, ValueError, TypeError) as err:
        return _fail("rerun", err)
    if args.dry_run:
        print(json.dumps({"name": args.name, "plan": [step.to_dict() for step in plan]}))
        return 0
    again = ["kunlunlab", "rerun", args.name, "--runs-dir", str(runs_root)] + ["--smoke"] * args.smoke
    summaries, code = _training_runs("rerun", runs_root, again, lambda: rerun(
        args.name, runs_root, SMOKE_OVERRIDES if args.smoke else None, progress=lambda msg: print(msg, flush=True)))
    if code is not None:
        return code
    print(json.dumps({"name": args.name, "runs": [str(step.run_dir) for step in plan],
                      "em_after": {step.name: s.get("em_after") for step, s in zip(plan, summaries)}}))
    return 0


def cmd_comparison(args: argparse.Namespace) -> int:
    """Every arm of a comparison under its one budget and every seed (:mod:`kunlunlab.training.comparison`), then
    the check that they ran alike; exit 1 when they did not, naming each difference."""
    from kunlunlab.training.comparison import load_comparison
    from kunlunlab.training.pipeline import SMOKE_OVERRIDES
    from kunlunlab.training.reruns import comparison_smoke_overrides, run_comparison

    try:
        comparison = load_comparison(args.comparison)
        runs = comparison.runs(args.arms, args.seeds)
    except (FileNotFoundError, ValueError, TypeError) as err:
        return _fail("comparison", err)
    runs_root = Path(args.runs_dir)
    if args.dry_run:
        print(json.dumps({"comparison": comparison.name, "runs": [
            {"name": r.name, "arm": r.arm, "seed": r.seed, "recipe": r.recipe, "run_dir": str(runs_root / r.name),
             "overridden": r.overridden} for r in runs]}))
        return 0
    again = ["kunlunlab", "comparison", args.comparison, "--runs-dir", str(runs_root)] + ["--smoke"] * args.smoke
    result, code = _training_runs("comparison", runs_root, again, lambda: run_comparison(
        comparison, runs_root, args.arms, args.seeds,
        comparison_smoke_overrides(SMOKE_OVERRIDES) if args.smoke else None, progress=lambda msg: print(msg, flush=True)))
    if code is not None:
        return code
    problems = [f"seed {seed}: {p}" for seed, found in result["problems"].items() for p in found]
    for line in problems:
        print(f"kunlunlab comparison: {line}", file=sys.stderr)
    print(json.dumps({"comparison": comparison.name, "runs": sorted(result["runs"]), "problems": problems,
                      "em_after": {name: s.get("em_after") for name, s in result["runs"].items()}}))
    return 1 if problems else 0


def cmd_compare_runs(args: argparse.Namespace) -> int:
    """Training ablations: finished training runs compared on the same held-out questions."""
    from kunlunlab.runner import markdown_table
    from kunlunlab.training.records import compare_runs

    runs = {}
    for item in args.runs:
        label, sep, folder = item.partition("=")
        if not sep or not label or not folder:
            return _fail("compare-runs", f"expected label=run_folder, got {item!r}")
        runs[label] = folder
    try:
        header, rows = compare_runs(runs, reference=next(iter(runs)), dataset=args.dataset)
    except (FileNotFoundError, ValueError) as err:
        return _fail("compare-runs", err)
    print("\n".join(markdown_table(header, rows)))
    print(json.dumps({"dataset": args.dataset, "header": header, "rows": rows}))
    return 0


def cmd_suite(args: argparse.Namespace) -> int:
    """Notebook 06's evaluation without a notebook (a GPU node, a batch job): Table 2 and the inference
    ablations of a trained checkpoint, records in ``--out``, the tables in ``tables.md``, JSON last. A rerun into
    the same ``--out`` resumes every row after its finished questions; exit codes as ``eval``'s."""
    from dataclasses import asdict

    from kunlunlab.agent.errors import GenerationServiceError
    from kunlunlab.configs import apply_overrides, build_dataclass, read_config_file
    from kunlunlab.eval.harness import EvalRetrievalError
    from kunlunlab.paths import new_run_dir
    from kunlunlab.runner import markdown_table
    from kunlunlab.studies.suite import SuiteConfig, run_suite, suite_records, suite_tables

    try:
        data = read_config_file(args.config, "suite config") if args.config else {}
        data = apply_overrides(data, args.set)
        for key in ("model", "train_config", "device", "index_kind", "embedder", "retriever_url", "index_dir"):  # flags win
            if getattr(args, key) is not None:
                data[key] = getattr(args, key)
        cfg = build_dataclass(SuiteConfig, data, "suite")
        if cfg.model and not Path(cfg.model).exists():
            raise FileNotFoundError(f"checkpoint not found: {cfg.model}")
    except (FileNotFoundError, ValueError, TypeError) as err:
        return _fail("suite", err)
    out = Path(args.out) if args.out else new_run_dir(name=time.strftime("%Y%m%d-%H%M%S") + "-suite")
    if out.exists() and not out.is_dir():
        return _fail("suite", f"--out {out} is a file: give a folder (records, tables.md, suite_summary.json go there)")
    out.mkdir(parents=True, exist_ok=True)
    print(f"kunlunlab suite: writing to {out}", flush=True)

    def stopped(why: str | None) -> int:
        """One line: why the suite stopped (None: Ctrl-C, exit 130; else a fault, exit 1), the records it kept and
        where, how to go on."""
        kept = suite_records(out / "records")
        again = "rerun the same command to resume" if args.out else f"rerun with --out {out} to resume"
        files = f"{len(kept)} file" + ("s" if len(kept) != 1 else "")
        said = f"{sum(kept.values())} records kept in {out / 'records'} ({files})" + (
            f": {again}" if any(kept.values()) else "")
        return _interrupted("suite", said) if why is None else _fail("suite", f"{why}; {said}", FAULT)

    try:  # each row resumes after its finished questions; a folder of another suite config is refused (exit 2)
        result = run_suite(cfg, out / "records", progress=lambda msg: print(msg, flush=True))
    except (FileNotFoundError, ValueError) as err:
        return _fail("suite", err)
    except EvalRetrievalError as err:  # a benchmark's retrieval service died mid-run
        return stopped(f"retrieval failed, suite stopped: {err}")
    except GenerationServiceError as err:  # the judge's server failed mid-run
        return stopped(f"a generation server failed, suite stopped: {err}")
    except OSError as err:  # writing the records: a full disk, a folder that went read-only
        return stopped(f"suite stopped: {err}")
    except KeyboardInterrupt:
        return stopped(None)
    tables = suite_tables(result, cfg)
    lines = []
    for title, (header, rows) in tables.items():
        lines += [f"## {title}", "", *markdown_table(header, rows), ""]
    (out / "tables.md").write_text("\n".join(lines))
    summary = {"config": asdict(cfg), "seconds": result.seconds, "summaries": result.summaries,
               "router": result.router, "tables": {t: {"header": h, "rows": r} for t, (h, r) in tables.items()}}
    (out / "suite_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print("\n".join(lines))
    print(json.dumps({"out": str(out), "seconds": result.seconds,
                      "em": {f"{s['dataset']}/{s['variant']}": s["em"] for s in result.summaries}}))
    return 0


def cmd_train_router(args: argparse.Namespace) -> int:
    """NLR (paper §2.4, eqs. 20–23): measure local / network / both on training hop queries, train, save."""
    from dataclasses import replace

    from kunlunlab.training.router import RouterTrainConfig, train_router

    given = {key: getattr(args, key) for key in ("world_passages", "questions", "seed", "local_fraction",
                                                 "added_latency_ms", "index_kind", "embedder", "top_k",
                                                 "network_url") if getattr(args, key) is not None}
    try:
        config = RouterTrainConfig(**given)
        nlr = {key: getattr(args, key) for key in ("epochs", "recall_weight", "latency_weight")
               if getattr(args, key) is not None}
        config = replace(config, nlr=replace(config.nlr, **nlr))
    except ValueError as err:
        return _fail("train-router", err)
    try:
        _, summary = train_router(config, out=args.out, progress=lambda msg: print(msg, flush=True),
                                  local_corpus_out=args.local_corpus_out)
    except KeyboardInterrupt:
        return _interrupted("train-router", f"nothing was saved to {args.out}; run the command again")
    summary.pop("config")
    print(json.dumps(summary))
    return 0


class OneLineParser(argparse.ArgumentParser):
    """argparse with the convention's bad-input answer: one line on stderr (not the usage block), exit 2."""

    def error(self, message: str):
        self.exit(BAD_INPUT, f"{self.prog}: {' '.join(message.split())} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    """The ``kunlunlab`` parser, one sub-parser per command (each built in :mod:`kunlunlab.cli_parsers`, its
    handler here). The choices of a few flags are the package's constants, imported inside those builders so
    that ``kunlunlab --help`` loads no model library."""
    parser = OneLineParser(prog="kunlunlab", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)  # sub-parsers are OneLineParsers too
    for add, handler in ((build_index_parser, cmd_build_index), (serve_retriever_parser, cmd_serve),
                         (serve_llm_parser, cmd_serve_llm), (eval_parser, cmd_eval), (train_parser, cmd_train),
                         (rerun_parser, cmd_rerun), (comparison_parser, cmd_comparison),
                         (train_router_parser, cmd_train_router),
                         (compare_runs_parser, cmd_compare_runs), (suite_parser, cmd_suite),
                         (run_notebooks_parser, cmd_run_notebooks)):
        add(sub).set_defaults(func=handler)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Runs one command and returns the convention's exit code (module docstring). A command that still ends in
    ``SystemExit("kunlunlab <command>: ...")`` refused its input: that line goes to stderr, exit 2. A Ctrl-C the
    command did not answer itself: one line, exit 130. Any other exception is a bug and keeps its traceback."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except SystemExit as stop:
        if not isinstance(stop.code, str):
            raise
        print(" ".join(stop.code.split()), file=sys.stderr)
        return BAD_INPUT
    except KeyboardInterrupt:
        return _interrupted(args.command, INTERRUPTED_KEPT.get(args.command, "nothing was kept; run the command again"))


if __name__ == "__main__":
    sys.exit(main())
