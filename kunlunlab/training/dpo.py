"""Step-level DPO on ReasonRAG's preference pairs (arXiv 2505.14069, §3: MCTS + SPRE pairs, then DPO) through
TRL's ``DPOTrainer`` (sigmoid loss; ``beta`` 0.3 by default as in ReasonRAG).

The pairs come from :mod:`kunlunlab.training.preferences` already tokenised: the prompt is a node's prefix
ids (prompt, path so far, ``<result>`` blocks as the environment appended them) and chosen/rejected are the ids
the policy sampled. They reach the loss UNCHANGED: the installed TRL (1.16) always re-tokenises text in
``DPOTrainer._prepare_dataset`` (and appends EOS to non-conversational completions, which would teach the model
to stop after ``</search>``), so :class:`PretokenizedDPOTrainer` overrides that one hook to take
``prompt_ids``/``chosen_ids``/``rejected_ids`` columns as they are. Everything else — collation
(``prompt + chosen`` / ``prompt + rejected``, completion mask over the step), reference log-probs and the loss —
is TRL's own. Pairs longer than ``max_length`` are dropped (and counted) instead of truncated mid-step.

The reference model is a frozen copy of the policy as handed in (the SFT model when this stage follows SFT):
TRL would otherwise reload ``model.config._name_or_path``, which after in-process SFT is still the base model.
"""
from __future__ import annotations

import copy
import functools
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping

from kunlunlab.configs import positive, positive_or

log = logging.getLogger(__name__)

_ID_COLUMNS = ("prompt_ids", "chosen_ids", "rejected_ids")


@dataclass
class DPOStageConfig:
    """Stage ``prl``: DPO on the MCTS step preferences (TRL ``DPOTrainer``, sigmoid loss)."""

    enabled: bool = True
    beta: float = positive(0.3)      # ReasonRAG's β
    learning_rate: float = positive(1e-6)
    steps: int = positive_or(-1, -1)  # optimizer steps; -1: ``epochs`` passes over the pairs
    epochs: float = positive(1.0)
    batch_size: int = positive(4)    # pairs per device and step
    grad_accum: int = positive(1)
    max_length: int = positive(1536)  # prompt + step tokens; longer pairs are dropped, never truncated
    save_steps: int = positive(10)
    logging_steps: int = positive(1)
    precompute_ref_log_probs: bool = False  # True: reference log-probs computed once up front, no reference copy kept

    def __post_init__(self):
        if self.beta <= 0 or self.learning_rate <= 0 or self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError(f"invalid DPO settings: {self}")


def _row(pair) -> dict:
    get = (lambda k: pair[k]) if isinstance(pair, Mapping) else (lambda k: getattr(pair, k))
    row = {k: [int(i) for i in get(k)] for k in _ID_COLUMNS}
    if not row["chosen_ids"] or not row["rejected_ids"] or not row["prompt_ids"]:
        raise ValueError("a preference pair needs non-empty prompt, chosen and rejected ids")
    return row


def dpo_dataset(pairs: Iterable, max_length: int | None = None):
    """A ``datasets.Dataset`` of ``prompt_ids``/``chosen_ids``/``rejected_ids`` from
    :class:`~kunlunlab.training.preferences.PreferencePair` objects or ``preferences.jsonl`` dicts; pairs
    whose prompt + longer step exceed ``max_length`` are dropped."""
    from datasets import Dataset  # deferred: training.config imports this module

    rows, dropped = [], 0
    for pair in pairs:
        row = _row(pair)
        if max_length is not None and len(row["prompt_ids"]) + max(len(row["chosen_ids"]),
                                                                   len(row["rejected_ids"])) > max_length:
            dropped += 1
            continue
        rows.append(row)
    if dropped:
        log.warning("dropped %d of %d preference pairs longer than max_length=%s", dropped, dropped + len(rows),
                    max_length)
    if not rows:
        raise ValueError("no preference pair fits max_length (or there are none); raise dpo.max_length or build "
                         "more trees")
    return Dataset.from_list(rows)


@functools.cache
def _trainer_class():
    from trl import DPOTrainer  # deferred: training.config imports this module

    class PretokenizedDPOTrainer(DPOTrainer):
        """``DPOTrainer`` that takes pre-tokenised ``prompt_ids``/``chosen_ids``/``rejected_ids`` as they are: no
        prompt extraction, no EOS appended, no re-tokenisation. Text datasets go through TRL's own preparation."""

        def _prepare_dataset(self, dataset, processing_class, args, dataset_name):
            first = next(iter(dataset))
            if not all(k in first for k in _ID_COLUMNS):
                return super()._prepare_dataset(dataset, processing_class, args, dataset_name)
            extra = [c for c in (dataset.column_names or []) if c not in _ID_COLUMNS
                     and c not in ("ref_chosen_logps", "ref_rejected_logps")]
            return dataset.remove_columns(extra) if extra else dataset

    return PretokenizedDPOTrainer


def __getattr__(name):  # PretokenizedDPOTrainer without importing TRL at module import
    if name == "PretokenizedDPOTrainer":
        return _trainer_class()
    raise AttributeError(name)


def dpo_args(cfg: DPOStageConfig, output_dir: Path, seed: int = 0, bf16: bool = False, deepspeed: str | None = None,
             gradient_checkpointing: bool = False, report_to: list[str] | None = None):
    import torch  # deferred: training.config imports this module
    from trl import DPOConfig  # deferred: training.config imports this module

    from kunlunlab.training.compat import checkpointing_args  # deferred: it imports transformers

    # one checkpoint is enough to resume: the Trainer writes the new one before it deletes the old
    return DPOConfig(
        output_dir=str(output_dir), loss_type=["sigmoid"], beta=cfg.beta, learning_rate=cfg.learning_rate,
        per_device_train_batch_size=cfg.batch_size, gradient_accumulation_steps=cfg.grad_accum,
        max_steps=cfg.steps, num_train_epochs=cfg.epochs, max_length=cfg.max_length, lr_scheduler_type="constant",
        precompute_ref_log_probs=cfg.precompute_ref_log_probs, logging_steps=cfg.logging_steps,
        save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=1, report_to=list(report_to or []), seed=seed, bf16=bf16,
        deepspeed=deepspeed, **checkpointing_args(gradient_checkpointing), disable_tqdm=True,
        dataloader_num_workers=0, use_cpu=not torch.cuda.is_available(),
    )


def run_dpo(model, tokenizer, pairs, cfg: DPOStageConfig, output_dir: str | Path, seed: int = 0,
            callbacks: list | None = None, ref_model=None, peft_config=None, **arg_overrides):
    """Trains ``model`` in place on ``pairs`` (PreferencePair objects, ``preferences.jsonl`` dicts, or a ready
    :func:`dpo_dataset`), resuming from the last checkpoint in ``output_dir``; returns the trainer.
    ``ref_model``: the frozen reference (default: a copy of ``model`` as handed in; none with
    ``cfg.precompute_ref_log_probs``; with ``peft_config`` TRL trains a LoRA adapter and the reference is the model
    with the adapter switched off, no copy). ``arg_overrides``: ``bf16``, ``deepspeed``, ``gradient_checkpointing``,
    ``report_to``."""
    from datasets import Dataset  # deferred: training.config imports this module
    from kunlunlab.training.resume import train_from_last_checkpoint  # deferred: it imports transformers

    from kunlunlab.training.progress import show_progress  # deferred: as transformers above

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    dataset = pairs if isinstance(pairs, Dataset) else dpo_dataset(pairs, cfg.max_length)
    if ref_model is None and not cfg.precompute_ref_log_probs and peft_config is None:
        ref_model = copy.deepcopy(model)
        ref_model.requires_grad_(False)
        ref_model.eval()
    trainer = _trainer_class()(model=model, ref_model=ref_model, args=dpo_args(cfg, output_dir, seed, **arg_overrides),
                               train_dataset=dataset, processing_class=tokenizer, callbacks=callbacks,
                               peft_config=peft_config)
    show_progress(trainer, "DPO")
    train_from_last_checkpoint(trainer, output_dir, "DPO")
    return trainer


__all__ = ["DPOStageConfig", "dpo_args", "dpo_dataset", "run_dpo"]
