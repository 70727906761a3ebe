"""Large CPU tensors reused from the heap: with heap_keep_gb the kernel stops zero-filling fresh pages for every
large temporary (what made TRL's fused LM head slow on CPU), and 0 leaves malloc as it is."""
import json
import platform
import subprocess
import sys

import pytest

from kunlunlab.configs import ConfigError
from kunlunlab.training.config import TrainConfig, config_from_dict

# Allocates, fills and frees a 64 MiB tensor (above glibc's largest mmap threshold, 32 MiB) 40 times and counts the
# page faults the kernel reports; keep_gb comes from argv. With the heap kept, the first few grow the heap (how many
# varies from run to run: a block freed below a small allocation is 64 bytes short of the next aligned request until
# its neighbours are free too) and the rest reuse it.
_FAULTS_OF_LARGE_TEMPORARIES = """
import json, resource, sys
import torch
from kunlunlab.training.cpu_heap import keep_freed_memory
applied = keep_freed_memory(float(sys.argv[1]))
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(40):
    torch.empty(16 * 2**20).fill_(1.0)
print(json.dumps({"applied": applied, "faults": resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before}))
"""


def _faults(keep_gb: float) -> dict:
    out = subprocess.run([sys.executable, "-c", _FAULTS_OF_LARGE_TEMPORARIES, str(keep_gb)], capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc",
                    reason="glibc's mallopt")
def test_kept_heap_reuses_large_blocks_instead_of_faulting_them_in_again():
    default, kept = _faults(0), _faults(1.0)
    pages = 64 * 2**20 // 4096  # one 64 MiB tensor's pages
    assert not default["applied"] and kept["applied"]
    assert default["faults"] >= 40 * pages * 0.95  # every tensor faulted in anew: 40 x 16,384 pages
    assert kept["faults"] < 16 * pages  # most served from memory the heap kept (seen: 1 to 8 tensors' pages)


def test_training_keeps_a_gigabyte_by_default_and_zero_turns_it_off():
    assert TrainConfig().heap_keep_gb == 1.0
    assert config_from_dict({"heap_keep_gb": 0}).heap_keep_gb == 0
    with pytest.raises(ConfigError, match="heap_keep_gb=-1: expected a number >= 0"):
        config_from_dict({"heap_keep_gb": -1})
