"""DAPO's batch geometry, stated once and checked before anything is loaded.

One rollout (generation) batch is ``prompts_per_step`` questions across every training process, each sampled
``num_generations`` times. Each process rolls out ``prompts_per_step / world_size`` whole groups (dynamic
sampling judges and refills groups on the process that rolled them out). The batch is consumed by
``updates_per_generation`` optimizer updates, each over ``micro_batch_size × gradient_accumulation_steps``
sequences per process:

    sequences per process = prompts_per_step / world_size × num_generations
                          = updates_per_generation × gradient_accumulation_steps × micro_batch_size

TRL's names: ``per_device_train_batch_size`` = micro batch, ``steps_per_generation`` = accumulation ×
updates per generation (TRL splits the generation batch into that many micro-batches and takes one optimizer
step every ``gradient_accumulation_steps`` of them), ``num_iterations`` = 1.

Why several updates per rollout batch: with one update per generation the importance ratio
π_θ/π_θold is exactly 1 at the only update, so the clipping of DAPO's objective (eq. 10 of Yu et al. 2025,
ε_low 0.2 / ε_high 0.28: "clip-higher") never binds; DAPO splits each rollout batch of 512 prompts × 16
responses into mini-batches of 512 responses, i.e. 16 updates per rollout. From the second update on the
policy has moved and TRL computes the old log-probs at generation time, so the ratio moves and the clip
can bind. ``dapo.steps`` counts optimizer updates (TRL's ``max_steps``), so a run of ``steps`` updates
makes ``steps / updates_per_generation`` rollout calls.
"""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass

GENERATION_BACKENDS = ("transformers", "vllm-server")


class GeometryError(ValueError):
    """A batch geometry that cannot be laid out; the message names the fields and the numbers."""


@dataclass(frozen=True)
class BatchPlan:
    world_size: int
    prompts_per_step: int            # questions per rollout batch, all processes together
    prompts_per_process: int
    generations_per_prompt: int
    sequences_per_process: int       # sampled sequences one process rolls out per rollout batch
    micro_batch_size: int            # sequences per forward/backward on one device
    gradient_accumulation_steps: int
    updates_per_generation: int      # optimizer updates per rollout batch
    sequences_per_update: int        # across all processes
    steps: int                       # optimizer updates of the run
    rollout_batches: int             # rollout calls of the run
    model_dtype: str
    device: str
    generation: str
    lora: bool
    gradient_checkpointing: bool
    deepspeed: str | None

    @property
    def steps_per_generation(self) -> int:
        """TRL's ``steps_per_generation``: micro-batches per rollout batch on one process."""
        return self.gradient_accumulation_steps * self.updates_per_generation

    def to_json(self) -> str:
        return json.dumps({**asdict(self), "trl": self.trl_args()})

    def trl_args(self) -> dict:
        """The ``GRPOConfig`` arguments that lay out this geometry."""
        return {"per_device_train_batch_size": self.micro_batch_size,
                "gradient_accumulation_steps": self.gradient_accumulation_steps,
                "steps_per_generation": self.steps_per_generation, "num_iterations": 1}


def world_size_from_env() -> int:
    """Training processes of this launch: ``WORLD_SIZE`` as ``accelerate launch``/``torchrun`` set it, else 1."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        size = int(raw)
    except ValueError:
        raise GeometryError(f"WORLD_SIZE={raw!r} is not a whole number") from None
    if size < 1:
        raise GeometryError(f"WORLD_SIZE={size} must be at least 1")
    return size


def batch_plan(dapo, world_size: int, *, model_dtype: str = "float32", device: str = "cpu", lora: bool = False,
               gradient_checkpointing: bool = False, deepspeed: str | None = None) -> BatchPlan:
    """The resolved geometry of a :class:`~kunlunlab.training.config.DAPOStageConfig` on ``world_size``
    processes; :class:`GeometryError` when the numbers do not divide."""
    prompts, gens, updates = dapo.prompts_per_step, dapo.num_generations, dapo.updates_per_generation
    for name, value in (("dapo.prompts_per_step", prompts), ("dapo.num_generations", gens),
                        ("dapo.updates_per_generation", updates), ("world size", world_size)):
        if value < 1:
            raise GeometryError(f"{name} must be at least 1, got {value}")
    if prompts % world_size:
        raise GeometryError(f"dapo.prompts_per_step={prompts} does not split into whole groups over {world_size} "
                            f"processes: make it a multiple of {world_size}")
    per_process = prompts // world_size * gens
    if per_process % updates:
        raise GeometryError(f"{per_process} sequences per process per rollout batch ({prompts} prompts / "
                            f"{world_size} processes × {gens} generations) do not split into "
                            f"dapo.updates_per_generation={updates} equal updates")
    per_update = per_process // updates
    micro = dapo.micro_batch_size or per_update
    if micro < 1 or per_update % micro:
        raise GeometryError(f"dapo.micro_batch_size={micro} does not divide the {per_update} sequences each process "
                            f"feeds one update ({per_process} per rollout batch / {updates} updates)")
    if dapo.steps < 1:
        raise GeometryError(f"dapo.steps must be at least 1, got {dapo.steps}")
    if dapo.steps % updates:
        raise GeometryError(f"dapo.steps={dapo.steps} is not a multiple of dapo.updates_per_generation={updates}: "
                            "the last rollout batch would be only partly used")
    return BatchPlan(world_size=world_size, prompts_per_step=prompts, prompts_per_process=prompts // world_size,
                     generations_per_prompt=gens, sequences_per_process=per_process, micro_batch_size=micro,
                     gradient_accumulation_steps=per_update // micro, updates_per_generation=updates,
                     sequences_per_update=per_update * world_size, steps=dapo.steps,
                     rollout_batches=dapo.steps // updates, model_dtype=model_dtype, device=device,
                     generation="vllm-server" if dapo.use_vllm else "transformers", lora=lora,
                     gradient_checkpointing=gradient_checkpointing, deepspeed=deepspeed)
