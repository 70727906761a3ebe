"""The linear layers of a CPU bfloat16 generation model, run on oneDNN's packed weight layout.

Why: on a CPU, ``torch.nn.functional.linear`` in bfloat16 hands oneDNN the weight in its plain layout at every call,
and at a decode step's few rows that call is mostly the weight's traversal, not arithmetic. oneDNN's own packed
(blocked) layout, made once with ``torch.ops.mkldnn._reorder_linear_weight`` and multiplied with
``torch.ops.mkldnn._linear_pointwise`` (the pair torch's inductor uses for frozen CPU linears), gives the same
numbers bit for bit in bfloat16 at about half the time at a decode step. Measured on the 2-core AMD EPYC with
AVX512-BF16 (2026-12-04, SmolLM2-135M shapes, ms a call, plain -> packed): 8 rows x 576 -> 1536 0.18 -> 0.07,
1536 -> 576 0.11 -> 0.06, the 49,152-token head 7.35 -> 2.39; a 900-token prefill chunk 4.4 -> 4.2
(docs/reference.md has the agent loop's and the DAPO step's figures).

Only a model the generation backend owns is packed (loaded for generation, or its frozen bfloat16 copy of a
training model), on a CPU, in bfloat16, and only after a check on the model's first linear layer finds the packed
product equal to ``F.linear``'s bit for bit (float32 is not packed: oneDNN's float32 kernel rounds differently from
MKL's, so greedy tokens could change). The plain weights stay (the model's ``state_dict`` and training code see
them); the packed copies cost one more copy of the linear weights. A packed layer computes with grad enabled, on
another dtype, or after its weight changed in place (its version counter) exactly as before: plainly, or repacked.
"""
from __future__ import annotations

import functools
import logging

log = logging.getLogger(__name__)

_PACKED = "_kunlunlab_packed"  # a packed module's (weight key, packed weight)


def _weight_key(weight) -> tuple[int, int]:
    return weight.data_ptr(), weight._version


@functools.cache
def packed_linear_class():
    """``PackedLinear``, the ``nn.Linear`` subclass a packed layer's class is switched to (built lazily: torch is a
    heavy import). A class, not a forward set on the instance: a bound forward kept on the module is a reference
    cycle, and a model copy in such a cycle stays resident until Python's rarely run collector frees it."""
    import torch  # deferred: torch takes seconds to import, and only a local session needs it

    class PackedLinear(torch.nn.Linear):
        def forward(self, x):
            weight = self.weight
            if torch.is_grad_enabled() or x.dtype != torch.bfloat16 or weight.dtype != torch.bfloat16 \
                    or x.device.type != "cpu":
                return torch.nn.functional.linear(x, weight, self.bias)
            key, packed = getattr(self, _PACKED)
            if key != _weight_key(weight):  # the weight changed in place (a load_state_dict): pack it again
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
                setattr(self, _PACKED, (_weight_key(weight), packed))
            return torch.ops.mkldnn._linear_pointwise(x.contiguous(), packed, self.bias, "none", [], "")

    return PackedLinear


def _packing_agrees(linear) -> bool:
    """Whether this CPU's packed product equals ``F.linear`` bit for bit on ``linear`` (a random 3-row input)."""
    import torch  # deferred, as above

    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(linear.weight.detach())
        x = torch.randn(3, linear.in_features, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
        with torch.no_grad():
            plain = torch.nn.functional.linear(x, linear.weight, linear.bias)
            ours = torch.ops.mkldnn._linear_pointwise(x, packed, linear.bias, "none", [], "")
    except (RuntimeError, AttributeError, TypeError) as err:  # no such kernel on this CPU, or another signature
        log.info("linear layers left unpacked: %s", str(err).splitlines()[0] if str(err) else type(err).__name__)
        return False
    return torch.equal(plain, ours)


def pack_linears(model) -> int:
    """Packs every ``nn.Linear`` of ``model`` (a bfloat16 model on a CPU that the caller owns for generation);
    returns how many were packed (0: not applicable here, the model left as it was)."""
    import torch  # deferred, as above

    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)
               and m.weight.dtype == torch.bfloat16 and m.weight.device.type == "cpu"]
    if not linears or not torch.backends.mkldnn.is_available() or not _packing_agrees(linears[0]):
        return 0
    packed_class = packed_linear_class()
    for module in linears:
        if type(module) is torch.nn.Linear:  # a subclass has a forward of its own; a packed one is packed
            setattr(module, _PACKED, (_weight_key(module.weight),
                                      torch.ops.mkldnn._reorder_linear_weight(module.weight.detach())))
            module.__class__ = packed_class
    return sum(type(m) is packed_class for m in linears)
