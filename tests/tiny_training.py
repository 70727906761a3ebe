"""Shared helpers of the trainer tests: a tiny randomly initialised Llama on the embedded tokenizer's vocabulary
(seconds per step on CPU) and a callback that keeps each optimizer step's gradients."""
import torch
from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback


def tiny_llama(tokenizer, seed: int = 0):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=True)
    return LlamaForCausalLM(config)


class KeepGradients(TrainerCallback):
    """The summed gradients of every optimizer step, taken just before the optimizer uses them."""

    def __init__(self):
        self.steps = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})
