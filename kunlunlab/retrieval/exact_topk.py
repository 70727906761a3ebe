"""Exact top-k of a batch of queries over corpus blocks held on a device in float32, float16 or bfloat16, in one
pass over the corpus (issue 53: 21M x 768 in float16 is 30 GiB, one pass at an H200's 4.8 TB/s about 7 ms).

Why not ``torch.topk`` over each block's scores: a radix select reads a 64 x 4M score block several times and was
most of the 18.9 ms the H200 measured (2026-11-28). Here each block is scored once by one matrix product in the
storage dtype (scores in that dtype: 128 bytes per corpus row at 64 queries, against the 1,536 the row itself
costs), the scores are reduced to the maximum of each group of ``group_rows`` rows (one read), and only the best
groups' rows are looked at again:

1. the kc-th largest group maximum ``m`` per query; every row of the block's top-kc lies in a group whose maximum
   reaches ``m - 2δ`` (kc distinct rows score at least ``m`` in the storage dtype, so the kc-th best true score is
   at least ``m - δ``), where δ bounds the difference between a stored-dtype score and the true one;
2. among those groups' rows, the kc-th largest score ``c``; the rows scoring at least ``c - 2δ`` are rescored in
   float32 from the stored vectors (elementwise, no tensor cores) and the best kc kept.

So the top-k is exact for the vectors as stored (the float32 inner products of the float32 queries with the stored
vectors), not the top-k of rounded scores; float32 blocks skip step 2 (δ = 0). Both steps keep a fixed number of
candidates (k + ``slack``) so that no step waits for the GPU; a query whose candidates did not reach below the
threshold (many near-ties) is searched again by :func:`exact_fp32_top` (a float32 product over the whole
corpus: slower, exact), which is what bfloat16 storage mostly takes (its δ is 8 times float16's).

δ for a query q: ``(4u + d·2⁻²³) |q| max|v|`` with u the storage dtype's unit roundoff (2⁻¹¹ float16, 2⁻⁸
bfloat16): q's rounding to the storage dtype (u|q||v|), the float32 accumulation over d terms and the rounding of the
score (u|q||v|), with a factor 2 to spare. TF32 and reduced-precision reductions are switched off while searching.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

UNIT_ROUNDOFF = {torch.float16: 2.0 ** -11, torch.bfloat16: 2.0 ** -8, torch.float32: 0.0}


@dataclass(frozen=True)
class TopKSettings:
    group_rows: int = 256        # rows per group whose maximum step 1 reads
    slack: int = 48              # candidates beyond k kept in each step (near-ties they can hold)
    fallback_rows: int = 1 << 16  # corpus rows per float32 product in the fallback


def error_bound(dtype: torch.dtype, dim: int) -> float:
    """δ / (|q| max|v|): how far a score computed in ``dtype`` (float32 accumulation) can be from the float32
    inner product of the float32 query with the stored vector."""
    u = UNIT_ROUNDOFF[dtype]
    return 0.0 if u == 0.0 else 4 * u + dim * 2.0 ** -23


@contextlib.contextmanager
def full_precision_matmul():
    """TF32 and reduced-precision (float16/bfloat16) reductions off for the block, as exactness needs."""
    cuda = torch.backends.cuda.matmul
    saved = (cuda.allow_tf32, cuda.allow_fp16_reduced_precision_reduction, cuda.allow_bf16_reduced_precision_reduction)
    cuda.allow_tf32 = cuda.allow_fp16_reduced_precision_reduction = cuda.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        (cuda.allow_tf32, cuda.allow_fp16_reduced_precision_reduction,
         cuda.allow_bf16_reduced_precision_reduction) = saved


def merge_top(values: torch.Tensor, rows: torch.Tensor, more_values: torch.Tensor, more_rows: torch.Tensor,
              k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The best ``k`` of two (values, rows) candidate sets per query."""
    v, r = torch.cat([values, more_values], 1), torch.cat([rows, more_rows], 1)
    v, pick = torch.topk(v, min(k, v.shape[1]), dim=1)
    return v, torch.gather(r, 1, pick)


def block_top(q_stored: torch.Tensor, q32: torch.Tensor, delta: torch.Tensor, block: torch.Tensor, k: int,
              settings: TopKSettings) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(float32 scores, block rows, ok) of the top ``min(k, rows)`` of one corpus block for each query; ``ok``
    False where the fixed candidate counts could not prove the result exact (the caller searches those again)."""
    rows_n, g = block.shape[0], settings.group_rows
    kc = min(k, rows_n)
    scores = q_stored @ block.T  # (queries, rows) in the storage dtype: the one pass over the block
    whole = rows_n // g * g
    maxima = [scores[:, :whole].unflatten(1, (whole // g, g)).amax(2)] if whole else []
    if whole < rows_n:
        maxima.append(scores[:, whole:].amax(1, keepdim=True))
    group_max = (torch.cat(maxima, 1) if len(maxima) > 1 else maxima[0]).float()
    groups = group_max.shape[1]
    kg = min(kc, groups)
    top_max, top_groups = torch.topk(group_max, min(kg + settings.slack, groups), dim=1)
    ok = torch.full((q32.shape[0],), top_max.shape[1] == groups, device=q32.device)
    ok |= top_max[:, -1] < top_max[:, kg - 1] - 2 * delta[:, 0]  # every group reaching m - 2δ is kept
    candidates = (top_groups.unsqueeze(2) * g + torch.arange(g, device=block.device)).flatten(1)
    inside = candidates < rows_n
    candidates = candidates.clamp(max=rows_n - 1)
    values = torch.gather(scores, 1, candidates).float().masked_fill(~inside, float("-inf"))
    if block.dtype == torch.float32:  # the scores are the float32 ones already
        v, pick = torch.topk(values, kc, dim=1)
        return v, torch.gather(candidates, 1, pick), ok
    near, pick = torch.topk(values, min(kc + settings.slack, values.shape[1]), dim=1)
    if near.shape[1] < values.shape[1]:
        ok &= near[:, -1] < near[:, kc - 1] - 2 * delta[:, 0]  # every row reaching c - 2δ is rescored
    rows = torch.gather(candidates, 1, pick)
    exact = (block[rows].float() * q32.unsqueeze(1)).sum(2).masked_fill(near == float("-inf"), float("-inf"))
    v, best = torch.topk(exact, kc, dim=1)
    return v, torch.gather(rows, 1, best), ok


def exact_fp32_top(q32: torch.Tensor, blocks: list[torch.Tensor], k: int,
                   settings: TopKSettings) -> tuple[torch.Tensor, torch.Tensor]:
    """The fallback: float32 products over every block, ``fallback_rows`` rows at a time, merged."""
    values = torch.full((q32.shape[0], 0), float("-inf"), device=q32.device)
    rows = torch.full((q32.shape[0], 0), -1, dtype=torch.long, device=q32.device)
    offset = 0
    for block in blocks:
        for start in range(0, block.shape[0], settings.fallback_rows):
            part = block[start:start + settings.fallback_rows].float()
            v, r = torch.topk(q32 @ part.T, min(k, part.shape[0]), dim=1)
            values, rows = merge_top(values, rows, v, r + offset + start, k)
        offset += block.shape[0]
    return values, rows


def exact_top(queries: torch.Tensor, blocks: list[torch.Tensor], k: int, max_norm: float,
              settings: TopKSettings = TopKSettings()) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(scores, rows, queries searched again) of the exact top-``min(k, rows)`` of float32 ``queries`` (on the
    blocks' device) over ``blocks`` (one dtype), rows numbered across the blocks in order; ``max_norm``: the largest
    norm of a stored vector (δ's scale)."""
    if not blocks:
        raise ValueError("no corpus blocks to search")
    dtype = blocks[0].dtype
    kk = min(k, sum(b.shape[0] for b in blocks))
    q32 = queries.float()
    delta = error_bound(dtype, q32.shape[1]) * max_norm * torch.linalg.vector_norm(q32, dim=1, keepdim=True)
    q_stored = q32.to(dtype)
    values = torch.full((q32.shape[0], 0), float("-inf"), device=q32.device)
    rows = torch.full((q32.shape[0], 0), -1, dtype=torch.long, device=q32.device)
    ok = torch.ones(q32.shape[0], dtype=torch.bool, device=q32.device)
    offset = 0
    with full_precision_matmul(), torch.inference_mode():
        for block in blocks:
            v, r, good = block_top(q_stored, q32, delta, block, kk, settings)
            values, rows = merge_top(values, rows, v, r + offset, kk)
            ok &= good
            offset += block.shape[0]
        again = (~ok).nonzero().flatten()
        if len(again):  # the one wait for the GPU before the results are read anyway
            values[again], rows[again] = exact_fp32_top(q32[again], blocks, kk, settings)
    return values, rows, len(again)
