"""A transformers ``DynamicCache`` that appends in place, for the local generation session's KV cache.

Kept apart from :mod:`kunlunlab.agent.transformers_backend` because it is a cache layer for transformers'
model code, not part of the session's logic: the session only creates it and drops rows and columns from it.
"""
from __future__ import annotations

import functools


@functools.cache
def growing_cache_class():
    """A ``DynamicCache`` whose layers append in place (built lazily: transformers is a heavy import).

    transformers' ``DynamicLayer`` appends a token with ``torch.cat``, which copies the whole cache of every
    layer at every decode step; at 20 rows and 1000 cached tokens that copy was 60-80 % of a CPU decode step
    (torch profiler, 2026-11-25). Here each layer keeps its keys/values in a buffer with spare room (+50 %),
    so a step writes one column and a copy happens only when the buffer grows (amortised O(1) per token).
    The model sees a view of the filled part, the same values as ``DynamicLayer`` would hand it.
    """
    import torch  # deferred: torch and transformers take seconds to import, and only a local session needs them
    from transformers import DynamicCache  # deferred: as torch above
    from transformers.cache_utils import Cache, DynamicLayer  # deferred: as torch above

    class GrowingLayer(DynamicLayer):
        def lazy_initialization(self, key_states, value_states) -> None:
            self.device = key_states.device
            self._k = self._v = None
            self._k_len = self._v_len = 0
            self.is_initialized = True

        @staticmethod
        def _grown(buffer, need: int):
            b, h, length, d = buffer.shape
            bigger = buffer.new_empty((b, h, max(need + 64, need * 3 // 2), d))
            bigger[:, :, :length] = buffer
            return bigger

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start, need = self._k_len, self._k_len + key_states.shape[-2]
            if self._k is None:
                self._k, self._v = key_states.contiguous(), value_states.contiguous()
            else:
                if need > self._k.shape[-2]:
                    self._k = self._grown(self._k[:, :, :start], need)
                    self._v = self._grown(self._v[:, :, :start], need)
                self._k[:, :, start:need] = key_states
                self._v[:, :, start:need] = value_states
            self._k_len = self._v_len = need
            return self.keys, self.values

        # keys/values as DynamicLayer names them (each with its own filled length, as they are set one after the
        # other), so DynamicLayer's crop/reset and the session's column drop work on them unchanged
        @property
        def keys(self):
            return self._k[:, :, :self._k_len] if self._k is not None else torch.empty(0)

        @keys.setter
        def keys(self, value):
            self._k, self._k_len = (None, 0) if value is None or value.numel() == 0 else (value, value.shape[-2])

        @property
        def values(self):
            return self._v[:, :, :self._v_len] if self._v is not None else torch.empty(0)

        @values.setter
        def values(self, value):
            self._v, self._v_len = (None, 0) if value is None or value.numel() == 0 else (value, value.shape[-2])

        def batch_select_indices(self, indices) -> None:
            if self._k is not None:
                self._k, self._v = self._k[indices], self._v[indices]

    class GrowingCache(DynamicCache):
        def __init__(self):
            Cache.__init__(self, layer_class_to_replicate=GrowingLayer)

    return GrowingCache
