"""Micro-batches of an RL update without the rollout batch's padding.

TRL's ``GRPOTrainer`` pads a rollout batch once, every prompt on the left to the longest prompt and every
completion on the right to the longest completion, and cuts the padded tensors into micro-batches of
``per_device_train_batch_size`` rows (``_prepare_inputs``). Each micro-batch then runs forward and backward over
the whole batch's width: with make run's micro-batch of one sequence, a rollout that answered after one search
(~300 tokens) was trained at the width of the group's longest (~1,000 tokens), masked positions costing as much as
real ones. :func:`trim_padding` drops the columns that are padding in every row of a micro-batch: the prompt's
leading columns and the completion's trailing ones.

What the loss reads is unchanged: the dropped positions carry no loss (their completion mask is 0) and no token
attends to them (their attention mask is 0); TRL's loss normalisers are the rollout batch's token count
(``dapo``), per-sequence counts (``grpo``, ``bnpo``) or ``max_completion_length`` (``dr_grpo``), none the padded
width. A row's tokens move to positions that start at 0, as in the rollout that sampled them; rotary position
embeddings depend on position differences only, so the log-probs agree to rounding
(``tests/training/test_micro_batches.py``: the loss and gradients of a batch with unequal prompts and completions
to 1e-5 in float32). A DAPO step's update at make run's size: 62.6 -> 39.7 s on a 2-core AVX2 EPYC in float32
(docs/training.md, "Speed on CPU").
"""
from __future__ import annotations

import torch
from trl import GRPOTrainer

# Tensors aligned with the prompt (left-padded); every other 2-D tensor as wide as the completions is aligned with
# them (right-padded): completion_ids/_mask, tool_mask, old/ref/sampling per-token log-probs, REX-RAG's mixture.
PROMPT_ALIGNED = ("prompt_ids", "prompt_mask", "token_type_ids", "mm_token_type_ids")


def trim_padding(inputs: dict) -> dict:
    """``inputs`` (one micro-batch of TRL's GRPO) without the columns that are padding in all of its rows: prompt
    columns before the first that any row uses, completion columns after the last that any row uses."""
    prompt_mask, completion_mask = inputs.get("prompt_mask"), inputs.get("completion_mask")
    if prompt_mask is None or completion_mask is None or prompt_mask.dim() != 2 or completion_mask.dim() != 2:
        return inputs
    prompt_width, completion_width = prompt_mask.size(1), completion_mask.size(1)
    used_prompt = prompt_mask.bool().any(dim=0).nonzero()
    start = int(used_prompt[0]) if len(used_prompt) else prompt_width
    used_completion = completion_mask.bool().any(dim=0).nonzero()
    end = int(used_completion[-1]) + 1 if len(used_completion) else 1
    if start == 0 and end == completion_width:
        return inputs
    trimmed = {}
    for key, value in inputs.items():
        if torch.is_tensor(value) and value.dim() >= 2:
            if key in PROMPT_ALIGNED and value.size(1) == prompt_width:
                value = value[:, start:]
            elif key not in PROMPT_ALIGNED and value.size(1) == completion_width:
                value = value[:, :end]
        trimmed[key] = value
    return trimmed


class TrimmedGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` whose micro-batches are trimmed of their padding (:func:`trim_padding`)."""

    def _prepare_inputs(self, generation_batch):
        return trim_padding(super()._prepare_inputs(generation_batch))
