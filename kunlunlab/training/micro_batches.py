"""Micro-batches of an RL update without the rollout batch's padding, and without work that carries no loss.

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

Two more kinds of work carry no loss and are skipped (:class:`TrimmedGRPOTrainer`):

- Environment tokens in the LM head. TRL scores every completion position (its labels are the completion), but the
  loss, the entropy it logs and its clip statistics all read ``completion_mask * tool_mask``: the ``<result>`` and
  feedback tokens (``env_mask`` 0, eq. 19's masked tokens, about half of a make run rollout's completion) only
  cost the head's forward and backward over the 49,152-token vocabulary. Their labels are set to -100 before the
  forward, so TRL's fused head (kunlunlab/training/trl_cpu.py) leaves them out; their log-probs and entropies come
  back 0, where the mask zeroes them anyway.
- Micro-batches whose every token is masked: dynamic sampling keeps a group that stayed flat after its refills in
  the batch with its ``env_mask`` zeroed (kunlunlab/training/dapo.py), and TRL runs its forward and backward for a
  loss of exactly 0. With ``beta`` 0 and no auxiliary loss nothing else reads them: they are skipped (a zero loss
  tied to one trainable weight, so the step's backward and gradient accumulation run as before). Only in a single
  process, where no other process waits for this one's gradients. TRL's logged means (entropy, clip ratios) are
  then over the micro-batches that carry loss, instead of counting the skipped ones as zeros.

The update's loss and gradients are unchanged by either (tests/training/test_micro_batches.py).
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


def loss_mask(inputs: dict) -> torch.Tensor:
    """The positions a GRPO micro-batch's loss reads: model tokens of the completion (TRL's own rule)."""
    mask = inputs["completion_mask"]
    return mask if inputs.get("tool_mask") is None else mask * inputs["tool_mask"]


class TrimmedGRPOTrainer(GRPOTrainer):
    """TRL's ``GRPOTrainer`` whose micro-batches are trimmed of their padding (:func:`trim_padding`), whose LM head
    scores model tokens only, and which skips micro-batches without loss (module docstring)."""

    def _prepare_inputs(self, generation_batch):
        return trim_padding(super()._prepare_inputs(generation_batch))

    def _skips_lossless(self) -> bool:
        return (self.beta == 0.0 and not self.aux_loss_enabled and self.accelerator.num_processes == 1
                and not self.is_deepspeed_enabled and not self.is_fsdp_enabled)

    def _compute_loss(self, model, inputs):
        keep = loss_mask(inputs)
        if not keep.any() and self._skips_lossless():
            weight = next(p for p in model.parameters() if p.requires_grad)
            return weight.reshape(-1)[0] * 0.0
        if inputs.get("tool_mask") is None:
            return super()._compute_loss(model, inputs)

        def model_tokens_only(module, args, kwargs):
            labels = kwargs.get("labels")
            if labels is not None and labels.size(0) == keep.size(0) and labels.size(1) >= keep.size(1):
                labels = labels.clone()
                labels[:, labels.size(1) - keep.size(1):].masked_fill_(keep == 0, -100)
                kwargs["labels"] = labels
            return args, kwargs

        handle = self.accelerator.unwrap_model(model).register_forward_pre_hook(model_tokens_only, with_kwargs=True)
        try:
            return super()._compute_loss(model, inputs)
        finally:
            handle.remove()
