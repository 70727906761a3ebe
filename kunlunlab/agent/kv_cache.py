"""A ragged KV cache for transformers' model code: every row of a batch keeps its own length.

Kept apart from :mod:`kunlunlab.agent.transformers_backend` because it is a cache layer for transformers' model
code, not part of the session's logic: the session plans each forward (which slots it feeds, where each slot's
chunk starts) and builds the matching 4D attention mask; the cache writes each slot's keys/values at that slot's own
columns and hands the attention the filled part.

Why ragged: a padded batch cache appends one column per step for every row, so a row that waits (for its search
results, for the others to finish a turn) leaves holes that later steps attend over, and a row can only join or
continue when the whole batch does. Here slot ``s`` holds its tokens in columns ``[0, length[s])`` with no holes:
one row's appended ``<result>`` block is prefilled for that row alone, and a finished row's slot is taken by the next
question (continuous batching), while every decode step still runs all slots as one batch with an in-place write.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass
class FeedPlan:
    """What the next forward feeds, computed once for all layers: ``slots`` (a long tensor, or None for every slot
    in order), ``rows`` and ``columns`` (long tensors on the cache's device, fed rows x width: the slot and column
    each fed token is written to), the chunk ``width`` and the key length ``kv_len`` the attention sees."""

    slots: object
    rows: object
    columns: object
    width: int
    kv_len: int


@functools.cache
def ragged_cache_class():
    """The ``RaggedCache`` class (built lazily: transformers is a heavy import).

    Each layer keeps keys/values in one buffer ``(slots, kv heads, capacity, head dim)`` with spare room (+50 %), so a
    decode step writes one column per slot in place and a copy happens only when the buffer grows (amortised O(1)
    per token; transformers' ``DynamicLayer`` copies the whole cache with ``torch.cat`` at every step, 60-80 % of a
    CPU decode step at 20 rows and 1000 tokens, torch profiler 2026-11-25)."""
    import torch  # deferred: torch and transformers take seconds to import, and only a local session needs them
    from transformers import DynamicCache  # deferred: as torch above
    from transformers.cache_utils import Cache, DynamicLayer  # deferred: as torch above

    class RaggedLayer(DynamicLayer):
        def lazy_initialization(self, key_states, value_states) -> None:
            self.device = key_states.device
            self._k = self._v = None
            self.is_initialized = True

        def write(self, key_states, value_states, plan: FeedPlan, slots: int):
            """Writes the fed slots' chunk at their own columns; returns the keys/values of the fed slots up to
            ``plan.kv_len`` (a view when every slot is fed, as in a decode step; a gathered copy otherwise)."""
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            _, heads, _, dim = key_states.shape
            if self._k is None:
                shape = (slots, heads, max(plan.kv_len + 64, plan.kv_len * 3 // 2), dim)
                self._k, self._v = key_states.new_zeros(shape), value_states.new_zeros(shape)
            elif plan.kv_len > self._k.shape[2]:
                self._k, self._v = (self._grown(buf, plan.kv_len) for buf in (self._k, self._v))
            index = (plan.rows, slice(None), plan.columns)  # (fed rows, width, heads, dim) of the buffer
            self._k[index] = key_states.transpose(1, 2)
            self._v[index] = value_states.transpose(1, 2)
            keys, values = self._k[:, :, :plan.kv_len], self._v[:, :, :plan.kv_len]
            if plan.slots is None:
                return keys, values
            return keys.index_select(0, plan.slots), values.index_select(0, plan.slots)

        @staticmethod
        def _grown(buffer, need: int):
            s, h, length, d = buffer.shape
            bigger = buffer.new_zeros((s, h, max(need + 64, need * 3 // 2), d))
            bigger[:, :, :length] = buffer
            return bigger

        def resize_slots(self, keep=None, slots: int | None = None) -> None:
            """Keeps the slots ``keep`` (a long tensor, in that order) or grows to ``slots`` slots (new ones empty)."""
            if self._k is None:
                return
            if keep is not None:
                self._k, self._v = self._k.index_select(0, keep), self._v.index_select(0, keep)
            elif slots is not None and slots > self._k.shape[0]:
                extra = (slots - self._k.shape[0],) + tuple(self._k.shape[1:])
                self._k = torch.cat([self._k, self._k.new_zeros(extra)])
                self._v = torch.cat([self._v, self._v.new_zeros(extra)])

        # keys/values as DynamicLayer names them, for code that inspects a cache (all slots, whole buffer)
        @property
        def keys(self):
            return self._k if self._k is not None else torch.empty(0)

        @keys.setter
        def keys(self, value):
            self._k = value

        @property
        def values(self):
            return self._v if self._v is not None else torch.empty(0)

        @values.setter
        def values(self, value):
            self._v = value

    class RaggedCache(DynamicCache):
        """``plan`` is set by the session before each forward; ``slots`` is the batch dimension of every buffer."""

        def __init__(self, slots: int):
            Cache.__init__(self, layer_class_to_replicate=RaggedLayer)
            self.slots = slots
            self.plan: FeedPlan | None = None

        def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
            while len(self.layers) <= layer_idx:
                self.layers.append(RaggedLayer())
            return self.layers[layer_idx].write(key_states, value_states, self.plan, self.slots)

        def resize_slots(self, keep=None, slots: int | None = None) -> None:
            for layer in self.layers:
                layer.resize_slots(keep, slots)
            self.slots = len(keep) if keep is not None else max(self.slots, slots or 0)

        def copy_prefix(self, snapshot, slots, length: int) -> None:
            """Writes ``snapshot`` (per layer, the keys/values of ``length`` prefix columns of one slot) into the
            first ``length`` columns of ``slots``."""
            for layer, (k, v) in zip(self.layers, snapshot):
                if layer._k.shape[2] < length:
                    layer._k, layer._v = layer._grown(layer._k, length), layer._grown(layer._v, length)
                layer._k[slots, :, :length] = k
                layer._v[slots, :, :length] = v

        def copy_slot(self, source: int, slots, length: int) -> None:
            """The first ``length`` columns of slot ``source`` copied into ``slots`` (a long tensor without it)."""
            for layer in self.layers:
                layer._k[slots, :, :length] = layer._k[source, :, :length]
                layer._v[slots, :, :length] = layer._v[source, :, :length]

        def snapshot(self, slot: int, length: int):
            return [(layer._k[slot, :, :length].clone(), layer._v[slot, :, :length].clone()) for layer in self.layers]

    return RaggedCache
