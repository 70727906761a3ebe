"""Stage 2, DAPO through TRL's ``GRPOTrainer`` (``loss_type="dapo"``: token-level aggregation;
``epsilon_high``: clip-higher; ``beta=0``: no KL term) with rollouts from the shared engine.

:class:`SearchRollout` is the trainer's ``rollout_func``: it runs the batched multi-turn rollout with the
policy being trained, returns the sampled token ids with their log-probs and ``env_mask`` (1 model
token, 0 retrieved/environment token; TRL multiplies it into the loss mask, so retrieved tokens get
exactly zero gradient, eq. 19) and passes each trajectory's parse record to the reward functions.

Dynamic sampling (DAPO): a group whose rewards are all equal has zero advantage and only dilutes the
token-level mean. Such groups are re-sampled up to ``max_resample`` times; groups still flat after
that are taken out of the loss (their ``env_mask`` is zeroed), unless every group is flat.
Overlong shaping is the ``overlong_reward`` component (:mod:`kunlunlab.training.rewards`).
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

from kunlunlab.agent.backends import SamplingConfig, TransformersBackend, chat_prompt_ids
from kunlunlab.agent.protocol import SYSTEM_PROMPT, build_messages
from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine, Trajectory
from kunlunlab.training.config import DAPOStageConfig
from kunlunlab.training.rewards import RewardConfig, format_compliant, parse_completion, score

log = logging.getLogger(__name__)


class SearchRollout:
    """``rollout_func(prompts, trainer)`` for ``GRPOTrainer``; prompts are question strings, repeated
    ``num_generations`` times in a row by TRL's sampler (one completion is returned per entry)."""

    def __init__(self, search, tokenizer, answers: dict[str, list[str]], rollout: RolloutConfig,
                 dapo: DAPOStageConfig, rewards: RewardConfig, log_path: str | Path | None = None,
                 system_prompt: str = SYSTEM_PROMPT, assistant_prefix: str = "<think>"):
        self.search, self.tokenizer, self.answers = search, tokenizer, answers
        self.rollout, self.dapo, self.rewards = rollout, dapo, rewards
        self.system_prompt, self.prefix = system_prompt, assistant_prefix
        self.log_path = Path(log_path) if log_path else None
        self.calls = 0
        self.history: list[dict] = []
        self._remote = None

    def _backend(self, trainer, model):
        """The policy itself on this process; with ``use_vllm`` (server mode) TRL's vLLM server, which
        speaks ``/v1/completions`` and gets the new weights from TRL before every rollout call."""
        if not getattr(trainer, "use_vllm", False):
            return TransformersBackend(model=model, tokenizer=self.tokenizer)
        if trainer.args.vllm_mode != "server":
            raise ValueError("SearchRollout drives multi-turn rollouts through a vLLM server: set dapo.vllm_mode "
                             "to 'server' and start `trl vllm-serve --model <model>`")
        if self._remote is None:
            from kunlunlab.agent.backends import OpenAIBackend

            client = trainer.vllm_generation.vllm_client
            self._remote = OpenAIBackend(client.base_url, getattr(client, "model", None) or model.name_or_path,
                                         tokenizer_name=model.name_or_path)
        return self._remote

    def _question(self, prompt) -> str:
        return prompt if isinstance(prompt, str) else prompt[-1]["content"]

    def _roll(self, backend, questions: list[str], seed: int) -> list[Trajectory]:
        cfg = RolloutConfig(**{**asdict(self.rollout), "sampling": SamplingConfig(
            temperature=self.dapo.temperature, top_p=self.dapo.top_p, seed=seed)})
        prompts = [chat_prompt_ids(self.tokenizer, build_messages(q, None, self.system_prompt), self.prefix)
                   for q in questions]
        return RolloutEngine(backend, self.search, cfg).run(prompts, questions, None, [self.prefix] * len(questions))

    def _record(self, t: Trajectory):
        return parse_completion(t.text, model_tokens=t.model_tokens)  # t.text starts with the prefix step

    def _rewards(self, questions: list[str], trajs: list[Trajectory]) -> list[float]:
        return [score(self._record(t), self.answers.get(q, []), self.rewards).total for q, t in zip(questions, trajs)]

    def __call__(self, prompts: Sequence, trainer) -> dict:
        start = time.perf_counter()
        model = trainer.accelerator.unwrap_model(trainer.model)
        backend = self._backend(trainer, model)
        was_training = model.training
        model.eval()
        questions = [self._question(p) for p in prompts]
        groups_n = max(1, trainer.num_generations)
        groups = [list(range(i, min(i + groups_n, len(questions)))) for i in range(0, len(questions), groups_n)]
        seed = 1000 * (trainer.state.global_step + 1) + trainer.args.seed
        trajs = self._roll(backend, questions, seed)
        rewards = self._rewards(questions, trajs)
        resampled = 0
        flat = [g for g in groups if len({round(rewards[i], 6) for i in g}) == 1]
        if self.dapo.dynamic_sampling:
            for attempt in range(self.dapo.max_resample):
                if not flat:
                    break
                idx = [i for g in flat for i in g]
                fresh = self._roll(backend, [questions[i] for i in idx], seed + attempt + 1)
                fresh_rewards = self._rewards([questions[i] for i in idx], fresh)
                for i, t, r in zip(idx, fresh, fresh_rewards):
                    trajs[i], rewards[i] = t, r
                resampled += len(flat)
                flat = [g for g in groups if len({round(rewards[i], 6) for i in g}) == 1]
        model.train(was_training)

        eos = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        eos = eos if isinstance(eos, int) and eos >= 0 else self.tokenizer.eos_token_id
        filtered = set()
        if self.dapo.dynamic_sampling and flat and len(flat) < len(groups):
            filtered = {i for g in flat for i in g}
        records = [self._record(t) for t in trajs]
        completion_ids, logprobs, env_mask = [], [], []
        for i, t in enumerate(trajs):
            ids, lps, mask = list(t.completion_ids), list(t.logprobs), list(t.mask)
            if t.finish in ("answer", "controller") and eos is not None:
                ids, lps, mask = ids + [eos], lps + [0.0], mask + [0]  # a finished sample ends with EOS
            if not ids:  # the engine always returns tokens; never hand TRL an empty completion
                ids, lps, mask = [eos], [0.0], [0]
            if i in filtered:
                mask = [0] * len(mask)
            completion_ids.append(ids)
            logprobs.append(lps)
            env_mask.append(mask)
        self.calls += 1
        stats = {
            "step": trainer.state.global_step, "rollouts": len(trajs),
            "reward": sum(rewards) / len(rewards),
            "searches": sum(t.n_searches for t in trajs) / len(trajs),
            "model_tokens": sum(t.model_tokens for t in trajs) / len(trajs),
            "env_tokens": sum(len(t.mask) - t.model_tokens for t in trajs) / len(trajs),
            "format_compliance": sum(format_compliant(r) for r in records) / len(trajs),
            "resampled_groups": resampled, "filtered_groups": len(filtered) // groups_n if filtered else 0,
            "flat_groups": len(flat), "groups": len(groups), "seconds": time.perf_counter() - start,
        }
        self.history.append(stats)
        if self.log_path is not None:
            with self.log_path.open("a") as f:
                f.write(json.dumps(stats) + "\n")
        log.info("rollout step %d: reward %.3f, searches %.2f, format %.2f, flat groups %d/%d", stats["step"],
                 stats["reward"], stats["searches"], stats["format_compliance"], len(flat), len(groups))
        return {"prompt_ids": [t.prompt_ids for t in trajs],
                "completion_ids": completion_ids, "logprobs": logprobs, "env_mask": env_mask,
                "parse": [asdict(r) for r in records]}


def grpo_args(cfg: DAPOStageConfig, rewards: RewardConfig, output_dir: Path, seed: int, bf16: bool = False,
              deepspeed: str | None = None, gradient_checkpointing: bool = False,
              reward_weights: list[float] | None = None):
    from trl import GRPOConfig

    import torch

    return GRPOConfig(
        output_dir=str(output_dir), loss_type="dapo", epsilon=cfg.epsilon, epsilon_high=cfg.epsilon_high,
        beta=cfg.beta, num_generations=cfg.num_generations, temperature=cfg.temperature, top_p=cfg.top_p,
        per_device_train_batch_size=cfg.prompts_per_step * cfg.num_generations, gradient_accumulation_steps=1,
        learning_rate=cfg.learning_rate, max_steps=cfg.steps, max_completion_length=cfg.max_total_tokens + 1,
        reward_weights=reward_weights or rewards.weights, scale_rewards="group", mask_truncated_completions=False,
        logging_steps=cfg.logging_steps, save_strategy="steps", save_steps=cfg.save_steps, save_total_limit=2,
        report_to=[], seed=seed, bf16=bf16, deepspeed=deepspeed, gradient_checkpointing=gradient_checkpointing,
        use_vllm=cfg.use_vllm, vllm_mode=cfg.vllm_mode, disable_tqdm=True, dataloader_num_workers=0,
        use_cpu=not torch.cuda.is_available(), lr_scheduler_type="constant",
    )


def rl_dataset(questions: Sequence[str], answers: Sequence[list[str]]):
    from datasets import Dataset

    return Dataset.from_dict({"prompt": list(questions), "answers": [list(a) for a in answers]})


def run_dapo(model, tokenizer, dataset, rollout_func: SearchRollout, cfg: DAPOStageConfig, rewards: RewardConfig,
             output_dir: Path, seed: int = 0, callbacks: list | None = None, reward_funcs: list | None = None,
             **arg_overrides):
    """Trains in place, resuming from the last checkpoint in ``output_dir``; returns the trainer."""
    import os

    from transformers.trainer_utils import get_last_checkpoint
    from trl import GRPOTrainer

    from kunlunlab.training.rewards import reward_functions

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    trainer = GRPOTrainer(model=model, reward_funcs=reward_funcs or reward_functions(rewards),
                          args=grpo_args(cfg, rewards, output_dir, seed, reward_weights=None if reward_funcs is None
                                         else [1.0] * len(reward_funcs), **arg_overrides), train_dataset=dataset,
                          processing_class=tokenizer, rollout_func=rollout_func, callbacks=callbacks)
    last = get_last_checkpoint(str(output_dir))
    if last:
        log.info("resuming DAPO from %s", last)
    trainer.train(resume_from_checkpoint=last)
    return trainer
