"""The GPU check's training parts at the one-GPU LoRA recipe's own shape (issue 53), for gpu_check.py.

The shape is read from the recipe file (experiments/configs/training/train_qwen7b_lora_1gpu.json, through
``load_config`` as ``kunlunlab train`` reads it): LoRA rank, alpha, dropout and targets, gradient checkpointing,
the SFT micro-batch and length, DAPO's micro-batch, generations, updates per rollout batch and per-turn and
per-sample tokens, and the retrieval block's size (top_k passages of max_result_chars). ``--tiny`` scales it down
by :data:`TINY_RULE` (token counts / 64, LoRA rank and alpha / 16; the rest as they are), so the toy run trains
the recipe's geometry on a CPU; tests/training/test_gpu_check.py checks both against the file.

``lora_step``: one optimizer step of the recipe's SFT micro-batch with the recipe's LoRA, the loss through TRL's
fused LM head (the SFT stage's: no whole-vocabulary logits). ``dapo_step``: the recipe's DAPO update through
:func:`kunlunlab.training.dapo.run_dapo` (TRL's GRPOTrainer: old log-probs, forward, DAPO loss over the model
tokens of the completions, backward, optimizer step, with the recipe's checkpointing and LoRA), fed pre-made
rollouts of the recipe's longest length (so the minutes go to the update, not to generating 4096 tokens): the
prompt with an RDRA background of top_k passages, then model turns of max_turn_tokens (mask 1) and result blocks
(mask 0) up to max_total_tokens, and EOS. One group (the smallest divisor of prompts_per_step whose batch lays out)
instead of the recipe's 8: the peak does not depend on the accumulation steps, the update's seconds are its
micro-batches' times the recipe's accumulation.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from transformers import TrainerCallback

from kunlunlab.agent.backends import chat_prompt_ids
from kunlunlab.agent.protocol import SYSTEM_PROMPT, build_messages, format_results
from kunlunlab.training.config import DAPOStageConfig, LoRAConfig, load_config
from kunlunlab.training.dapo import rl_dataset, run_dapo
from kunlunlab.training.geometry import GeometryError, batch_plan
from kunlunlab.training.rewards import RewardConfig

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "experiments/configs/training/train_qwen7b_lora_1gpu.json"
TINY_RULE = {"tokens": 64, "lora": 16}  # --tiny: token counts and LoRA rank/alpha divided by these
# what torch sees of the memory of an 80 GB A100/H100 and a 141 GB H200 (GiB), and the CUDA context beside the
# allocator's reserve (an estimate)
GPU_GIB = {"80gb": 79.6, "141gb": 140.4}
CONTEXT_GIB = 0.6
PASSAGE = "The bridge over the northern river was designed by an engineer whose company later built the harbour. "


@dataclass(frozen=True)
class RecipeShape:
    """What the training parts run at: the recipe's numbers, or at --tiny those scaled by TINY_RULE."""

    recipe: str
    scale: str
    lora_r: int
    lora_alpha: int
    lora_dropout: float
    target_modules: str | list
    gradient_checkpointing: bool
    sft_micro_batch: int
    sft_max_length: int
    micro_batch: int
    num_generations: int
    updates_per_generation: int
    prompts_per_step: int
    accumulation_steps: int        # the recipe's, on one GPU
    max_turn_tokens: int
    max_total_tokens: int
    top_k: int
    max_result_chars: int
    learning_rate: float

    def lora(self):
        return LoRAConfig(enabled=True, r=self.lora_r, alpha=self.lora_alpha, dropout=self.lora_dropout,
                          target_modules=self.target_modules).peft_config()


def recipe_shape(path: Path = RECIPE, tiny: bool = False) -> RecipeShape:
    cfg = load_config(path)
    tokens, lora = (TINY_RULE["tokens"], TINY_RULE["lora"]) if tiny else (1, 1)
    plan = batch_plan(cfg.dapo, 1)
    return RecipeShape(
        recipe=str(Path(path).resolve().relative_to(ROOT)) if Path(path).resolve().is_relative_to(ROOT) else str(path),
        scale=f"tiny: tokens / {tokens}, LoRA rank and alpha / {lora}" if tiny else "recipe",
        lora_r=max(1, cfg.lora.r // lora), lora_alpha=max(1, cfg.lora.alpha // lora), lora_dropout=cfg.lora.dropout,
        target_modules=cfg.lora.target_modules, gradient_checkpointing=cfg.gradient_checkpointing,
        sft_micro_batch=cfg.sft.forward_batch_size, sft_max_length=max(8, cfg.sft.max_length // tokens),
        micro_batch=plan.micro_batch_size, num_generations=cfg.dapo.num_generations,
        updates_per_generation=cfg.dapo.updates_per_generation, prompts_per_step=cfg.dapo.prompts_per_step,
        accumulation_steps=plan.gradient_accumulation_steps,
        max_turn_tokens=max(2, cfg.dapo.max_turn_tokens // tokens),
        max_total_tokens=max(4, cfg.dapo.max_total_tokens // tokens), top_k=cfg.top_k,
        max_result_chars=cfg.max_result_chars, learning_rate=cfg.dapo.learning_rate)


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _memory(device: str) -> dict:
    """Peak allocated and reserved GiB since the last reset, and whether the reserve (with the CUDA context) fits
    each GPU size; None on a CPU."""
    if not device.startswith("cuda"):
        return {"peak_gb": None, "peak_reserved_gb": None, "fits_80gb": None, "fits_141gb": None}
    reserved = torch.cuda.max_memory_reserved() / 2**30
    return {"peak_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2), "peak_reserved_gb": round(reserved, 2),
            **{f"fits_{name}": reserved + CONTEXT_GIB <= size for name, size in GPU_GIB.items()}}


def part_lora_step(model, device: str, shape: RecipeShape) -> dict:
    """One optimizer step of the recipe's SFT micro-batch with its LoRA, the loss through TRL's fused LM head."""
    from peft import get_peft_model
    from trl.trainer.utils import add_fused_lm_head

    add_fused_lm_head(model)  # before peft wraps it, as TRL's trainers do
    peft_model = get_peft_model(model, shape.lora())
    params = [p for p in peft_model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=1e-4, foreach=False)
    peft_model.train()
    if shape.gradient_checkpointing:
        peft_model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        peft_model.enable_input_require_grads()
    micro, seq = shape.sft_micro_batch, shape.sft_max_length
    ids = torch.randint(100, 40000, (micro, seq), device=device)
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    _sync(device)
    t0 = time.perf_counter()
    loss = peft_model(input_ids=ids, labels=ids, fused_lm_head=True).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    _sync(device)
    seconds = time.perf_counter() - t0
    result = {"shape": {"lora_r": shape.lora_r, "lora_alpha": shape.lora_alpha, "micro_batch": micro,
                        "tokens_per_sample": seq, "gradient_checkpointing": shape.gradient_checkpointing},
              "lora_r_trained": peft_model.peft_config["default"].r, "tokens": micro * seq,
              "seconds": round(seconds, 3), "tokens_per_s": round(micro * seq / seconds, 1), **_memory(device),
              "trainable_params": sum(p.numel() for p in params), "loss": round(loss.item(), 4)}
    del optimizer
    peft_model.gradient_checkpointing_disable()
    peft_model.unload()  # the plain model back, adapters removed
    return result


def alternating_reward(prompts, completions, **kwargs) -> list[float]:
    """1 for every other sample of a group: the advantages are ±1, so the loss and its gradient are not zero."""
    return [float(i % 2) for i in range(len(completions))]


class PremadeRollout:
    """``rollout_func`` for TRL: the same pre-made sequences of the recipe's longest length for every prompt, each
    sample's model tokens drawn at random (seeded)."""

    def __init__(self, tokenizer, shape: RecipeShape, tiny: bool):
        question = "Who founded the company that built the harbour next to the northern bridge?"
        passage = (PASSAGE * (shape.max_result_chars // len(PASSAGE) + 1))[:shape.max_result_chars]
        background = "\n".join(f"({j + 1}) {passage}" for j in range(shape.top_k))
        prompt = chat_prompt_ids(tokenizer, build_messages(question, background, SYSTEM_PROMPT), "<think>")
        result = tokenizer(format_results([[passage] * shape.top_k]), add_special_tokens=False)["input_ids"]
        if tiny:  # scaled as the token counts are
            prompt = prompt[-max(4, len(prompt) // TINY_RULE["tokens"]):]
            result = result[:max(2, len(result) // TINY_RULE["tokens"])]
        self.prompt, self.result, self.shape = prompt, result, shape
        self.eos = tokenizer.eos_token_id
        self.vocab = min(len(tokenizer), 40000)
        self.generator = torch.Generator().manual_seed(0)
        self.calls, self.sequences = 0, 0

    def completion(self) -> tuple[list[int], list[int]]:
        """Model turns of max_turn_tokens (mask 1) and result blocks (mask 0) up to max_total_tokens, then EOS."""
        ids, mask = [], []
        while len(ids) < self.shape.max_total_tokens:
            turn = min(self.shape.max_turn_tokens, self.shape.max_total_tokens - len(ids))
            ids += torch.randint(100, self.vocab, (turn,), generator=self.generator).tolist()
            mask += [1] * turn
            block = self.result[:self.shape.max_total_tokens - len(ids)]
            ids, mask = ids + block, mask + [0] * len(block)
        return ids + [self.eos], mask + [0]

    def __call__(self, prompts, trainer) -> dict:
        rows = [self.completion() for _ in prompts]
        self.calls += 1
        self.sequences += len(rows)
        return {"prompt_ids": [list(self.prompt) for _ in prompts], "completion_ids": [r[0] for r in rows],
                "logprobs": [[0.0] * len(r[0]) for r in rows], "env_mask": [r[1] for r in rows]}


class StepTimes(TrainerCallback):
    """Seconds of each optimizer step (the first includes the rollout call and TRL's old log-probs)."""

    def __init__(self, device: str):
        self.device, self.seconds, self._t0 = device, [], 0.0

    def on_step_begin(self, args, state, control, **kwargs):
        _sync(self.device)
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        _sync(self.device)
        self.seconds.append(round(time.perf_counter() - self._t0, 2))


def check_group(shape: RecipeShape) -> DAPOStageConfig:
    """The recipe's DAPO stage with the fewest prompts whose batch lays out on one GPU (one group where it can)."""
    for prompts in range(1, shape.prompts_per_step + 1):
        if shape.prompts_per_step % prompts:
            continue
        dapo = DAPOStageConfig(steps=shape.updates_per_generation, prompts_per_step=prompts,
                               num_generations=shape.num_generations, micro_batch_size=shape.micro_batch,
                               updates_per_generation=shape.updates_per_generation,
                               learning_rate=shape.learning_rate, max_turn_tokens=shape.max_turn_tokens,
                               max_total_tokens=shape.max_total_tokens, dynamic_sampling=False, save_steps=10_000)
        try:
            batch_plan(dapo, 1)
        except GeometryError:
            continue
        return dapo
    raise GeometryError(f"{shape.recipe}: no divisor of prompts_per_step={shape.prompts_per_step} lays out")


def part_dapo_step(model, tok, device: str, shape: RecipeShape, tiny: bool, out_dir: Path) -> dict:
    """The recipe's DAPO update through run_dapo (TRL's GRPOTrainer) on pre-made rollouts; its output goes to
    ``out_dir`` (under --work), never beside the JSON."""
    dapo = check_group(shape)
    rollout = PremadeRollout(tok, shape, tiny)
    times = StepTimes(device)
    questions = [f"Who founded company number {i}?" for i in range(4)]
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    trainer = run_dapo(model, tok, rl_dataset(questions, [["x"]] * len(questions)), rollout, dapo, RewardConfig(),
                       out_dir, callbacks=[times], reward_funcs=[alternating_reward], bf16=device.startswith("cuda"),
                       gradient_checkpointing=shape.gradient_checkpointing, world_size=1, peft_config=shape.lora())
    seconds = time.perf_counter() - t0
    memory = _memory(device)
    args, unwrapped = trainer.args, trainer.accelerator.unwrap_model(trainer.model)
    completion = len(rollout.prompt) + shape.max_total_tokens + 1
    micro_seconds = times.seconds[1:] or times.seconds  # the later steps: no rollout, no old log-probs
    result = {
        "shape": {k: v for k, v in asdict(shape).items() if k not in ("recipe", "learning_rate")},
        "recipe": shape.recipe,
        "trl": {"per_device_train_batch_size": args.per_device_train_batch_size,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                "steps_per_generation": args.steps_per_generation, "max_completion_length": args.max_completion_length,
                "gradient_checkpointing": bool(getattr(args, "gradient_checkpointing", None)
                                               or getattr(args, "activation_checkpointing", None)),
                "lora_r": unwrapped.peft_config["default"].r, "lora_alpha": unwrapped.peft_config["default"].lora_alpha},
        "prompts": dapo.prompts_per_step, "sequences": rollout.sequences, "steps": trainer.state.global_step,
        "tokens_per_sample": completion, "prompt_tokens": len(rollout.prompt),
        "model_tokens_per_sample": sum(rollout.completion()[1]), "seconds": round(seconds, 1),
        "step_seconds": times.seconds,
        # one micro-batch per update here; the recipe accumulates accumulation_steps of them per update
        "update_seconds_at_recipe_accumulation": round(sum(micro_seconds) / len(micro_seconds)
                                                       * shape.accumulation_steps, 1),
        **memory}
    trainer.accelerator.free_memory()
    if hasattr(unwrapped, "unload"):
        unwrapped.unload()  # the adapters off again: the full step trains the plain model
    return result
