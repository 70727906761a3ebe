"""Writes notebooks/01_index_build.ipynb (kept as a script so the notebook's source is reviewable)."""
import nbformat as nbf

md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
cells = [
    md("""# 01 · Index build: dense, IVF-PQ and the clustering retriever

KunLunBaizeRAG retrieves inside every RL rollout, so retrieval must be **fast** and **small** without
losing the passages the reasoning needs. This notebook builds the indexes of `kunlunlab.retrieval`
over a corpus, and measures each one the same way:

* **recall@10 against exact search** (how many of the true 10 nearest passages an index returns),
* **latency per query**, one query at a time, with the same FAISS thread count for every index,
* **memory per vector**,
* and, on the synthetic world, **gold-passage recall**: is the passage that answers a hop's sub-question in the top 5?

The clustering retriever (paper §3.1.1) scores the nearest centroids, turns them into a sampling
distribution with an annealed temperature and EMA cluster weights, splits a global candidate budget
across clusters, and re-ranks reconstructed vectors exactly."""),
    code("""# Parameters (papermill overrides these)
corpus = "world"          # "world", "hotpotqa_distractor", "2wiki" or a corpus file path
n_passages = 10_000       # size of the synthetic world (the benchmark uses 100k)
embedder = None           # None: embedded all-MiniLM-L6-v2; or a hub id / local path (e.g. intfloat/e5-base-v2)
index_kinds = ["ivfpq", "cluster_pq", "hnsw", "bm25"]  # compared besides exact Flat and the cluster retriever
nlist = 0                 # clusters (0: about 2*sqrt(N), a power of two)
pq_m = 48                 # bytes of PQ code per vector (the dimension must divide by 2*pq_m)
nprobe_grid = [1, 2, 4, 8, 16, 32, 64]
budget_grid = [16, 32, 64, 128, 256, 512]
n_queries = 300
threads = 1
seed = 0
smoke = False
run_dir = None"""),
    code("""import json, time
from pathlib import Path
import faiss
from kunlunlab.cli import load_corpus_arg
from kunlunlab.data import World, make_questions, load_benchmark
from kunlunlab.retrieval import (ClusterConfig, ClusterRetriever, Encoder, FlatIndex, HNSWIndex, IVFPQConfig,
                                 IVFPQIndex, IndexConfig, Retriever, BM25Index, corpus_embeddings)
from kunlunlab.retrieval.evaluation import (sweep, time_per_query, recall_at_k, gold_passage_recall,
                                           single_shot_support_recall, supporting_title_recall)
from kunlunlab.viz import recall_latency_figure, memory_figure, save_figure

if smoke:  # tiny sizes so the test suite runs every cell in seconds
    n_passages, n_queries, nprobe_grid, budget_grid = 1_000, 40, [1, 4, 16], [32, 128]
run_dir = Path(run_dir) if run_dir else None
unknown = set(index_kinds) - {"ivfpq", "cluster_pq", "hnsw", "bm25"}
if unknown:
    raise ValueError(f"unknown index_kinds {sorted(unknown)}; choose from ivfpq, cluster_pq, hnsw, bm25")
metrics = {}"""),
    md("""## The corpus

By default, the **synthetic multi-hop world**: invented people, films, cities, countries and companies,
one Wikipedia-style paragraph each, plus namesake distractors that share names and surface forms.
Its questions carry gold chains, each hop naming the passage that answers it."""),
    code("""passages = load_corpus_arg(corpus, n_passages, seed)
if corpus == "world":
    world = World.generate(n_passages=n_passages, seed=seed)
    questions = make_questions(world, max(20, n_queries // 2), seed=seed + 1)
    query_texts = list(dict.fromkeys(h.question for q in questions for h in q.chain))[:n_queries]
else:
    questions = load_benchmark("hotpotqa_distractor") if corpus == "hotpotqa_distractor" else []
    query_texts = [q.question for q in questions][:n_queries] or [p.title for p in passages[:n_queries]]
print(f"{len(passages)} passages, {len(query_texts)} queries")
for p in passages[:3]:
    print("-", p.contents.replace("\\n", " | "))
if corpus == "world":
    q = questions[0]
    print("\\nExample question:", q.question, "->", q.answers)
    for hop in q.chain:
        print("   hop:", hop.question, "->", hop.answer, f"[{hop.passage_id}]")"""),
    md("## Embeddings (cached on disk by embedder and corpus fingerprint)"),
    code("""encoder = Encoder(embedder)
t0 = time.perf_counter()
vectors = corpus_embeddings(encoder, passages, progress=True)
query_vectors = encoder.encode_queries(query_texts)
print(f"{vectors.shape} in {time.perf_counter() - t0:.1f}s (dim {encoder.dim})")

flat = FlatIndex(encoder.dim)
flat.add(vectors)
_, truth = flat.search(query_vectors, 10)
faiss.omp_set_num_threads(threads)
flat_ms, _ = time_per_query(flat.search, query_vectors, 10)
print(f"exact Flat: {flat_ms:.3f} ms/query, {flat.bytes_per_vector():.0f} bytes/vector")"""),
    md("""## IVF-PQ: recall–latency over `nprobe`

The inverted file scans only `nprobe` of `nlist` clusters; product quantisation stores each vector in
`pq_m` bytes. `nprobe` is always set explicitly."""),
    code("""faiss.omp_set_num_threads(faiss.omp_get_max_threads() if threads == 1 else threads)
cluster = ClusterRetriever(encoder.dim, ClusterConfig(nlist=nlist, pq_m=pq_m, seed=seed)).build(vectors)
reference = {"exact Flat": (flat_ms, 1.0)}  # single points for the figure
memory = {"Flat": flat.bytes_per_vector(), "cluster retriever (exact rerank)": cluster.bytes_per_vector()}
ivf_points = []
if "ivfpq" in index_kinds:
    ivfpq = IVFPQIndex(encoder.dim, IVFPQConfig(nlist=cluster.nlist, m=pq_m))
    ivfpq.add(vectors)
    memory["IVF-PQ"] = ivfpq.bytes_per_vector()
    ivf_points = sweep("IVF-PQ", "nprobe", [v for v in nprobe_grid if v <= cluster.nlist],
                       lambda v: (lambda q, k: ivfpq.search(q, k, nprobe=v)), query_vectors, truth,
                       ivfpq.bytes_per_vector(), threads)
for p in ivf_points:
    print(f"nprobe={p.value:>4g}: {p.ms_per_query:.3f} ms, recall@10 {p.recall_at_k:.3f}")"""),
    md("""## The clustering retriever: recall–latency over the candidate budget

Warm it up first so the annealed temperature and EMA weights reach their steady state, then sweep the
global candidate budget `B` (how many reconstructed vectors are re-ranked exactly).

Two re-ranking sources are compared: `rerank="exact"` reads the candidates' float vectors from a
memory-mapped file (RAM holds only the compact codes), `rerank="pq"` rebuilds them from finer residual
PQ codes kept in RAM (nothing on disk, but the reconstruction is approximate)."""),
    code("""cluster.search(query_vectors, 10)  # warm-up pass (adapts the temperature clock and cluster weights)
print("after warm-up:", cluster.describe())

def cluster_with_budget(budget):
    def search(q, k):
        cluster.config.candidate_budget = int(budget)
        return cluster.search(q, k)
    return search

cluster_points = sweep("cluster retriever", "budget", budget_grid, cluster_with_budget, query_vectors, truth,
                       cluster.bytes_per_vector(), threads)
cluster.config.candidate_budget = ClusterConfig().candidate_budget
for p in cluster_points:
    print(f"budget={p.value:>4g}: {p.ms_per_query:.3f} ms, recall@10 {p.recall_at_k:.3f}")

if "cluster_pq" in index_kinds:
    faiss.omp_set_num_threads(faiss.omp_get_max_threads())
    cluster_pq = ClusterRetriever(encoder.dim, ClusterConfig(nlist=nlist, pq_m=pq_m, seed=seed, rerank="pq")).build(vectors)
    cluster_pq.search(query_vectors, 10)
    faiss.omp_set_num_threads(threads)
    pq_ms, pq_rows = time_per_query(cluster_pq.search, query_vectors, 10)
    reference["cluster retriever, rerank=pq"] = (pq_ms, recall_at_k(pq_rows, truth))
    memory["cluster retriever (pq rerank)"] = cluster_pq.bytes_per_vector()
    print(f"rerank='pq' at the default budget: {pq_ms:.3f} ms, recall@10 {reference['cluster retriever, rerank=pq'][1]:.3f}")"""),
    code("""if "hnsw" in index_kinds:
    hnsw = HNSWIndex(encoder.dim)
    faiss.omp_set_num_threads(faiss.omp_get_max_threads())
    hnsw.add(vectors)
    faiss.omp_set_num_threads(threads)
    hnsw_ms, hnsw_rows = time_per_query(hnsw.search, query_vectors, 10)
    reference["HNSW"] = (hnsw_ms, recall_at_k(hnsw_rows, truth))
    memory["HNSW"] = hnsw.bytes_per_vector()

fig = recall_latency_figure(ivf_points + cluster_points, reference)
save_figure(fig, run_dir, "recall_latency")
fig"""),
    code("""# RAM-resident bytes; the exact-rerank cluster retriever also reads dim*4 bytes per candidate from disk
print(f"exact rerank also keeps {cluster.disk_bytes_per_vector():.0f} bytes/vector on disk (memory-mapped)")
fig = memory_figure(memory)
save_figure(fig, run_dir, "memory_per_vector")
fig"""),
    md("""**Reading the figure.** At this notebook's default size (10k passages) exact search is already
cheap, and the clustering retriever's fixed per-query work (centroid scoring, allocation, re-ranking)
can cost as much as scanning everything. Its advantage grows with the corpus: exact search is linear
in N, the clustering retriever is not. `python -m kunlunlab.bench retrieval` measures it at 100k
passages (about 20x faster than Flat at recall@10 0.96 on a 2-core machine)."""),
    md("""## Does retrieval find the evidence?

Recall against exact search says nothing about whether the *right* passage is found. On the synthetic
world every hop of a question names its gold passage; we ask each index for the top 5 on the hop's
sub-question (BM25 included for comparison), and, for contrast, retrieve once with the raw multi-hop
question: the bridge entity is unknown then, so most questions do not get all their evidence. That gap
is what the search-think agent closes by searching hop by hop."""),
    code("""retrievers = {
    "Flat": Retriever(passages, flat, encoder, IndexConfig(kind="flat")),
    "cluster retriever": Retriever(passages, cluster, encoder, IndexConfig(kind="cluster")),
}
if "bm25" in index_kinds:
    bm25 = BM25Index()
    bm25.add_texts([p.contents for p in passages])
    retrievers["BM25"] = Retriever(passages, bm25, None, IndexConfig(kind="bm25"))
gold, single_shot = {}, {}
for name, r in retrievers.items():
    if corpus == "world":
        gold[name] = gold_passage_recall(r.search, questions, k=5)
        single_shot[name] = single_shot_support_recall(r.search, questions, k=5)
    elif questions and questions[0].supporting_titles:
        gold[name] = supporting_title_recall(r.search, questions, k=5)
print("per-hop gold-passage recall@5:", json.dumps(gold, indent=2))
print("single-shot (raw question) support recall@5:", json.dumps(single_shot, indent=2))"""),
    code("""default_point = min(cluster_points, key=lambda p: abs(p.value - ClusterConfig().candidate_budget))
metrics = {
    "n_passages": len(passages), "dim": encoder.dim, "nlist": cluster.nlist,
    "flat_ms": round(flat_ms, 4),
    "single_points": {name: {"ms": round(ms, 4), "recall_at_10": round(r, 4)} for name, (ms, r) in reference.items()},
    "ivfpq": [{"nprobe": p.value, "ms": round(p.ms_per_query, 4), "recall_at_10": round(p.recall_at_k, 4)} for p in ivf_points],
    "cluster": [{"budget": p.value, "ms": round(p.ms_per_query, 4), "recall_at_10": round(p.recall_at_k, 4)} for p in cluster_points],
    "cluster_speedup_vs_flat": round(flat_ms / default_point.ms_per_query, 2),
    "cluster_disk_bytes_per_vector": cluster.disk_bytes_per_vector(),
    "bytes_per_vector": {k: round(v, 1) for k, v in memory.items()},
    "gold_recall_at_5": {k: round(v, 4) for k, v in gold.items()},
    "single_shot_support_recall_at_5": single_shot,
}
if run_dir:
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
metrics"""),
]
nb = nbf.v4.new_notebook()
nb.cells = cells
nb.cells[1].metadata["tags"] = ["parameters"]
nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
nb.metadata["language_info"] = {"name": "python"}
nbf.write(nb, "notebooks/01_index_build.ipynb")
