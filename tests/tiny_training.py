"""Shared helpers of the trainer tests: a tiny randomly initialised Llama on the embedded tokenizer's vocabulary
(seconds per step on CPU), a fixed RL rollout with its length reward, and a callback that keeps each optimizer
step's gradients."""
import torch
from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, TrainerCallback


def tiny_llama(tokenizer, seed: int = 0, max_positions: int = 256, vocab_size: int | None = None):
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size or len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=max_positions,
                         tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(config)


def save_tiny_llama(folder) -> str:
    """A tiny random Llama with the embedded model's tokenizer and chat template, saved as a model folder that any
    ``model`` parameter takes: for the tests of what a run does (stages, checkpoints, resuming), which need a
    model that generates fast, not one that answers (it emits random tokens up to every budget)."""
    from kunlunlab.models import resolve_llm

    tokenizer = AutoTokenizer.from_pretrained(resolve_llm(None))
    tiny_llama(tokenizer, max_positions=8192).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


class KeepGradients(TrainerCallback):
    """The summed gradients of every optimizer step, taken just before the optimizer uses them."""

    def __init__(self):
        self.steps = []

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        self.steps.append({n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None})


def fixed_rollout(questions: list[str], unequal_prompts: bool = False, env_mask: bool = False):
    """A ``rollout_func`` for TRL's GRPOTrainer: each question's k-th sample is a completion of 3 + 2k tokens (ids
    from the question's index), so :func:`length_reward` differs inside every group and the batch has unequal
    lengths. Prompts have 3 tokens, or with ``unequal_prompts`` question i's has 2 + i. With ``env_mask`` the
    call's first group is out of the loss (every token masked, as dynamic sampling leaves a flat group) and in
    every other completion tokens 2 and 3 are environment tokens (a result block after the first model token)."""
    def rollout(prompts, trainer):
        seen, prompt_ids, completion_ids, masks = {}, [], [], []
        for p in prompts:
            k = seen.get(p, 0)
            seen[p] = k + 1
            i = questions.index(p)
            prompt_ids.append([100 + i + j for j in range(2 + i)] if unequal_prompts else [100 + i, 200 + i, 300])
            completion_ids.append([400 + 7 * i + j for j in range(3 + 2 * k)])
            n = len(completion_ids[-1])
            masks.append([0] * n if p == prompts[0] else [1, 0, 0] + [1] * (n - 3))
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids,
                "logprobs": [[0.0] * len(c) for c in completion_ids], **({"env_mask": masks} if env_mask else {})}

    return rollout


def length_reward(prompts, completions, completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]
