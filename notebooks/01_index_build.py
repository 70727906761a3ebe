# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Index build: dense, IVF-PQ and the clustering retriever
#
# **What this notebook shows.** KunLunBaizeRAG searches *inside* every RL rollout: a training step issues
# thousands of retrieval calls, so the index must be **fast** and **small** without losing the passages the
# reasoning needs. Here you build the indexes of `kunlunlab.retrieval` over one corpus, measure all of them
# by the same rule, and then open up the paper's **clustering retriever** (§3.1.1) to watch its four
# mechanisms at work: the cluster sampling distribution, temperature annealing, per-cluster quotas of a
# global candidate budget, and EMA cluster weights learnt from hits.
#
# **What you should take away.**
#
# 1. How an approximate index is judged: recall@10 *against exact search*, latency one query at a time,
#    bytes per vector, and, separately, whether the passage that answers a question is found at all.
# 2. What each §3.1.1 formula does, written next to the cell that runs it.
# 3. Why the clustering retriever's advantage depends on the corpus size.
#
# Code: `kunlunlab/retrieval/indexes.py` (Flat, IVF-PQ, HNSW, BM25), `kunlunlab/retrieval/clustered.py` (the
# clustering retriever; its cluster count in `cluster_sizing.py`, its sampling and weights in
# `cluster_sampling.py`), `kunlunlab/retrieval/evaluation.py` (the measurements; `python -m kunlunlab.bench
# retrieval` calls the same `compare_indexes`).

# %% tags=["parameters"]
# Parameters (papermill overrides these)
corpus = "world"          # "world", "hotpotqa_distractor", "2wiki" or a corpus file path
n_passages = 10_000       # size of the synthetic world (the benchmark uses 100k)
embedder = None           # None: embedded all-MiniLM-L6-v2; or a hub id / local path (e.g. intfloat/e5-base-v2)
passage_precision = "auto"  # passages embedded in "bfloat16" where the CPU multiplies it natively (auto), else
                          # "float32": the queries stay float32 and every index here searches the same vectors
index_kinds = ["ivfpq", "cluster_pq", "hnsw", "bm25"]  # compared besides exact Flat and the cluster retriever
nlist = 0                 # clusters (0: about 2*sqrt(N), a power of two)
pq_m = 48                 # bytes of PQ code per vector (the dimension must divide by 2*pq_m)
nprobe_grid = [1, 2, 4, 8, 16, 32, 64]
budget_grid = [16, 32, 64, 128, 256, 512]
n_queries = 300
threads = 1
seed = 0
smoke = False
run_dir = None

# %%
import json, time

from kunlunlab.paths import notebook_run_dir
import numpy as np
from kunlunlab.data.loaders import load_named_corpus
from kunlunlab.data import World, make_questions, load_benchmark
from kunlunlab.retrieval import BM25Index, ClusterConfig, Encoder, IndexConfig, Retriever, corpus_embeddings
from kunlunlab.retrieval.evaluation import cluster_allocation, compare_indexes, evidence_recall
from kunlunlab.retrieval.pareto import ParetoGrids, best_at, dynamic_vs_nearest, pareto_sweep
from kunlunlab.viz import memory_figure, pareto_figure, recall_latency_figure, save_figure
from kunlunlab.viz.data_views import cluster_allocation_figure, cluster_weights_figure, index_rows_html
from IPython.display import HTML, display

if smoke:  # tiny sizes so the test suite runs every cell in seconds (600 passages: the smoke training's world, seed 0)
    n_passages, n_queries, nprobe_grid, budget_grid = 600, 40, [1, 4, 16], [32, 128]
run_dir = notebook_run_dir(run_dir, "01_index_build")  # None: a new experiments/runs folder
unknown = set(index_kinds) - {"ivfpq", "cluster_pq", "hnsw", "bm25"}
if unknown:
    raise ValueError(f"unknown index_kinds {sorted(unknown)}; choose from ivfpq, cluster_pq, hnsw, bm25")
metrics = {}

# %% [markdown]
# ## The corpus
#
# By default, the **synthetic multi-hop world**: invented people, films, cities, countries and companies,
# one Wikipedia-style paragraph each, plus namesake distractors that share names and surface forms.
# Its questions carry gold chains, each hop naming the passage that answers it. The queries we time are
# the hops' sub-questions: the queries an agent actually issues when it searches step by step.

# %%
passages = load_named_corpus(corpus, n_passages, seed)
if corpus == "world":
    world = World.generate(n_passages=n_passages, seed=seed)
    questions = make_questions(world, max(20, n_queries // 2), seed=seed + 1)
    query_texts = list(dict.fromkeys(h.question for q in questions for h in q.chain))[:n_queries]
else:
    questions = load_benchmark("hotpotqa_distractor") if corpus == "hotpotqa_distractor" else []
    query_texts = [q.question for q in questions][:n_queries] or [p.title for p in passages[:n_queries]]
print(f"{len(passages)} passages, {len(query_texts)} queries")
for p in passages[:3]:
    print("-", p.contents.replace("\n", " | "))
if corpus == "world":
    q = questions[0]
    print("\nExample question:", q.question, "->", q.answers)
    for hop in q.chain:
        print("   hop:", hop.question, "->", hop.answer, f"[{hop.passage_id}]")

# %% [markdown]
# ## Embeddings
#
# Every dense index here searches the same L2-normalised embeddings by inner product (cosine similarity).
# The corpus embeddings are cached on disk by embedder, corpus fingerprint and precision, so a second run skips
# this. With `passage_precision` "auto" the passages go through the embedder in bfloat16 where the CPU multiplies it
# natively (AVX512-BF16 or AMX; `kunlunlab/retrieval/encoder.py`), at cosine ≥ 0.998 to the float32 vectors.

# %%
encoder = Encoder(embedder, passage_precision=passage_precision)
t0 = time.perf_counter()
vectors = corpus_embeddings(encoder, passages, progress=True)
query_vectors = encoder.encode_queries(query_texts)
print(f"{vectors.shape} in {time.perf_counter() - t0:.1f}s (dim {encoder.dim}, passages in {encoder.passage_precision})")

# %% [markdown]
# ## Measuring every index the same way
#
# `compare_indexes` (`kunlunlab/retrieval/evaluation.py`) builds exact Flat, the clustering retriever and the
# kinds you asked for, then measures each by one rule:
#
# * **recall@10 against exact search.** For each query, the share of the exact top 10 (a Flat index
#   scanning every vector) that the index returns:
#
#   $$\text{recall@}k = \frac{1}{|Q|}\sum_{q\in Q} \frac{|\,\text{top}_k^{\text{index}}(q) \cap \text{top}_k^{\text{exact}}(q)\,|}{k}$$
#
#   Why exact search and not the gold passages? An approximate index cannot do better than the embedder it
#   searches; measuring against exact search isolates what the *index* loses, so a weak embedder does not
#   hide (or excuse) a weak index. Whether the right passage is found at all is measured separately below.
# * **latency one query at a time**, with the same FAISS thread count (`threads`) for every index: an agent
#   issues its searches one turn at a time, and a batch would hide the per-query overhead. Builds use every core.
# * **bytes per vector held in RAM**; the clustering retriever with `rerank="exact"` also reads the few
#   candidates' float vectors from a memory-mapped file, counted separately as disk bytes.
#
# IVF-PQ is swept over `nprobe` (how many of the `nlist` inverted lists are scanned; product quantisation
# stores each vector in `pq_m` bytes). The clustering retriever is swept over its global candidate budget
# `B` (how many candidates are re-ranked exactly). Before timing, both clustering retrievers serve the query
# set once, so the annealed temperature and the EMA weights (below) are past their cold start.

# %%
result = compare_indexes(vectors, query_vectors, [k for k in index_kinds if k != "bm25"], k=10, threads=threads,
                         nprobe_grid=nprobe_grid, budget_grid=budget_grid,
                         cluster_config=ClusterConfig(nlist=nlist, pq_m=pq_m, seed=seed))
cluster = result.indexes["cluster"]
display(HTML(index_rows_html(result.rows)))

# %%
fig = recall_latency_figure(result.curves(), result.single_points())
save_figure(fig, run_dir, "recall_latency")
fig

# %%
print(f"the exact-rerank cluster retriever also keeps {cluster.disk_bytes_per_vector():.0f} bytes/vector on disk "
      "(memory-mapped; only the candidates' rows are read per query)")
fig = memory_figure(result.memory())
save_figure(fig, run_dir, "memory_per_vector")
fig

# %% [markdown]
# **Reading the figures.** Up and to the left is better. Exact search costs time linear in the corpus size
# N; the clustering retriever's work per query is the centroid scan, a few inverted lists and `B` exact
# dot products, which grows far more slowly. At this notebook's default size (10k passages) exact search
# is already cheap, and the clustering retriever's fixed per-query work can cost as much as scanning
# everything, so read the speed-up off the table above rather than assuming it. `python -m kunlunlab.bench
# retrieval` runs this same comparison at 100k passages (the README's benchmark table).
#
# Two re-ranking sources are compared: `rerank="exact"` reads the candidates' float vectors from a
# memory-mapped file (RAM holds only the compact codes), `rerank="pq"` rebuilds them from finer residual PQ
# codes kept in RAM (nothing on disk, but the reconstruction is approximate, so recall is lower).

# %% [markdown]
# ## Against FAISS's strongest configurations, and the paper's mechanism ablated
#
# One operating point per index says little: every index trades recall for time through a knob. The
# **Pareto sweep** (`pareto_sweep` in `kunlunlab/retrieval/evaluation.py`, also in `python -m kunlunlab.bench
# retrieval`) sweeps each family's knob over the same queries, by the same rule as above: HNSW (`efSearch`),
# IVF-Flat (`nprobe`), IVF-PQ without and with an exact float re-rank (`IndexRefineFlat`: `nprobe` ×
# `k_factor`), and the clustering retriever (candidate budget $B$). For each family the table gives the
# fastest setting that reaches recall@10 ≥ 0.95 and its RAM per vector.
#
# The same sweep ablates §3.1.1's dynamic sampling: `cluster_nearest` is the *same built index* with the
# sampling, quotas and weights switched off (`ClusterConfig(selection="nearest")`): it scans the nearest
# clusters until their members fill the same budget $B$ and re-ranks the best $B$ by PQ score. If the
# sampling earns its complexity, `cluster` should reach higher recall than `cluster_nearest` at equal $B$.

# %%
grids = ParetoGrids(ef_search=(16, 32, 64, 128), ivf_nprobe=(1, 4, 16), ivfpq_nprobe=(16,), refine_nprobe=(4, 16),
                    refine_k_factor=(4, 16), budget_shares=(0.5, 1.0, 2.0), nearest_nprobe=(4,)) if smoke else None
pareto_rows = pareto_sweep(vectors, query_vectors, k=10, threads=threads, comparison=result, grids=grids)
best = best_at(pareto_rows, 0.95)
print(f"fastest setting at recall@10 >= 0.95, per family ({len(passages)} vectors, one query at a time):")
for family, entry in best.items():
    row = entry["best"]
    print(f"  {family:14s} " + (f"{row['setting']:32s} {row['ms']:.3f} ms  {row['bytes_per_vector']:.0f} B/vector RAM"
                                if row else f"not reached (best recall {entry['max_recall_at_10']:.3f})"))
ablation = dynamic_vs_nearest(pareto_rows)
print("\n" + ablation["verdict"])
fig = pareto_figure(pareto_rows)
save_figure(fig, run_dir, "pareto")
fig

# %% [markdown]
# **Reading the sweep.** At this notebook's size the whole corpus fits in a few megabytes and every family is
# fast; HNSW, which keeps every float vector in RAM plus its graph, often reaches the target first. The
# clustering retriever's case is memory: it holds codes only (tens of bytes per vector in RAM, the floats on
# disk) and its advantage over exact search grows with N. The README's benchmark section has the sweep at
# 1M vectors. The verdict line above is computed from this run's numbers, whichever way they fall.

# %% [markdown]
# ## Inside the clustering retriever (§3.1.1)
#
# The paper describes the retriever's mechanisms in prose. The formulas below are the workbench's reading
# of that prose, written exactly as `kunlunlab/retrieval/clustered.py` and `cluster_sampling.py` compute them;
# the docstring of `clustered.py` names each place where the workbench made a choice the paper leaves open (the
# default cluster count, the rounding of quotas, $\gamma = 1$, the bound on the weights).
#
# ### Build: clusters and compact codes
#
# k-means++ seeding, then spherical k-means over the corpus vectors $x_1,\dots,x_N$, gives $C$ centroids
# $\mu_1,\dots,\mu_C$. With `nlist = 0` the count is about $2\sqrt N$, rounded to a power of two:
#
# $$C = 2^{\max\left(3,\ \operatorname{round}\left(\log_2 2\sqrt{N}\right)\right)}, \qquad C \le N/8$$
#
# (the paper picks $C$ by elbow or silhouette, `ClusterConfig(nlist_method="elbow" | "silhouette")`; the
# default weighs the cost of the centroid scan, about $C$, against the cost of a probe, about $N/C$).
# Each vector also gets a `pq_m`-byte code in an IVF-PQ index over those centroids, for the candidate scan.

# %%
sizes = cluster.cluster_sizes
print(f"{cluster.nlist} clusters over {cluster.ntotal} vectors: sizes min {sizes.min()}, "
      f"median {int(np.median(sizes))}, max {sizes.max()}")
print("build seconds:", {k: round(v, 2) for k, v in cluster.build_seconds.items()})

# %% [markdown]
# ### The cluster sampling distribution, with an annealed temperature
#
# For a query $q$ the retriever scores the `max_clusters` nearest centroids, $\mathcal C(q)$, by
# $s_c = \langle q, \mu_c\rangle$ and turns the scores into a distribution over clusters. A temperature
# $T_t$ sharpens it, and each cluster's EMA weight $w_c$ (next section) shifts it:
#
# $$\tilde p_c = \frac{\exp\left(s_c / T_t + \gamma \log w_c\right)}{\sum_{c' \in \mathcal C(q)} \exp\left(s_{c'} / T_t + \gamma \log w_{c'}\right)}, \qquad c \in \mathcal C(q)$$
#
# The temperature anneals with $t$, the number of queries served so far, from $T_\text{start}$ toward $T_\text{end}$
# with time constant $\tau$:
#
# $$T_t = T_\text{end} + \left(T_\text{start} - T_\text{end}\right) e^{-t/\tau}$$
#
# Why anneal? Early on nothing has been learnt: a high temperature flattens the distribution, so the budget
# is spread over many clusters, which protects recall and lets many clusters produce hits for the weights to
# learn from. As $T_t$ falls, the distribution sharpens around the clusters nearest the query and the budget
# concentrates there. The weight term $\gamma \log w_c$ is not divided by $T_t$: it shifts a cluster's share by
# a bounded factor, which decides most between clusters whose scores are close. A cold-start floor
# $\epsilon$ (`min_share`) keeps every considered non-empty cluster above zero, and empty clusters get nothing:
#
# $$p_c = \frac{\max(\tilde p_c, \epsilon)}{\sum_{c' \in \mathcal C(q)} \max(\tilde p_{c'}, \epsilon)}$$
#
# `ClusterRetriever.temperature()` and `ClusterRetriever.cluster_probabilities` implement these; the cell
# below calls them (through `cluster_allocation`) for one query, without serving it.

# %%
c = cluster.config
print(f"T_start {c.temperature_start}, T_end {c.temperature_end}, tau {c.anneal_queries:g} queries, "
      f"gamma {c.weight_strength}, min_share {c.min_share:.6f}")
print(f"after {cluster.step} served queries: T_t = {cluster.temperature():.4f}")
allocation = cluster_allocation(cluster, query_vectors[0], k=10)
print(f"query: {query_texts[0]!r}; sum of p_c over the {len(allocation)} considered clusters: "
      f"{sum(r['probability'] for r in allocation):.4f}")

# %% [markdown]
# ### Per-cluster quotas of a global candidate budget
#
# The budget $B$ (`candidate_budget`, at least $k$) of candidates to re-rank is split in proportion to $p_c$:
#
# $$q_c = p_c\, B$$
#
# A cluster with $q_c \ge 1$ is scanned, and up to $\lceil q_c \rceil$ of its candidates (in PQ order) have
# priority. A cluster with $q_c < 1$ is scanned for $m$ slots (`explore_slots`) with probability $q_c/m$ (one
# systematic draw per query), so its *expected* number of slots is its quota:
#
# $$\Pr[\text{scan } c] = \frac{q_c}{m}, \qquad \mathbb E[\text{slots}_c] = m \cdot \frac{q_c}{m} = q_c$$
#
# Why not simply round $q_c$ down? A floored cluster has $q_c = \epsilon B$, far below one slot: it would never
# be scanned, its documents could never become hits, and its weight could never rise, so the floor would do
# nothing. The nearest cluster is always scanned. Exactly $B$ candidates are re-ranked: those inside their
# cluster's cap first, then the best remaining ones, so quota a small cluster cannot use flows to the others.
# Which clusters get scanned therefore adapts to the query: a query close to one centroid spends its budget
# there, an ambiguous one spreads it. In the figure, blue bars are the clusters this query scans.

# %%
scanned = [r for r in allocation if r["scanned"]]
print(f"quotas sum to B = {sum(r['quota'] for r in allocation):.0f}; {len(scanned)} of {len(allocation)} considered "
      f"clusters scanned, caps {[r['cap'] for r in scanned]}")
fig = cluster_allocation_figure(allocation, title=f"Quotas for: {query_texts[0]}")
save_figure(fig, run_dir, "cluster_quotas")
fig

# %% [markdown]
# ### Exact re-ranking
#
# The $B$ candidates' vectors $\hat x_i$ are read back (`rerank="exact"`: the stored float vector) or rebuilt
# (`rerank="pq"`: $\hat x_i = \mu_{c(i)} + \hat r_i$, the centroid plus a decoded residual), and the final result
# is the top $k$ of $\langle q, \hat x_i \rangle$. The PQ codes only choose candidates; exact scores order them.
#
# ### EMA cluster weights
#
# After serving queries, each cluster's weight moves toward how often it produced final hits relative to its
# size. Over a batch of $n$ served queries (applied every 64 or more), with $o_c$ the share of the top-$k$ hits
# that fell in cluster $c$ and $e_c = |c|/N$ its share of the corpus:
#
# $$y_c = \begin{cases} \operatorname{clip}\left(o_c / e_c,\ 1/\rho,\ \rho\right) & o_c > 0 \\ 1 & o_c = 0 \end{cases} \qquad w_c \leftarrow \operatorname{clip}\left(d^{\,n} w_c + \left(1 - d^{\,n}\right) y_c,\ 1/\rho,\ \rho\right)$$
#
# with $d$ = `ema_decay` and $\rho = F^{1/\gamma}$ ($F$ = `weight_factor`), so the weight term $w_c^\gamma$ in the
# softmax lies in $[1/F, F]$: a cluster hit $F$ times as often as its size predicts has its share multiplied by
# up to $F$, and clusters that stop producing hits relax back to the neutral 1. `ClusterRetriever._update_weights`
# and `weight_bounds` implement this. The weights below were learnt while this notebook warmed up and timed
# the retriever.

# %%
low, high = cluster.weight_bounds()
print(f"weights in [{low:.3f}, {high:.3f}]: {int((cluster.weights > 1.01).sum())} clusters above neutral, "
      f"{int((cluster.weights < 0.99).sum())} below")
fig = cluster_weights_figure(cluster.weights, (low, high))
save_figure(fig, run_dir, "cluster_weights")
fig

# %% [markdown]
# ## Does retrieval find the evidence?
#
# Recall against exact search says nothing about whether the *right* passage is found. On the synthetic
# world every hop of a question names its gold passage; we ask each index for the top 5 on the hop's
# sub-question (BM25 included for comparison), and, for contrast, retrieve once with the raw multi-hop
# question: the bridge entity is unknown then, so a question can miss the evidence for its later hops (compare
# the two read-outs below). That gap is what the search-think agent closes by searching hop by hop. (`evidence_recall` in
# `kunlunlab/retrieval/evaluation.py`; on HotpotQA it measures the supporting titles of the full question.)

# %%
retrievers = {
    "Flat": Retriever(passages, result.indexes["flat"], encoder, IndexConfig(kind="flat")),
    "cluster retriever": Retriever(passages, cluster, encoder, IndexConfig(kind="cluster")),
}
if "bm25" in index_kinds:
    bm25 = BM25Index()
    bm25.add_texts([p.contents for p in passages])
    retrievers["BM25"] = Retriever(passages, bm25, None, IndexConfig(kind="bm25"))
evidence = evidence_recall({name: r.search for name, r in retrievers.items()}, questions, k=5)
print("per-hop gold-passage recall@5:", json.dumps(evidence["gold_recall"], indent=2))
print("single-shot (raw question) support recall@5:", json.dumps(evidence["single_shot"], indent=2))

# %%
metrics = {"n_passages": len(passages), "dim": encoder.dim, **result.metrics(),
           "pareto_best_at_095": {f: (e["best"] and {k: e["best"][k] for k in ("setting", "ms", "bytes_per_vector")})
                                  for f, e in best.items()},
           "dynamic_vs_nearest": {k: ablation[k] for k in ("mean_recall_gain", "wins", "ties", "losses")},
           "gold_recall_at_5": {k: round(v, 4) for k, v in evidence["gold_recall"].items()},
           "single_shot_support_recall_at_5": evidence["single_shot"]}
if run_dir:
    (run_dir / "metrics.json").write_text(json.dumps(metrics, indent=2))
metrics

# %% [markdown]
# ## What this run showed
#
# The numbers below are read back from this run's `metrics.json`, so they are this run's, not typed in.

# %%
shown = json.loads((run_dir / "metrics.json").read_text()) if run_dir else metrics
print(f"{shown['n_passages']} passages, {shown['dim']}-dimensional vectors; exact Flat search "
      f"{shown['flat_ms']} ms per query")
print("per-hop gold-passage recall@5:", shown["gold_recall_at_5"])
print("single-shot support recall@5 (the raw multi-hop question):", shown["single_shot_support_recall_at_5"])
print("dynamic cluster sampling vs nearest clusters:", shown["dynamic_vs_nearest"])
print("cheapest setting per family at recall@10 >= 0.95:", shown["pareto_best_at_095"])

# %% [markdown]
# ## Exercises
#
# 1. Set `n_passages = 50_000` and rerun: how do Flat's latency and the IVF-PQ curve's recall at `nprobe = 8`
#    move? Which index would you pick for a 21M-passage corpus, and what does the Pareto table cost you?
# 2. Set `pq_m = 24` (half the code bytes): how much recall@10 does IVF-PQ lose, and how much memory does it save?
# 3. Set `corpus = "hotpotqa_distractor"`: the gold evidence is now real Wikipedia paragraphs. Does per-hop
#    recall stay where the synthetic world put it, and does BM25 close the gap to the dense retrievers?
# 4. Compare per-hop recall with single-shot recall above: which question types lose their later hops when
#    searched once, and why does that argue for an agent that searches hop by hop?
