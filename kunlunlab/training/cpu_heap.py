"""The LM head's large temporaries in CPU training reused from the heap instead of page-faulted in at every use.

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps it at
``free``, so each such tensor is page-faulted in, zero-filled by the kernel, every time it is made. TRL's fused LM
head makes many in every step: it projects the completion tokens onto vocabulary tiles of 32,768 columns in forward
and backward (600 tokens: 78 MB per tile in float32), and converting one such tile to float32 took 28 ms where the
arithmetic on it took 2-9 ms (2-core EPYC, 2026-12-02). Inside :func:`large_blocks_from_heap` (which
``trl_cpu.reuse_head_tiles_on_cpu`` wraps around the head's forward and backward) every allocation comes from the
heap (``M_MMAP_MAX`` 0), and up to ``keep_gb`` of freed memory stays at the heap's top (``M_TRIM_THRESHOLD``), so
the next step's tiles reuse the last step's. Measured (docs/reference.md, "How fast the agent loop runs"): forward
and backward of one 1,000-token sequence (600 scored; SmolLM2-135M, top 12 layers trained, bf16 autocast) 4.4 s ->
1.9 s with the whole process on the heap, and five such sequences 18.1 -> 11.1 s with the head alone on it; the
update of a DAPO step at make run's size (``python -m kunlunlab.bench dapo-step --steps 3``) 43.7 -> 30.1 s.

Only the head, not the whole process: with every allocation on the heap (the first form of this change) notebook
04 of make run peaked at 8.85 GB resident against 7.50 GB, because a heap gives memory back only from its top and
a block freed below a live one stays resident (60 identical 64 MiB tensors in a row left 668-732 MB resident
against 284 MB). Outside the head glibc behaves as before, its mmap threshold fixed at 32 MiB, the largest its
dynamic threshold reaches (setting the trim threshold turns the dynamic adjustment off, which would otherwise leave
the threshold at 128 KiB, where SFT ran 1.7x slower: docs/training.md, "Memory on CPU").
"""
from __future__ import annotations

import contextlib
import logging
import platform
import sys
import threading

from transformers import TrainerCallback

from kunlunlab.models import c_library_function

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_MMAP_MAX = -1, -3, -4  # glibc's mallopt parameters (malloc.h)
GLIBC_MMAP_MAX = 65536  # glibc's default M_MMAP_MAX
LARGEST_MMAP_THRESHOLD = 32 * 2**20  # the most glibc's dynamic mmap threshold grows to on 64-bit

_state = {"mallopt": None, "depth": 0, "keep_bytes": 0}
_lock = threading.Lock()


def keep_freed_memory(keep_gb: float) -> bool:
    """Lets :func:`large_blocks_from_heap` take large blocks from the heap, with up to ``keep_gb`` GB of freed memory
    kept at its top. ``keep_gb`` 0 leaves malloc as it is. Returns whether the setting is in place; off Linux/glibc
    it is not, and nothing changes (a log line says so). The setting is the process's from then on."""
    if keep_gb <= 0:
        return False
    # the parameters' numbers are glibc's
    mallopt = c_library_function("mallopt") if platform.libc_ver()[0] == "glibc" else None
    if mallopt is None:
        log.info("heap_keep_gb: not a glibc system (%s), malloc left as it is", sys.platform)
        return False
    trim = min(int(keep_gb * 1e9), 2**31 - 1)  # mallopt takes an int
    if not (mallopt(M_MMAP_THRESHOLD, LARGEST_MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, trim)):
        return False
    _state["mallopt"] = mallopt
    _state["keep_bytes"] = trim
    return True


class ReturnFreedPages(TrainerCallback):
    """After every optimizer step of a CPU training stage, the heap's free pages go back to the system (glibc's
    ``malloc_trim``), all but the top ``keep_freed_memory`` keeps for the next step's LM-head tiles.

    Why: every step's activations have another size (length-grouped batches), torch frees them into glibc's heap,
    and the heap's holes stay resident, so a stage's resident memory climbs step after step to far above what it
    holds live (docs/training.md, "Memory on CPU"). Returned at each step's end, a hole costs page faults when the
    next step reuses it, instead of staying resident through the stage. Measured on make run's SFT (its first 40 of 78
    steps from make run's own mixed trajectories, one thread per run, the two runs side by side, 2-core EPYC,
    2026-12-04): peak resident 5.24 -> 4.30 GiB (after step 40: 5.24 -> 3.44), 513.1 -> 546.1 s (+6 %: the
    page faults), the same loss at every step."""

    def __init__(self, trim):
        self.trim = trim  # the C library's malloc_trim

    def on_step_end(self, args, state, control, **kwargs):
        self.trim(_state["keep_bytes"])


def freed_pages_returned() -> list:
    """:class:`ReturnFreedPages` for a CPU training stage where the C library has ``malloc_trim`` (glibc), else
    nothing."""
    trim = c_library_function("malloc_trim")
    return [] if trim is None else [ReturnFreedPages(trim)]


@contextlib.contextmanager
def large_blocks_from_heap():
    """Within: allocations of any size come from the heap, once :func:`keep_freed_memory` is in place (else
    nothing changes). Nested and concurrent uses keep the heap until the last one leaves."""
    mallopt = _state["mallopt"]
    if mallopt is None:
        yield
        return
    with _lock:
        _state["depth"] += 1
        if _state["depth"] == 1:
            mallopt(M_MMAP_MAX, 0)
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                mallopt(M_MMAP_MAX, GLIBC_MMAP_MAX)
