"""One typed config for the whole training run; JSON files, ``--set a.b=value`` overrides and
papermill parameters all map onto it (TRL-style: config here, trainers in their own modules)."""
from __future__ import annotations

import dataclasses
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kunlunlab.agent.rdra import RDRAConfig
from kunlunlab.agent.stie import STIEConfig
from kunlunlab.training.mixing import MixingConfig
from kunlunlab.training.rewards import RewardConfig

AGENT_METHODS = ("kunlun", "agent")


@dataclass
class SFTStageConfig:
    """Stage 1, format cold start (TRL ``SFTTrainer``)."""

    enabled: bool = True
    learning_rate: float = 1e-4
    batch_size: int = 4
    grad_accum: int = 1
    warmup_ratio: float = 0.05
    train_layers: int | None = None  # train only the top N decoder layers (None: all); embeddings stay frozen
    max_length: int = 1024
    max_steps: int = -1              # -1: one pass over the mixed epochs, in schedule order
    save_steps: int = 10
    logging_steps: int = 1


@dataclass
class DAPOStageConfig:
    """Stage 2, DAPO (TRL ``GRPOTrainer`` with ``loss_type="dapo"``) over rollouts of the shared engine."""

    enabled: bool = True
    steps: int = 8
    prompts_per_step: int = 2
    num_generations: int = 4
    learning_rate: float = 5e-6
    epsilon: float = 0.2             # clip low
    epsilon_high: float = 0.28       # clip-higher (DAPO)
    beta: float = 0.0                # no KL term (DAPO)
    temperature: float = 1.0
    top_p: float = 1.0
    dynamic_sampling: bool = True    # groups with all-equal accuracy are replaced by informative groups (refill)
    max_resample: int = 1            # refill rounds per step
    max_turn_tokens: int = 96
    max_total_tokens: int = 768
    save_steps: int = 2
    logging_steps: int = 1
    use_vllm: bool = False           # multi-GPU: generation on TRL's vLLM (see experiments/configs)
    vllm_mode: str = "server"


@dataclass
class AgentSpec:
    """The agent that is trained and evaluated. ``kunlun``: RDRA background (§2.1) in every prompt of the
    training data, the rollouts and the evaluation, and STIE (§2.2) over the answer rounds; ``agent``: the
    search-think protocol alone (the ablation)."""

    method: str = "kunlun"
    rdra: RDRAConfig = field(default_factory=RDRAConfig)
    stie: STIEConfig = field(default_factory=STIEConfig)

    def __post_init__(self):
        if self.method not in AGENT_METHODS:
            raise ValueError(f"agent.method must be one of {AGENT_METHODS}, got {self.method!r}")

    @property
    def whole(self) -> bool:
        return self.method == "kunlun"


@dataclass
class EvalSpec:
    method: str = "kunlun"           # the inference pipeline measured before and after training
    world_questions: int = 40        # held-out synthetic questions (never in the training set)
    hotpot_questions: int = 20       # held-out HotpotQA distractor questions (0: skip)
    batch_size: int = 20
    max_total_tokens: int = 768
    max_turn_tokens: int = 96


@dataclass
class TrainConfig:
    model: str | None = None         # None: the embedded SmolLM2-135M-Instruct; hub id or local path
    world_passages: int = 2000
    world_seed: int = 0
    train_questions: int = 400
    question_seed: int = 1
    heldout_seed: int = 2
    index_kind: str = "flat"
    embedder: str | None = None
    top_k: int = 2                   # passages per query, in training data and rollouts alike
    max_result_chars: int = 300
    hotpot: bool = True              # add HotpotQA distractor trajectories (when the data folder is present)
    hotpot_train_fraction: float = 0.5  # the first half trains, the rest is held out for evaluation
    threads: int | None = None
    seed: int = 0
    bf16: bool = False
    gradient_checkpointing: bool = False
    deepspeed: str | None = None     # a DeepSpeed JSON config (multi-GPU); launched through accelerate
    agent: AgentSpec = field(default_factory=AgentSpec)
    mixing: MixingConfig = field(default_factory=MixingConfig)
    rewards: RewardConfig = field(default_factory=RewardConfig)
    sft: SFTStageConfig = field(default_factory=SFTStageConfig)
    dapo: DAPOStageConfig = field(default_factory=DAPOStageConfig)
    eval: EvalSpec = field(default_factory=EvalSpec)

    def to_dict(self) -> dict:
        return asdict(self)


def _build(cls, data: dict, where: str):
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected an object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(fields)
    if unknown:
        raise ValueError(f"{where}: unknown keys {sorted(unknown)}; known: {sorted(fields)}")
    kwargs = {}
    for name, value in data.items():
        sub = fields[name].default_factory if fields[name].default_factory is not dataclasses.MISSING else None
        if sub is not None and dataclasses.is_dataclass(sub):
            kwargs[name] = _build(sub, value, f"{where}.{name}")
        else:
            kwargs[name] = tuple(value) if name == "noise_kinds" else value
    return cls(**kwargs)


def config_from_dict(data: dict, where: str = "config") -> TrainConfig:
    return _build(TrainConfig, data, where)


def _parse_value(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def apply_overrides(data: dict, overrides: dict | list[str] | None) -> dict:
    """``{"sft.learning_rate": 1e-4}`` or ``["sft.learning_rate=1e-4"]`` onto a nested config dict."""
    if not overrides:
        return data
    if isinstance(overrides, list):
        pairs = {}
        for item in overrides:
            if "=" not in item:
                raise ValueError(f"override {item!r} must look like key.path=value")
            key, value = item.split("=", 1)
            pairs[key] = _parse_value(value)
        overrides = pairs
    for key, value in overrides.items():
        node = data
        parts = key.split(".")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return data


def load_config(path: str | Path | None = None, overrides: dict | list[str] | None = None) -> TrainConfig:
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"training config not found: {path}")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: invalid JSON: {err}") from err
        data.pop("_comment", None)
    return config_from_dict(apply_overrides(data, overrides), str(path or "config"))
