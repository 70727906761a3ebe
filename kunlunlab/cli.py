"""``kunlunlab`` command line: subcommands mirror the notebooks.

    kunlunlab build-index --corpus world --n 20000 --kind cluster --out indexes/world20k
    kunlunlab serve-retriever --index indexes/world20k --port 8000
    kunlunlab eval --dataset bamboogle --method kunlun --limit 20 --out runs/bamboogle.jsonl
    kunlunlab train --config experiments/configs/training/train_embedded_cpu.json --run-dir runs/train1
    kunlunlab run-notebooks            # what `make run` does
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from kunlunlab.data.types import Passage


def load_corpus_arg(corpus: str, n: int, seed: int) -> list[Passage]:
    """``--corpus``: see :func:`kunlunlab.data.loaders.load_named_corpus`; a bad name ends in one line."""
    from kunlunlab.data.loaders import load_named_corpus

    try:
        return load_named_corpus(corpus, n, seed)
    except FileNotFoundError as err:
        raise SystemExit(str(err)) from err


def cmd_build_index(args: argparse.Namespace) -> int:
    """A bad corpus (missing, empty, a line without ``contents``), preset or setting ends in one line, exit 2."""
    from dataclasses import replace

    from kunlunlab.models import ModelNotAvailableError
    from kunlunlab.retrieval.clustered import ClusterConfig
    from kunlunlab.retrieval.factory import load_preset
    from kunlunlab.retrieval.indexes import IVFPQConfig
    from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
    from kunlunlab.retrieval.store import save_retriever

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
    except (FileNotFoundError, ValueError) as err:
        return _fail("build-index", err)
    start = time.perf_counter()
    if args.engine != "inprocess":
        return _build_index_sharded(args, config, start)
    try:  # a missing file, a malformed line (DataFormatError), an empty corpus, an embedder not available here
        passages = load_corpus_arg(args.corpus, args.n, args.seed)
        if not passages:
            raise ValueError(f"corpus {args.corpus} holds no passages")
        retriever = build_retriever(passages, config, progress=True)
    except (ModelNotAvailableError, FileNotFoundError, ValueError) as err:
        return _fail("build-index", err)
    folder = save_retriever(retriever, args.out)
    print(json.dumps({"out": str(folder), "kind": config.kind, "n": len(passages),
                      "seconds": round(time.perf_counter() - start, 1)}))
    return 0


def _build_index_sharded(args: argparse.Namespace, config, start: float) -> int:
    """``build-index --engine stream|ray``: a corpus file streams from disk; ``world`` and the named
    corpora are generated/read first (they fit in memory by construction)."""
    from kunlunlab.data.loaders import NAMED_CORPORA
    from kunlunlab.retrieval.sharded import ShardedBuildConfig, build_sharded

    cfg = ShardedBuildConfig(engine=args.engine, shard_rows=args.shard_rows, block_rows=args.block_rows,
                             address=args.address, num_cpus=args.num_cpus, actors=args.actors,
                             keep_shards=args.keep_shards)
    named = args.corpus == "world" or args.corpus in NAMED_CORPORA
    if not named and not Path(args.corpus).is_file():
        raise SystemExit(f"kunlunlab build-index: no corpus file {args.corpus} (a FlashRAG {{id, contents}} jsonl, "
                         "or 'world', 'hotpotqa_distractor', '2wiki')")
    source = load_corpus_arg(args.corpus, args.n, args.seed) if named else Path(args.corpus)
    try:
        manifest = build_sharded(source, config, args.out, cfg, log=lambda line: print(line, file=sys.stderr))
    except ValueError as err:  # a malformed corpus line (DataFormatError) or an impossible config: one line
        raise SystemExit(f"kunlunlab build-index: {err}") from err
    print(json.dumps({"out": str(args.out), "kind": args.kind, "n": manifest["n"],
                      "seconds": round(time.perf_counter() - start, 1), "build": manifest["build"]}))
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from kunlunlab.retrieval.service import serve
    from kunlunlab.retrieval.store import load_retriever

    from kunlunlab.retrieval.retriever import IndexConfig

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
    except (OSError, ValueError) as err:  # missing, corrupt or mismatched index: one line, not a traceback
        raise SystemExit(f"kunlunlab serve-retriever: {err}") from err
    serve(retriever, host=args.host, port=args.port, added_latency_ms=args.added_latency_ms,
          micro_batching=not args.no_micro_batching, batch_window_ms=args.batch_window_ms,
          max_batch_queries=args.max_batch_queries, max_queue=args.max_queue)
    return 0


def cmd_serve_llm(args: argparse.Namespace) -> int:
    from kunlunlab.agent.backends import TransformersBackend
    from kunlunlab.agent.server import serve
    from kunlunlab.models import ModelNotAvailableError

    try:  # a model that is not here, a device this machine lacks: one line
        backend = TransformersBackend(args.model, device=args.device, dtype=args.dtype)
    except (ModelNotAvailableError, ValueError) as err:
        return _fail("serve-llm", err)
    serve(backend, host=args.host, port=args.port)
    return 0


def cmd_run_notebooks(args: argparse.Namespace) -> int:
    from kunlunlab.runner import load_params, run_notebooks

    summary = run_notebooks(out_dir=args.out, smoke=args.smoke, only=args.only, params=load_params(args.params),
                            progress=not args.no_progress)
    print(json.dumps({"run_dir": summary["run_dir"], "ok": summary["ok"]}))
    return 0 if summary["ok"] else 1


EVAL_AGENT_FLAGS = ("method", "top_k", "max_searches", "max_turn_tokens", "max_total_tokens", "max_result_chars",
                    "stie_rounds", "use_rdra", "use_stie")   # named as in kunlunlab_agent.json
EVAL_FLAG_FIELDS = ("dataset", "limit", "model", "llm_url", "judge", "judge_url", "judge_api", "judge_key_env",
                    "corpus", "index_kind", "embedder", "batch_size", "seed", "network_url", "router",
                    "retriever_url", "index_dir", "device") + EVAL_AGENT_FLAGS


def _fail(command: str, err: BaseException | str) -> int:
    """One line on stderr, no traceback: the user's input was wrong, not the program."""
    print(f"kunlunlab {command}: " + " ".join(str(err).split()), file=sys.stderr)
    return 2


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
    """Data, corpus and models load before any question runs, so input errors end in one line."""
    import re

    from kunlunlab.agent.errors import GenerationServiceError
    from kunlunlab.eval.harness import (EvalRetrievalError, evaluate, load_data, make_backend, make_judge_backend,
                                        open_eval_retriever)
    from kunlunlab.models import ModelNotAvailableError
    from kunlunlab.paths import new_run_dir
    from kunlunlab.retrieval.encoder import passages_embedded
    from kunlunlab.retrieval.service import RetrievalServiceError

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
    try:
        backend = make_backend(config)
        judge_backend = make_judge_backend(config, backend)
    except (ModelNotAvailableError, OSError) as err:
        return _eval_error(err)
    run_dir = None
    if args.out:
        out = Path(args.out)
    else:
        slug = re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(config.dataset).stem) or "data"
        name = f"eval-{slug}-{config.method}-" + time.strftime("%Y%m%d-%H%M%S")
        run_dir = new_run_dir(name=name)
        while (run_dir / "records.jsonl").exists():  # another eval of the same pair started this second
            run_dir = new_run_dir(name=f"{name}-{time.perf_counter_ns() % 10**6}")
        out = run_dir / "records.jsonl"
    print(f"kunlunlab eval: records go to {out}", flush=True)
    try:
        summary = evaluate(config, out, backend=backend, judge_backend=judge_backend, examples=examples,
                           passages=passages, retriever=retriever)
    except EvalRetrievalError as err:  # the service died mid-run: no score from answers without documents
        _eval_error(f"retrieval failed, evaluation stopped: {err}")
        return 1
    except GenerationServiceError as err:  # the judge's (or the answering model's) server failed mid-run
        _eval_error(f"a generation server failed, evaluation stopped: {err}")
        return 1
    summary["passages_embedded"] = passages_embedded()  # this process; 0 through a service or a saved index
    if run_dir is not None:
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    summary.pop("config")
    summary["out"] = str(out)
    print(json.dumps(summary, default=str))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    import logging

    from kunlunlab.paths import new_run_dir
    from kunlunlab.retrieval.service import RetrievalServiceError
    from kunlunlab.retrieval.store import IndexMismatchError
    from kunlunlab.training.pipeline import RunFolderConflict, run_config, train, training_plan

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    from kunlunlab.models import ModelNotAvailableError

    try:
        config = run_config(args.config, list(args.set or []), smoke=args.smoke)
        plan = training_plan(config, args.world_size, check_hardware=not args.dry_run)  # GeometryError: a ValueError
    except (FileNotFoundError, ValueError, ModelNotAvailableError) as err:  # also device=cuda without a GPU
        raise SystemExit(f"kunlunlab train: {err}")
    if args.dry_run:  # the resolved plan, nothing loaded
        print(plan.to_json())
        return 0
    run_dir = Path(args.run_dir) if args.run_dir else new_run_dir(name=time.strftime("train-%Y%m%d-%H%M%S"))
    try:
        summary = train(config, run_dir, progress=lambda msg: print(msg, flush=True))
    except (RunFolderConflict, RetrievalServiceError, IndexMismatchError, FileNotFoundError,
            ModelNotAvailableError) as err:
        raise SystemExit(f"kunlunlab train: {err}")  # a service down past its retries stops with one line
    print(json.dumps({**summary, "run_dir": str(run_dir)}))
    return 0


def cmd_rerun(args: argparse.Namespace) -> int:
    """A kept training result rerun by name (``experiments/configs/runs/<name>.json``), the runs it starts
    from first; without a name, the names and what each reproduces."""
    from kunlunlab.models import ModelNotAvailableError
    from kunlunlab.retrieval.service import RetrievalServiceError
    from kunlunlab.training.pipeline import SMOKE_OVERRIDES, RunFolderConflict
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
    try:
        summaries = rerun(args.name, runs_root, SMOKE_OVERRIDES if args.smoke else None,
                          progress=lambda msg: print(msg, flush=True))
    except (RunFolderConflict, RetrievalServiceError, FileNotFoundError, ModelNotAvailableError) as err:
        return _fail("rerun", err)
    print(json.dumps({"name": args.name, "runs": [str(step.run_dir) for step in plan],
                      "em_after": {step.name: s.get("em_after") for step, s in zip(plan, summaries)}}))
    return 0


def cmd_compare_runs(args: argparse.Namespace) -> int:
    """Training ablations: finished training runs compared on the same held-out questions."""
    from kunlunlab.runner import markdown_table
    from kunlunlab.training.pipeline import compare_runs

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
    ablations of a trained checkpoint, records in ``--out``, the tables in ``tables.md``, JSON last."""
    from dataclasses import asdict

    from kunlunlab.configs import apply_overrides, build_dataclass, read_config_file
    from kunlunlab.paths import new_run_dir
    from kunlunlab.runner import markdown_table
    from kunlunlab.studies.suite import SuiteConfig, run_suite, suite_tables

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
    out.mkdir(parents=True, exist_ok=True)
    print(f"kunlunlab suite: writing to {out}", flush=True)
    try:
        result = run_suite(cfg, out / "records", progress=lambda msg: print(msg, flush=True))
    except (FileNotFoundError, ValueError) as err:
        return _fail("suite", err)
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
        raise SystemExit(f"kunlunlab train-router: {err}")
    _, summary = train_router(config, out=args.out, progress=lambda msg: print(msg, flush=True),
                              local_corpus_out=args.local_corpus_out)
    summary.pop("config")
    print(json.dumps(summary))
    return 0


CHECKPOINT_DEFAULT = " (default: the checkpoint's kunlunlab_agent.json, else %s)"  # eval and suite flags


def build_parser() -> argparse.ArgumentParser:
    """The ``kunlunlab`` parser, one sub-parser per command (each defined by the function below it). The
    choices of a few flags are the package's constants, imported inside those functions so that
    ``kunlunlab --help`` loads no model library."""
    parser = argparse.ArgumentParser(prog="kunlunlab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_build_index_parser, _serve_retriever_parser, _serve_llm_parser, _eval_parser, _train_parser,
                _rerun_parser, _train_router_parser, _compare_runs_parser, _suite_parser, _run_notebooks_parser):
        add(sub)
    return parser


def _build_index_parser(sub) -> None:
    from kunlunlab.retrieval.clustered import NLIST_METHODS
    from kunlunlab.retrieval.retriever import INDEX_KINDS

    b = sub.add_parser("build-index", help="embed a corpus and build an index (notebook 01)")
    b.add_argument("--corpus", default=None, help="'world' (default), 'hotpotqa_distractor', '2wiki' or a corpus "
                                                  "file (FlashRAG {id, contents} jsonl; default with --preset: its corpus)")
    b.add_argument("--n", type=int, default=20_000, help="passages, for the synthetic world")
    b.add_argument("--seed", type=int, default=0)
    b.add_argument("--preset", default=None, metavar="JSON",
                   help="a published setting's index (embedder, its prefixes, kind), e.g. "
                        "experiments/configs/presets/search_r1_e5.json; not with --kind / --embedder")
    b.add_argument("--kind", default=None, choices=INDEX_KINDS, help="index kind (default cluster)")
    b.add_argument("--embedder", default=None, help="hub id or local path (default: embedded all-MiniLM-L6-v2)")
    b.add_argument("--device", default=None, help="cpu (default), cuda, cuda:N or auto (cuda when torch sees a GPU): "
                                                  "where passages are embedded and a flat index is built")
    b.add_argument("--nlist", type=int, default=0, help="clusters (0: about 2*sqrt(n) for the cluster retriever, 1024 for IVF-PQ)")
    b.add_argument("--nlist-method", default="sqrt", choices=NLIST_METHODS,
                   help="cluster retriever with --nlist 0: 2*sqrt(n), or chosen by the elbow of k-means inertia or "
                        "the best silhouette on a sample (paper §3.1.1)")
    b.add_argument("--pq-m", type=int, default=48, help="bytes of scan code per vector")
    b.add_argument("--nprobe", type=int, default=16, help="IVF-PQ clusters scanned per query")
    b.add_argument("--candidate-budget", type=int, default=112, help="cluster retriever: re-ranked candidates")
    b.add_argument("--passage-precision", default=None, choices=("float32", "bfloat16", "auto"),
                   help="the embedder's precision for the corpus: bfloat16 is 3.1x faster on CPUs that multiply it "
                        "natively (cosine >= 0.998 to float32); auto: bfloat16 there, else float32")
    b.add_argument("--out", required=True)
    b.add_argument("--engine", default="inprocess", choices=("inprocess", "stream", "ray"),
                   help="inprocess: embed and build in memory (default, fastest for small corpora); stream: the "
                        "corpus streams from disk, embedded in shards here; ray: embedded by a Ray Data actor pool "
                        "(local, or a cluster with --address)")
    b.add_argument("--address", default=None, help="ray: the cluster to join ('auto' on a node of it, or "
                                                    "ray://head:10001); default a local Ray")
    b.add_argument("--num-cpus", type=int, default=None, help="ray without --address: CPUs of the local Ray")
    b.add_argument("--actors", type=int, default=0, help="ray: embedder actors (0: one per GPU, else CPUs - 1)")
    b.add_argument("--shard-rows", type=int, default=50_000, help="stream/ray: vectors per embedding shard")
    b.add_argument("--block-rows", type=int, default=1024, help="stream/ray: passages per embedding call")
    b.add_argument("--keep-shards", action="store_true", help="stream/ray: keep <out>/shards after the build")
    b.set_defaults(func=cmd_build_index)


def _serve_retriever_parser(sub) -> None:
    s = sub.add_parser("serve-retriever", help="serve a saved index over HTTP (POST /retrieve, GET /health)")
    s.add_argument("--index", required=True)
    s.add_argument("--embedder", default=None, help="refuse to serve unless the index was built with this")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=8000)
    s.add_argument("--added-latency-ms", type=float, default=0.0, help="simulate a slower web-search tier")
    s.add_argument("--batch-window-ms", type=float, default=3.0,
                   help="how long a request waits for others to share its batched search")
    s.add_argument("--max-batch-queries", type=int, default=64, help="queries per batched search")
    s.add_argument("--max-queue", type=int, default=1024,
                   help="queries allowed to wait; beyond it requests get 503 with Retry-After")
    s.add_argument("--no-micro-batching", action="store_true", help="search one request at a time")
    s.add_argument("--device", default="cpu", help="where queries are encoded and a flat index searches: cpu, cuda, "
                   "cuda:N, auto (faiss-gpu where FAISS has it, else an exact torch search in float16)")
    s.add_argument("--query-precision", default="float32", choices=("float32", "onnx", "bfloat16", "int8", "auto"),
                   help="query encoder: float32 (what the agent figures were measured with), or auto: bfloat16 where "
                        "the CPU/GPU multiplies it natively (1.6x the requests/s under load, recall@10 -0.005; "
                        "README, bench service)")
    s.add_argument("--threads", type=int, default=0, help="torch/FAISS threads (0: their defaults; 1 leaves the "
                                                          "other cores to the HTTP server on a small machine)")
    s.set_defaults(func=cmd_serve)


def _serve_llm_parser(sub) -> None:
    from kunlunlab.models import INFERENCE_DTYPES

    m = sub.add_parser("serve-llm", help="serve a local model on an OpenAI-compatible /v1/completions endpoint")
    m.add_argument("--model", default=None, help="hub id or local path (default: embedded SmolLM2)")
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=8001)
    m.add_argument("--device", default="auto", help="auto (this process's CUDA GPU when present), cpu, cuda, cuda:N")
    m.add_argument("--dtype", default="auto", choices=INFERENCE_DTYPES, help="generation dtype (auto: bfloat16 on "
                   "a GPU with it and on CPUs that multiply bf16 natively)")
    m.set_defaults(func=cmd_serve_llm)


def _eval_parser(sub) -> None:
    from kunlunlab.agent.methods import METHODS  # the CLI's choices are the package's constants
    from kunlunlab.retrieval.retriever import INDEX_KINDS

    e = sub.add_parser("eval", help="run one method over one dataset; JSON summary as the last line")
    e.add_argument("--config", default=None, help="JSON of EvalConfig fields (experiments/configs/eval/); flags and "
                   "--set override it")
    e.add_argument("--set", nargs="*", default=None, metavar="KEY=VALUE", help="EvalConfig overrides, e.g. "
                   "rdra.background_k=2 stie.max_rounds=3 rollout.max_searches=4")
    e.add_argument("--dataset", default=None, help="'world' (factoid), 'world_summary' (summary-oriented: the "
                   "long-answer mode), a benchmark name or a QA file in any supported layout")
    e.add_argument("--method", default=None, help=", ".join(METHODS) + CHECKPOINT_DEFAULT % "kunlun")
    e.add_argument("--limit", type=int, default=None, help="first N questions (default: all)")
    e.add_argument("--model", default=None, help="LLM hub id, local path or trained checkpoint folder "
                   "(default: embedded SmolLM2)")
    e.add_argument("--llm-url", default=None, help="OpenAI-compatible server (vLLM, SGLang) instead of a local model")
    e.add_argument("--judge", default=None, metavar="MODEL_OR_PATH",
                   help="LLM judge for LJ: hub id or local path, or the served model name with --judge-url; "
                        "'same' lets the answering model grade itself (marked self_judged). Default: no judge, "
                        "LJ is reported as null")
    e.add_argument("--judge-url", default=None, metavar="URL",
                   help="OpenAI-compatible server of the judge, e.g. `vllm serve Qwen/Qwen2.5-7B-Instruct "
                        "--port 8002` then --judge-url http://localhost:8002 --judge Qwen/Qwen2.5-7B-Instruct")
    e.add_argument("--judge-api", default=None, choices=("chat", "completions"),
                   help="--judge-url's route: chat (/v1/chat/completions, any chat model incl. hosted GPT-class; "
                        "default) or completions (token-id prompts; --judge must then load as a tokenizer here)")
    e.add_argument("--judge-key-env", default=None, metavar="VAR",
                   help="NAME of the environment variable holding the chat judge's API key (default OPENAI_API_KEY; "
                        "unset: no key is sent)")
    e.add_argument("--corpus", default=None, help="corpus file (default: the dataset's own closed corpus)")
    e.add_argument("--retriever-url", default=None, metavar="URL",
                   help="search through this retrieval service (kunlunlab serve-retriever or any Search-R1 POST "
                        "/retrieve) instead of an index built here: no corpus is read or embedded; the service is "
                        "checked first, and a search failing after 3 attempts stops the evaluation (exit 1)")
    e.add_argument("--index", dest="index_dir", default=None, metavar="DIR",
                   help="search this saved index folder (kunlunlab build-index --out) without embedding its corpus; "
                        "with --corpus, the corpus must be the one it was built over")
    e.add_argument("--index-kind", default=None, choices=INDEX_KINDS,
                   help="retrieval index built here, not used with --retriever-url or --index" + CHECKPOINT_DEFAULT % "flat")
    e.add_argument("--embedder", default=None, help="hub id or local path; with --retriever-url or --index the one "
                   "they must be built with (then never the checkpoint's)" + CHECKPOINT_DEFAULT % "the embedded all-MiniLM-L6-v2")
    e.add_argument("--batch-size", type=int, default=None, help="questions per generation batch (default 8)")
    e.add_argument("--top-k", type=int, default=None, help="passages per search" + CHECKPOINT_DEFAULT % "3")
    e.add_argument("--max-searches", type=int, default=None, help="searches per question" + CHECKPOINT_DEFAULT % "8")
    e.add_argument("--max-turn-tokens", type=int, default=None, help="tokens per model turn" + CHECKPOINT_DEFAULT % "256")
    e.add_argument("--max-total-tokens", type=int, default=None, help="tokens per trajectory" + CHECKPOINT_DEFAULT % "768")
    e.add_argument("--max-result-chars", type=int, default=None, help="characters per retrieved passage"
                   + CHECKPOINT_DEFAULT % "600")
    e.add_argument("--stie-rounds", type=int, default=None, help="STIE answer rounds, kunlun only"
                   + CHECKPOINT_DEFAULT % "STIEConfig.max_rounds")
    e.add_argument("--no-rdra", dest="use_rdra", action="store_false", default=None,
                   help="kunlun without the RDRA background step (ablation)")
    e.add_argument("--no-stie", dest="use_stie", action="store_false", default=None,
                   help="kunlun without STIE over answer rounds (ablation)")
    e.add_argument("--seed", type=int, default=None, help="world and sampling seed (default 0)")
    e.add_argument("--device", default=None, help="where a local model generates: auto (default: this process's "
                   "CUDA GPU when present), cpu, cuda, cuda:N")
    e.add_argument("--network-url", default=None, help="retrieval service used as NLR's network tier")
    e.add_argument("--router", default=None, help="trained NLR policy file (default: query both tiers)")
    e.add_argument("--out", default=None, help="JSONL file, one record per question (default: records.jsonl "
                   "and summary.json in a new experiments/runs/eval-... folder)")
    e.set_defaults(func=cmd_eval)


def _train_parser(sub) -> None:
    t = sub.add_parser("train", help="progressive training: data mixing, SFT cold start, DAPO (notebook 04)")
    t.add_argument("--config", default=None, help="JSON TrainConfig (experiments/configs/training/train_*.json)")
    t.add_argument("--run-dir", default=None, help="run folder; an existing one is resumed (default: a new one)")
    t.add_argument("--set", nargs="*", default=None, metavar="KEY=VALUE", help="overrides, e.g. sft.learning_rate=5e-5")
    t.add_argument("--smoke", action="store_true", help="tiny sizes, as in the test suite")
    t.add_argument("--dry-run", action="store_true", help="print the resolved batch geometry, device and dtype as "
                   "one JSON line and stop (nothing is loaded); an inconsistent geometry is refused in one line")
    t.add_argument("--world-size", type=int, default=None, help="training processes to plan for (default: this "
                   "launch's WORLD_SIZE, else 1), e.g. --dry-run --world-size 7 for the 8-GPU recipe")
    t.set_defaults(func=cmd_train)


def _rerun_parser(sub) -> None:
    r = sub.add_parser("rerun", help="rerun a kept training result by name (experiments/configs/runs/<name>.json), "
                                     "the runs it starts from first; no name: list them")
    r.add_argument("name", nargs="?", default=None, help="e.g. budget_192.flat_w05 (no name: the list)")
    r.add_argument("--runs-dir", default="runs", help="where each run gets its folder <runs-dir>/<name> (default runs/); "
                   "a finished one is reused, an interrupted one resumed")
    r.add_argument("--dry-run", action="store_true", help="print the plan (runs, folders, checkpoints) as one JSON line")
    r.add_argument("--smoke", action="store_true", help="tiny sizes, as in the test suite")
    r.set_defaults(func=cmd_rerun)


def _train_router_parser(sub) -> None:
    from kunlunlab.retrieval.retriever import INDEX_KINDS

    n = sub.add_parser("train-router", help="train NLR's routing policy against a loopback network tier; "
                                            "JSON summary as the last line")
    n.add_argument("--world-passages", type=int, default=None, help="synthetic world size (default 2000)")
    n.add_argument("--questions", type=int, default=None, help="training + held-out questions (default 200)")
    n.add_argument("--seed", type=int, default=None, help="world seed, as eval --seed (default 0)")
    n.add_argument("--local-fraction", type=float, default=None, help="share of the world in the local index (default 0.5)")
    n.add_argument("--added-latency-ms", type=float, default=None, help="network tier's extra latency (default 150)")
    n.add_argument("--index-kind", default=None, choices=INDEX_KINDS,
                   help="both tiers' index; use the eval's --index-kind (default bm25)")
    n.add_argument("--embedder", default=None)
    n.add_argument("--top-k", type=int, default=None, help="as eval --top-k (default 3)")
    n.add_argument("--epochs", type=int, default=None, help="policy-gradient epochs (default 200)")
    n.add_argument("--recall-weight", type=float, default=None, help="eq. 22's lambda_r (default 1.0)")
    n.add_argument("--latency-weight", type=float, default=None, help="eq. 22's lambda_t (default 0.25)")
    n.add_argument("--network-url", default=None, help="a running service over the same world (default: start one)")
    n.add_argument("--local-corpus-out", default=None, help="also write the local tier's passages (jsonl) here")
    n.add_argument("--out", required=True, help="policy file for eval --router")
    n.set_defaults(func=cmd_train_router)


def _compare_runs_parser(sub) -> None:
    from kunlunlab.training.pipeline import HELDOUT_FILES

    c = sub.add_parser("compare-runs", help="training ablations: training runs' EM on the same held-out questions, "
                                            "each against the first with a paired-bootstrap interval")
    c.add_argument("runs", nargs="+", help="label=run_folder (kunlunlab train --run-dir); the first is the reference")
    c.add_argument("--dataset", default="world", choices=sorted(HELDOUT_FILES))
    c.set_defaults(func=cmd_compare_runs)


def _suite_parser(sub) -> None:
    from kunlunlab.retrieval.retriever import INDEX_KINDS

    q = sub.add_parser("suite", help="notebook 06 without a notebook: Table 2 and the ablations of a checkpoint "
                                     "(records, tables.md; JSON summary as the last line)")
    q.add_argument("--model", default=None, help="trained checkpoint folder (default: the embedded, untrained model)")
    q.add_argument("--train-config", default=None,
                   help="the checkpoint's train_config.json, whose held-out split is evaluated")
    q.add_argument("--device", default=None, help="where the checkpoint generates: auto (default: CUDA when "
                   "present), cpu, cuda, cuda:N")
    q.add_argument("--retriever-url", default=None, help="the benchmarks' searches through this retrieval service "
                   "(POST /retrieve); the synthetic world keeps its own index")
    q.add_argument("--index", dest="index_dir", default=None, help="or through this saved index folder")
    q.add_argument("--index-kind", default=None, choices=INDEX_KINDS,
                   help="the index built over each corpus" + CHECKPOINT_DEFAULT % "flat")
    q.add_argument("--embedder", default=None, help="hub id or local path" + CHECKPOINT_DEFAULT % "the embedded all-MiniLM-L6-v2")
    q.add_argument("--config", default=None, help="JSON of SuiteConfig fields (kunlunlab/studies/suite.py)")
    q.add_argument("--set", nargs="*", default=None,
                   help='SuiteConfig overrides, e.g. world_questions=100 \'baselines=["naive_rag"]\'')
    q.add_argument("--out", default=None, help="output folder (default: a new experiments/runs/<timestamp>-suite)")
    q.set_defaults(func=cmd_suite)


def _run_notebooks_parser(sub) -> None:
    r = sub.add_parser("run-notebooks", help="execute every notebook in order with papermill (make run)")
    r.add_argument("--out", default=None, help="run folder (default experiments/runs/<timestamp>)")
    r.add_argument("--smoke", action="store_true", help="tiny parameters, as in the test suite")
    r.add_argument("--only", nargs="*", default=None, help="notebook name prefixes, e.g. 01")
    r.add_argument("--params", default=None, help="JSON of notebook name -> parameters (experiments/configs/)")
    r.add_argument("--no-progress", action="store_true", help="no per-cell progress bar (papermill's)")
    r.set_defaults(func=cmd_run_notebooks)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
