"""TRL's LM-head tiles reused from the heap in CPU training: with heap_keep_gb the kernel stops zero-filling fresh
pages for every tile of every step (what made the head slow on CPU), only inside the head, and 0 leaves malloc as
it is. The values do not change."""
import json
import platform
import subprocess
import sys

import pytest
from datasets import Dataset

from kunlunlab.configs import ConfigError
from kunlunlab.models import load_llm
from kunlunlab.training import cpu_heap
from kunlunlab.training.config import SFTStageConfig, TrainConfig, config_from_dict
from kunlunlab.training.sft import run_sft
from tiny_training import tiny_llama

glibc_only = pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                                reason="glibc's mallopt")

# keep_gb from argv, then the page faults the kernel reports for 40 allocations of a 64 MiB tensor (above glibc's
# largest mmap threshold, 32 MiB), filled and freed, inside large_blocks_from_heap. Inside, the first
# few grow the heap (how many varies from run to run: a block freed below a small allocation is 64 bytes short of
# the next aligned request until its neighbours are free too) and the rest reuse it.
_FAULTS_OF_LARGE_TEMPORARIES = """
import json, resource, sys
import torch
from kunlunlab.training.cpu_heap import keep_freed_memory, large_blocks_from_heap

def faults():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(40):
        torch.empty(16 * 2**20).fill_(1.0)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

applied = keep_freed_memory(float(sys.argv[1]))
with large_blocks_from_heap():
    inside = faults()
print(json.dumps({"applied": applied, "inside": inside}))
"""

# The page faults of 6 forward and backward passes of TRL's chunked log-prob head over 600 tokens and a 32,768-token
# vocabulary (78 MB tiles in float32), the head wrapped or not (argv), and the log-probabilities and gradient.
_FAULTS_OF_THE_HEAD = """
import json, resource, sys
import torch
from trl.kernels.chunked_logprob import ChunkedLogProbFunction
from kunlunlab.training.cpu_heap import keep_freed_memory
from kunlunlab.training.trl_cpu import reuse_head_tiles_on_cpu

if sys.argv[1] == "heap":
    assert keep_freed_memory(1.0) and reuse_head_tiles_on_cpu() and reuse_head_tiles_on_cpu()  # idempotent
torch.manual_seed(0)
weight, targets = torch.randn(32768, 64) * 0.05, torch.randint(0, 32768, (600,))
hidden = torch.randn(600, 64).requires_grad_(True)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(6):
    hidden.grad = None
    logprobs, *_ = ChunkedLogProbFunction.apply(hidden, weight, None, targets, 1.0, 32768, None, 1.0, ("log_probs",))
    logprobs.sum().backward()
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(json.dumps({"faults": faults, "logprobs": logprobs[:50].tolist(), "grad": hidden.grad[:20].flatten().tolist()}))
"""


def _run(script: str, arg: str) -> dict:
    out = subprocess.run([sys.executable, "-c", script, arg], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@glibc_only
def test_inside_the_scope_large_blocks_are_reused():
    pages = 64 * 2**20 // 4096  # one 64 MiB tensor's pages
    default, kept = _run(_FAULTS_OF_LARGE_TEMPORARIES, "0"), _run(_FAULTS_OF_LARGE_TEMPORARIES, "1.0")
    assert not default["applied"] and kept["applied"]
    assert default["inside"] >= 40 * pages * 0.95  # heap_keep_gb 0: the scope changes nothing, every one anew
    assert kept["inside"] < 16 * pages  # most served from memory the heap kept (seen: 1 to 8 tensors' pages)


@glibc_only
def test_trl_s_head_reuses_its_tiles_with_the_same_values():
    plain, heap = _run(_FAULTS_OF_THE_HEAD, "plain"), _run(_FAULTS_OF_THE_HEAD, "heap")
    tile_pages = 600 * 32768 * 4 // 4096  # one float32 tile: 19,200 pages
    assert plain["faults"] > 6 * tile_pages  # every pass maps its tiles anew
    assert heap["faults"] < plain["faults"] / 3
    assert heap["logprobs"] == plain["logprobs"] and heap["grad"] == plain["grad"]


def test_training_keeps_a_gigabyte_by_default_and_zero_turns_it_off():
    assert TrainConfig().heap_keep_gb == 1.0
    assert config_from_dict({"heap_keep_gb": 0}).heap_keep_gb == 0
    with pytest.raises(ConfigError, match="heap_keep_gb=-1: expected a number >= 0"):
        config_from_dict({"heap_keep_gb": -1})


# What a training step leaves in glibc's heap: 512 MB of 64 KB activations (below the mmap threshold, so on the heap)
# freed below one still live, so the heap cannot shrink from its top; then the step's end with or without
# ReturnFreedPages (argv). The resident memory it leaves, in MiB above the start.
_RESIDENT_AFTER_A_STEP = """
import json, sys
import psutil
import torch
from kunlunlab.training.cpu_heap import freed_pages_returned, keep_freed_memory

assert keep_freed_memory(1.0)
process = psutil.Process()
start = process.memory_info().rss
activations = [torch.ones(16 * 1024) for _ in range(8000)]
live = torch.ones(16 * 1024)
peak = process.memory_info().rss
del activations
if sys.argv[1] == "returned":
    freed_pages_returned()[0].on_step_end(None, None, None)
print(json.dumps({"peak": (peak - start) / 2**20, "after": (process.memory_info().rss - start) / 2**20}))
"""


@glibc_only
def test_a_cpu_training_step_hands_its_freed_heap_back():
    kept, returned = _run(_RESIDENT_AFTER_A_STEP, "kept"), _run(_RESIDENT_AFTER_A_STEP, "returned")
    assert kept["peak"] > 450 and returned["peak"] > 450
    assert kept["after"] > 400  # glibc keeps the holes below a live block resident
    assert returned["after"] < 100  # handed back, although the trim keeps a gigabyte at the heap's top


def test_sft_on_a_cpu_returns_freed_pages_after_every_step(tmp_path, monkeypatch):
    trims = []
    monkeypatch.setattr(cpu_heap, "c_library_function", lambda name: trims.append if name == "malloc_trim" else None)
    monkeypatch.setitem(cpu_heap._state, "keep_bytes", 123)
    tokenizer = load_llm()[1]
    rows = Dataset.from_list([{"input_ids": [100 + 7 * i + j for j in range(12)], "completion_mask": [0] * 4 + [1] * 8}
                              for i in range(6)])
    cfg = SFTStageConfig(batch_size=2, learning_rate=1e-3, max_steps=3, save_steps=100, max_length=64)
    trainer = run_sft(tiny_llama(tokenizer), tokenizer, rows, cfg, tmp_path / "sft", seed=0)
    assert trainer.state.global_step == 3
    assert trims == [123, 123, 123]  # once a step, keeping the heap's top for the next step's head tiles
