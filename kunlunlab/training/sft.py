"""Stage 1, format cold start: TRL ``SFTTrainer`` on the mixed trajectories.

The dataset is pre-tokenised (``input_ids`` + ``completion_mask``): TRL's own label builder turns
``completion_mask == 0`` into ``-100``, so the prompt, every retrieved ``<result>`` block and the masked
wrong turns of noisy trajectories carry no loss (eq. 19 applied to the cold start). Epochs of the
mixing schedule are concatenated in order and read sequentially, so the curriculum is kept.
"""
from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Sequence

import torch
from datasets import Dataset
from trl import SFTConfig, SFTTrainer

from kunlunlab.training.compat import checkpointing_args
from kunlunlab.training.cpu_heap import freed_pages_returned
from kunlunlab.training.config import SFTStageConfig
from kunlunlab.training.mixing import TrajectoryExample, tokenize_trajectory
from kunlunlab.training.progress import show_progress
from kunlunlab.training.resume import train_from_last_checkpoint
from kunlunlab.training.trl_cpu import reuse_head_tiles_on_cpu, score_labelled_positions_on_cpu

log = logging.getLogger(__name__)


def sft_dataset(tokenizer, trajectories: Sequence[TrajectoryExample], max_length: int, batch_size: int = 1,
                seed: int = 0):
    """A ``datasets.Dataset`` of ``input_ids`` / ``completion_mask`` in curriculum order. Within an epoch of
    the schedule, trajectories of similar length are batched together (batches in random order), which
    cuts padding on CPU without mixing epochs. Trajectories longer than ``max_length`` are dropped (and
    counted in the log) rather than cut mid-protocol."""
    by_epoch: dict[int, list[dict]] = {}
    dropped = 0
    for t in trajectories:
        row = tokenize_trajectory(tokenizer, t)
        if len(row["input_ids"]) > max_length:
            dropped += 1
            continue
        by_epoch.setdefault(t.epoch, []).append(row)
    if dropped:
        log.warning("dropped %d of %d trajectories longer than max_length=%d", dropped, len(trajectories), max_length)
    if not by_epoch:
        raise ValueError("no trajectory fits max_length; raise sft.max_length")
    rng = random.Random(seed)
    rows = []
    for epoch in sorted(by_epoch):
        ordered = sorted(by_epoch[epoch], key=lambda r: len(r["input_ids"]))
        batches = [ordered[i:i + batch_size] for i in range(0, len(ordered), batch_size)]
        rng.shuffle(batches)
        rows.extend(r for b in batches for r in b)
    return Dataset.from_list(rows)


def freeze_for_sft(model, train_layers: int | None) -> int:
    """Freezes the (tied) embeddings and, with ``train_layers``, every decoder layer below the top N.
    Returns the number of trainable parameters."""
    model.get_input_embeddings().weight.requires_grad_(False)
    if train_layers is not None:
        layers = model.model.layers
        for layer in layers[:max(0, len(layers) - train_layers)]:
            layer.requires_grad_(False)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def sft_args(cfg: SFTStageConfig, output_dir: Path, seed: int, bf16: bool = False, deepspeed: str | None = None,
             gradient_checkpointing: bool = False, report_to: list[str] | None = None):
    # one checkpoint is enough to resume: the Trainer writes the new one before it deletes the old
    return SFTConfig(
        output_dir=str(output_dir), per_device_train_batch_size=cfg.forward_batch_size,
        gradient_accumulation_steps=cfg.accumulation_steps, learning_rate=cfg.learning_rate, warmup_steps=cfg.warmup_ratio,
        lr_scheduler_type="cosine", num_train_epochs=1, max_steps=cfg.max_steps, max_length=cfg.max_length,
        completion_only_loss=True, train_sampling_strategy="sequential", logging_steps=cfg.logging_steps,
        save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=1, report_to=list(report_to or []), seed=seed,
        bf16=bf16, deepspeed=deepspeed, **checkpointing_args(gradient_checkpointing), dataloader_num_workers=0,
        disable_tqdm=True, use_cpu=not _has_accelerator(),
    )


def _has_accelerator() -> bool:
    return torch.cuda.is_available()


def run_sft(model, tokenizer, dataset, cfg: SFTStageConfig, output_dir: Path, seed: int = 0,
            callbacks: list | None = None, peft_config=None, **arg_overrides):
    """Trains in place (with ``peft_config``, a LoRA adapter on ``model``); resumes from the last checkpoint in
    ``output_dir``. Returns the trainer. On a CPU the heap's free pages go back to the system after every step
    (:class:`~kunlunlab.training.cpu_heap.ReturnFreedPages`)."""
    score_labelled_positions_on_cpu()
    reuse_head_tiles_on_cpu()
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    trainer = SFTTrainer(model=model, args=sft_args(cfg, output_dir, seed, **arg_overrides), train_dataset=dataset,
                         processing_class=tokenizer, peft_config=peft_config,
                         callbacks=[*(callbacks or []), *([] if _has_accelerator() else freed_pages_returned())])
    show_progress(trainer, "SFT")
    train_from_last_checkpoint(trainer, output_dir, "SFT")
    return trainer
