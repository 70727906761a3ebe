"""The ``kunlunlab`` sub-parsers, one builder per command (:func:`kunlunlab.cli.build_parser` pairs each with its
handler in :mod:`kunlunlab.cli`): the flags, their defaults and ``--help`` texts."""
from __future__ import annotations

import argparse

CHECKPOINT_DEFAULT = " (default: the checkpoint's kunlunlab_agent.json, else %s)"  # eval and suite flags


def count(minimum: int):
    """An argparse type: an integer of at least ``minimum`` (a size of 0 or -4 is refused as the flag is read)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= {minimum}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: expected an integer >= {minimum}")
        return value

    parse.__name__ = f"integer >= {minimum}"
    return parse


def build_index_parser(sub) -> argparse.ArgumentParser:
    from kunlunlab.retrieval.clustered import NLIST_METHODS  # deferred: loaded only when the parser is built
    from kunlunlab.retrieval.retriever import INDEX_KINDS

    b = sub.add_parser("build-index", help="embed a corpus and build an index (notebook 01)")
    b.add_argument("--corpus", default=None, help="'world' (default), 'hotpotqa_distractor', '2wiki' or a corpus "
                                                  "file (FlashRAG {id, contents} jsonl; default with --preset: its corpus)")
    b.add_argument("--n", type=count(1), default=20_000, help="passages, for the synthetic world")
    b.add_argument("--seed", type=count(0), default=0)
    b.add_argument("--preset", default=None, metavar="JSON",
                   help="a published setting's index (embedder, its prefixes, kind), e.g. "
                        "experiments/configs/presets/search_r1_e5.json; not with --kind / --embedder")
    b.add_argument("--kind", default=None, choices=INDEX_KINDS, help="index kind (default cluster)")
    b.add_argument("--embedder", default=None, help="hub id or local path (default: embedded all-MiniLM-L6-v2)")
    b.add_argument("--device", default=None, help="cpu (default), cuda, cuda:N or auto (cuda when torch sees a GPU): "
                                                  "where passages are embedded and a flat index is built")
    b.add_argument("--nlist", type=count(0), default=0, help="clusters (0: about 2*sqrt(n) for the cluster retriever, 1024 for IVF-PQ)")
    b.add_argument("--nlist-method", default="sqrt", choices=NLIST_METHODS,
                   help="cluster retriever with --nlist 0: 2*sqrt(n), or chosen by the elbow of k-means inertia or "
                        "the best silhouette on a sample (paper §3.1.1)")
    b.add_argument("--pq-m", type=count(1), default=48, help="bytes of scan code per vector")
    b.add_argument("--nprobe", type=count(1), default=16, help="IVF-PQ clusters scanned per query")
    b.add_argument("--candidate-budget", type=count(0), default=112, help="cluster retriever: re-ranked candidates")
    b.add_argument("--passage-precision", default=None, choices=("float32", "bfloat16", "auto"),
                   help="the embedder's precision for the corpus: bfloat16 is 3.1x faster on CPUs that multiply it "
                        "natively (cosine >= 0.998 to float32); auto: bfloat16 there, else float32")
    b.add_argument("--out", required=True, help="the index folder: new or empty, or one holding an index with "
                                                 "--overwrite (built beside it and renamed at the end)")
    b.add_argument("--overwrite", action="store_true", help="replace the index --out holds (its files are removed "
                                                            "once the new one is in place)")
    b.add_argument("--engine", default="inprocess", choices=("inprocess", "stream", "ray"),
                   help="inprocess: embed and build in memory (default, fastest for small corpora); stream: the "
                        "corpus streams from disk, embedded in shards here; ray: embedded by a Ray Data actor pool "
                        "(local, or a cluster with --address)")
    b.add_argument("--address", default=None, help="ray: the cluster to join ('auto' on a node of it, or "
                                                    "ray://head:10001); default a local Ray")
    b.add_argument("--num-cpus", type=count(1), default=None, help="ray without --address: CPUs of the local Ray")
    b.add_argument("--actors", type=count(0), default=0, help="ray: embedder actors (0: one per GPU, else CPUs - 1)")
    b.add_argument("--shard-rows", type=count(1), default=50_000, help="stream/ray: vectors per embedding shard")
    b.add_argument("--block-rows", type=count(1), default=1024, help="stream/ray: passages per embedding call")
    b.add_argument("--keep-shards", action="store_true", help="stream/ray: keep <out>/shards after the build")
    return b


def serve_retriever_parser(sub) -> argparse.ArgumentParser:
    from kunlunlab.retrieval.encoder import QUERY_PRECISIONS  # deferred: as in build_index_parser

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
    s.add_argument("--query-precision", default="float32", choices=QUERY_PRECISIONS,
                   help="query encoder: float32 (what the agent figures were measured with), or auto: bfloat16 where "
                        "the CPU/GPU multiplies it natively (1.6x the requests/s under load, recall@10 -0.005; "
                        "README, bench service)")
    s.add_argument("--threads", type=int, default=0, help="torch/FAISS threads (0: their defaults; 1 leaves the "
                                                          "other cores to the HTTP server on a small machine)")
    s.add_argument("--max-batch-chars", type=int, default=8192,
                   help="query characters per batched search (64 queries of 128 characters, 4 of 2048): a large "
                        "request is searched in slices this big, so a small request behind it waits for one slice")
    s.add_argument("--max-body-bytes", type=int, default=None,
                   help="larger request bodies get 413 before they are read (default: the largest valid request)")
    s.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /retrieve (default: "
                   "$KUNLUNLAB_RETRIEVER_API_KEY, else none; the clients send that variable too)")
    return s


def serve_llm_parser(sub) -> argparse.ArgumentParser:
    from kunlunlab.models import INFERENCE_DTYPES  # deferred: loaded only when the parser is built

    m = sub.add_parser("serve-llm", help="serve a local model on an OpenAI-compatible /v1/completions endpoint")
    m.add_argument("--model", default=None, help="hub id or local path (default: embedded SmolLM2)")
    m.add_argument("--host", default="127.0.0.1")
    m.add_argument("--port", type=int, default=8001)
    m.add_argument("--device", default="auto", help="auto (this process's CUDA GPU when present), cpu, cuda, cuda:N")
    m.add_argument("--dtype", default="auto", choices=INFERENCE_DTYPES, help="generation dtype (auto: bfloat16 on "
                   "a GPU with it and on CPUs that multiply bf16 natively)")
    m.add_argument("--max-model-len", type=int, default=None,
                   help="a prompt's tokens plus max_tokens may not exceed this (default: the model's context)")
    m.add_argument("--max-tokens", type=int, default=None,
                   help="the largest max_tokens a request may ask for (default: --max-model-len)")
    m.add_argument("--max-prompts", type=int, default=256, help="prompts in one request")
    m.add_argument("--max-queue", type=int, default=16,
                   help="requests allowed to wait behind the one generating; beyond it 503 with Retry-After")
    m.add_argument("--max-body-bytes", type=int, default=None,
                   help="larger request bodies get 413 before they are read (default: room for --max-prompts "
                        "prompts of --max-model-len token ids)")
    m.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /v1 (default: "
                   "$KUNLUNLAB_LLM_API_KEY, else none; the OpenAI backend sends that variable too)")
    return m


def eval_parser(sub) -> argparse.ArgumentParser:
    from kunlunlab.agent.methods import METHODS  # deferred: the CLI's choices are the package's constants
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
    e.add_argument("--llm-url", default=None, help="OpenAI-compatible server (vLLM, SGLang) instead of a local model; "
                   "requests name the model id it serves, --model gives the tokenizer")
    e.add_argument("--prompt", default=None, choices=("auto", "chat", "base"), help="a peer method's prompt: its chat "
                   "messages, its base-model prompt raw (a released base-model checkpoint's), or auto (chat where the "
                   "tokenizer has a chat template, else base; default)")
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
    return e


def train_parser(sub) -> argparse.ArgumentParser:
    t = sub.add_parser("train", help="progressive training: data mixing, SFT cold start, DAPO (notebook 04)")
    t.add_argument("--config", default=None, help="JSON TrainConfig (experiments/configs/training/train_*.json)")
    t.add_argument("--run-dir", default=None, help="run folder; an existing one is resumed (default: a new one)")
    t.add_argument("--set", nargs="*", default=None, metavar="KEY=VALUE", help="overrides, e.g. sft.learning_rate=5e-5; "
                   "each value is checked against its field's type and range (a JSON value, else a string)")
    t.add_argument("--smoke", action="store_true", help="tiny sizes, as in the test suite")
    t.add_argument("--dry-run", action="store_true", help="print the resolved batch geometry, device and dtype as "
                   "one JSON line and stop (nothing is loaded); an inconsistent geometry is refused in one line")
    t.add_argument("--world-size", type=count(1), default=None, help="training processes to plan for (default: this "
                   "launch's WORLD_SIZE, else 1), e.g. --dry-run --world-size 7 for the 8-GPU recipe")
    return t


def rerun_parser(sub) -> argparse.ArgumentParser:
    r = sub.add_parser("rerun", help="rerun a kept training result by name (experiments/configs/runs/<name>.json), "
                                     "the runs it starts from first; no name: list them")
    r.add_argument("name", nargs="?", default=None, help="e.g. budget_192.flat_w05 (no name: the list)")
    r.add_argument("--runs-dir", default="runs", help="where each run gets its folder <runs-dir>/<name> (default runs/); "
                   "a finished one is reused, an interrupted one resumed")
    r.add_argument("--dry-run", action="store_true", help="print the plan (runs, folders, checkpoints) as one JSON line")
    r.add_argument("--smoke", action="store_true", help="tiny sizes, as in the test suite")
    return r


def comparison_parser(sub) -> argparse.ArgumentParser:
    c = sub.add_parser("comparison", help="train every arm of a comparison under its one budget, every seed, then "
                                          "check that the arms ran alike (JSON last)")
    c.add_argument("comparison", help="a comparison file, or a name under experiments/configs/comparisons "
                   "(e.g. table2)")
    c.add_argument("--runs-dir", default="runs", help="each run's folder is <runs-dir>/<comparison>.<arm>.s<seed>; a "
                   "finished one is reused, an interrupted one resumed (default runs/)")
    c.add_argument("--arms", nargs="+", default=None, help="only these arms (default: all)")
    c.add_argument("--seeds", nargs="+", type=int, default=None, help="only these seeds (default: the file's)")
    c.add_argument("--dry-run", action="store_true", help="print every run's name, recipe and the recipe values the "
                   "budget replaces as one JSON line; nothing runs")
    c.add_argument("--smoke", action="store_true", help="tiny sizes, as in the test suite")
    return c


def train_router_parser(sub) -> argparse.ArgumentParser:
    from kunlunlab.retrieval.retriever import INDEX_KINDS  # deferred: loaded only when the parser is built

    n = sub.add_parser("train-router", help="train NLR's routing policy against a loopback network tier; "
                                            "JSON summary as the last line")
    n.add_argument("--world-passages", type=count(1), default=None, help="synthetic world size (default 2000)")
    n.add_argument("--questions", type=count(1), default=None, help="training + held-out questions (default 200)")
    n.add_argument("--seed", type=int, default=None, help="world seed, as eval --seed (default 0)")
    n.add_argument("--local-fraction", type=float, default=None, help="share of the world in the local index (default 0.5)")
    n.add_argument("--added-latency-ms", type=float, default=None, help="network tier's extra latency (default 150)")
    n.add_argument("--index-kind", default=None, choices=INDEX_KINDS,
                   help="both tiers' index; use the eval's --index-kind (default bm25)")
    n.add_argument("--embedder", default=None)
    n.add_argument("--top-k", type=count(1), default=None, help="as eval --top-k (default 3)")
    n.add_argument("--epochs", type=count(1), default=None, help="policy-gradient epochs (default 200)")
    n.add_argument("--recall-weight", type=float, default=None, help="eq. 22's lambda_r (default 1.0)")
    n.add_argument("--latency-weight", type=float, default=None, help="eq. 22's lambda_t (default 0.25)")
    n.add_argument("--network-url", default=None, help="a running service over the same world (default: start one)")
    n.add_argument("--local-corpus-out", default=None, help="also write the local tier's passages (jsonl) here")
    n.add_argument("--out", required=True, help="policy file for eval --router")
    return n


def compare_runs_parser(sub) -> argparse.ArgumentParser:
    from kunlunlab.training.records import HELDOUT_FILES  # deferred: loaded only when the parser is built

    c = sub.add_parser("compare-runs", help="training ablations: training runs' EM on the same held-out questions, "
                                            "each against the first with a paired-bootstrap interval")
    c.add_argument("runs", nargs="+", help="label=run_folder (kunlunlab train --run-dir); the first is the reference")
    c.add_argument("--dataset", default="world", choices=sorted(HELDOUT_FILES))
    return c


def suite_parser(sub) -> argparse.ArgumentParser:
    from kunlunlab.retrieval.retriever import INDEX_KINDS  # deferred: loaded only when the parser is built

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
    return q


def run_notebooks_parser(sub) -> argparse.ArgumentParser:
    r = sub.add_parser("run-notebooks", help="execute every notebook in order with papermill (make run)")
    r.add_argument("--out", default=None, help="run folder (default experiments/runs/<timestamp>)")
    r.add_argument("--smoke", action="store_true", help="tiny parameters, as in the test suite")
    r.add_argument("--only", nargs="*", default=None, help="notebook name prefixes, e.g. 01 (one that matches no "
                                                            "notebook is refused)")
    r.add_argument("--params", default=None, help="JSON of notebook name -> parameters (experiments/configs/); each "
                   "is checked against the notebook's parameters cell before the first notebook runs")
    r.add_argument("--no-progress", action="store_true", help="no per-cell progress bar (papermill's)")
    return r
