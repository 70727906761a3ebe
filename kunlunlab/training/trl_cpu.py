"""Two switches in TRL's fused LM head for CPU training (SFT and DAPO stages): labelled positions only, and its
tiles reused from the heap (:func:`reuse_head_tiles_on_cpu`, kunlunlab/training/cpu_heap.py).

TRL's trainers project the hidden states through the LM head in tiles (``trl.trainer.utils.add_fused_lm_head``)
and score only the positions that carry a label, but only on CUDA/XPU: elsewhere every position is scored
(its comment: on Neuron the number of labelled positions would change the tile shapes and recompile). On a
CPU in eager mode nothing recompiles, and scoring the prompt and the masked ``<result>`` and feedback tokens too
made the head half of an SFT step: 6 SFT steps on make run's trajectories (batch 4, ~720 tokens each,
SmolLM2-135M in float32, 2-core Xeon) took 89.5 s with TRL's CPU path and 51.2 s scoring labelled positions
only (2026-11-25). The values are the same: TRL zeroes the unlabelled positions on both paths
(tests/training/test_trl_cpu.py checks loss and gradients against TRL's own path).
"""
from __future__ import annotations

import logging

from kunlunlab.training.cpu_heap import large_blocks_from_heap

log = logging.getLogger(__name__)


def score_labelled_positions_on_cpu() -> bool:
    """Makes TRL's fused LM head score only labelled positions on CPU too (idempotent). Returns whether the switch
    is in place; with a TRL that no longer has it, logs a warning and leaves TRL as it is (slower, same values)."""
    import trl.trainer.utils as trl_utils  # deferred: TRL loads in seconds; only training calls this

    original = getattr(trl_utils, "_use_triton", None)
    if original is None or not callable(original):
        log.warning("trl.trainer.utils._use_triton not found (TRL changed): the fused LM head scores every position "
                    "on CPU, SFT and DAPO steps will be slower")
        return False
    if getattr(original, "labelled_positions_on_cpu", False):
        return True

    def compact_on_cpu(device) -> bool:
        return device.type == "cpu" or original(device)

    compact_on_cpu.labelled_positions_on_cpu = True
    trl_utils._use_triton = compact_on_cpu
    return True


def reuse_head_tiles_on_cpu() -> bool:
    """Runs the forward and backward of TRL's chunked log-prob head on CPU inside
    :func:`kunlunlab.training.cpu_heap.large_blocks_from_heap` (idempotent), so its vocabulary tiles are reused from
    the heap instead of mapped anew at every call; a no-op until ``keep_freed_memory`` is in place. Returns whether
    the wrapper is in place; with a TRL that no longer has the class, logs a warning and leaves TRL as it is."""
    from trl.kernels import chunked_logprob  # deferred, as above

    function = getattr(chunked_logprob, "ChunkedLogProbFunction", None)
    if function is None:
        log.warning("trl.kernels.chunked_logprob.ChunkedLogProbFunction not found (TRL changed): the LM head's "
                    "tiles are mapped anew at every call on CPU, SFT and DAPO steps will be slower")
        return False
    if getattr(function.forward, "heap_tiles", False):
        return True
    forward, backward = function.forward, function.backward

    def forward_on_heap(ctx, hidden, *args, **kwargs):
        ctx.on_cpu = hidden.device.type == "cpu"  # read by the backward, without unpacking the saved tensors
        if not ctx.on_cpu:
            return forward(ctx, hidden, *args, **kwargs)
        with large_blocks_from_heap():
            return forward(ctx, hidden, *args, **kwargs)

    def backward_on_heap(ctx, *grads):
        if not ctx.on_cpu:
            return backward(ctx, *grads)
        with large_blocks_from_heap():
            return backward(ctx, *grads)

    forward_on_heap.heap_tiles = True
    function.forward, function.backward = staticmethod(forward_on_heap), staticmethod(backward_on_heap)
    return True
