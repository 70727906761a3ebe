"""Large temporaries of CPU training reused from the heap instead of page-faulted in at every use (glibc malloc).

glibc serves every allocation above its mmap threshold (at most 32 MiB) with a fresh ``mmap`` and unmaps it at
``free``, so each such tensor is page-faulted in, zero-filled by the kernel, every time it is made. A training
step on a CPU makes many: TRL's fused LM head projects the completion tokens onto vocabulary tiles of 32,768
columns in forward and backward (600 tokens: 78 MB in float32 per tile), and converting one such tile to float32
took 28 ms where the arithmetic on it took 2-9 ms (2-core EPYC, 2026-12-02). With ``mmap`` off for allocations
(``mallopt(M_MMAP_MAX, 0)``) and up to ``keep_gb`` of freed memory kept at the top of the heap
(``M_TRIM_THRESHOLD``), those blocks are reused: forward and backward of one 1,000-token sequence (600 scored;
SmolLM2-135M, top 12 layers trained, bf16 autocast) 4.4 s -> 1.9 s, and the update of a DAPO step at make run's
size (``python -m kunlunlab.bench dapo-step --steps 3``) 43.7 -> 32.2 s (30.2 s keeping 4 GB), max resident
memory 4.11 -> 4.24 GB (docs/reference.md). The trim threshold must hold a step's temporaries: at 256 MiB the
backward was 1.8 s again. The cost is fragmentation: a freed block can sit 64 bytes short of the next aligned
request of the same size, so 60 identical 64 MiB tensors in a row left 668-732 MB resident against 284 MB (the
heap grows for the first few, then reuses). The setting is the process's from then on (a notebook kernel, a test
process); the values computed do not change.
"""
from __future__ import annotations

import ctypes
import logging
import platform
import sys

log = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_MAX = -4


def keep_freed_memory(keep_gb: float) -> bool:
    """Makes glibc keep large freed blocks for reuse: no ``mmap`` per allocation, up to ``keep_gb`` GB of free
    memory kept at the heap's top. ``keep_gb`` 0 leaves malloc as it is. Returns whether the setting is in place;
    off Linux/glibc it is not, and nothing changes (a log line says so)."""
    if keep_gb <= 0:
        return False
    if not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        log.info("heap_keep_gb: not a glibc system (%s), malloc left as it is", sys.platform)
        return False
    libc = ctypes.CDLL("libc.so.6")
    trim = min(int(keep_gb * 1e9), 2**31 - 1)  # mallopt takes an int
    return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, trim))
