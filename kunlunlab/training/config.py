"""One typed config for the whole training run; JSON files, ``--set a.b=value`` overrides and
papermill parameters all map onto it (TRL-style: config here, trainers in their own modules)."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from kunlunlab.agent.rdra import RDRAConfig
from kunlunlab.configs import apply_overrides, build_dataclass, read_config_file
from kunlunlab.agent.stie import STIEConfig
from kunlunlab.training.dpo import DPOStageConfig
from kunlunlab.training.mixing import MixingConfig
from kunlunlab.training.process_rewards import MCTSConfig
from kunlunlab.training.rewards import RewardConfig

AGENT_METHODS = ("kunlun", "agent")


@dataclass
class SFTStageConfig:
    """Stage 1, format cold start (TRL ``SFTTrainer``)."""

    enabled: bool = True
    learning_rate: float = 3e-4      # measured: 3e-4 vs 1e-4 took held-out EM after SFT from 15 to 32.5 (embedded model)
    batch_size: int = 4
    grad_accum: int = 1
    warmup_ratio: float = 0.05
    train_layers: int | None = None  # train only the top N decoder layers (None: all); embeddings stay frozen
    max_length: int = 1280           # whole-agent samples (RDRA background + 4-hop chains) reach ~1.2k tokens
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
    flat_includes_budget: bool = False  # with rewards.w_budget > 0: equal accuracy but unequal budget is informative
    max_turn_tokens: int = 160       # training turns reach 124 tokens (two facts + two next queries); 96 cut them
    max_total_tokens: int = 1024     # lets 4-hop bridge comparisons finish
    save_steps: int = 2
    logging_steps: int = 1
    use_vllm: bool = False           # multi-GPU: generation on TRL's vLLM (see experiments/configs)
    vllm_mode: str = "server"


@dataclass
class PRLStageConfig:
    """Optional stage between SFT and DAPO: ReasonRAG's process supervision (arXiv 2505.14069) — MCTS over
    the SFT model's steps on ``questions`` training questions, SPRE step values, step preference pairs,
    DPO through TRL (``kunlunlab/training/process_rewards.py``, ``kunlunlab/training/dpo.py``). Off by
    default: KunLunBaizeRAG's stage 2 is DAPO; turn DAPO off (``dapo.enabled=false``) to train with
    ReasonRAG's recipe alone."""

    enabled: bool = False
    questions: int = 16
    mcts: MCTSConfig = field(default_factory=MCTSConfig)
    dpo: DPOStageConfig = field(default_factory=DPOStageConfig)


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
    before: bool = True              # False: skip the evaluation before training (a variant of a measured run)
    world_questions: int = 40        # held-out synthetic questions (never in the training set)
    hotpot_questions: int = 20       # held-out HotpotQA distractor questions (0: skip)
    batch_size: int = 20
    max_total_tokens: int = 1024     # the same budgets as the DAPO rollouts
    max_turn_tokens: int = 160


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
    top_k: int = 1                   # passages per query, in training data and rollouts alike; measured: recall@1
                                     # of the world's hop queries is 97 % (99 % at 2) and samples are ~20 % shorter
    max_result_chars: int = 300
    hotpot: bool = True              # add HotpotQA distractor trajectories (when the data folder is present)
    hotpot_train_fraction: float = 0.5  # the first half trains, the rest is held out for evaluation
    twowiki: bool = False            # add 2Wiki dev questions with silver evidence chains in the 2Wiki corpus
                                     # (kunlunlab.data.evidence; mixing.twowiki_share of each epoch)
    twowiki_heldout: int = 100       # the first N 2Wiki dev questions (what evaluations read) are never trained on
    threads: int | None = None
    seed: int = 0
    bf16: bool | str = False         # bf16 autocast in training; "auto": where the hardware has native bf16
    inference_dtype: str = "auto"    # rollouts and evaluations generate in it (auto: bfloat16 on AMX/AVX512-BF16 CPUs)
    gradient_checkpointing: bool = False
    deepspeed: str | None = None     # a DeepSpeed JSON config (multi-GPU); launched through accelerate
    agent: AgentSpec = field(default_factory=AgentSpec)
    mixing: MixingConfig = field(default_factory=MixingConfig)
    rewards: RewardConfig = field(default_factory=RewardConfig)
    sft: SFTStageConfig = field(default_factory=SFTStageConfig)
    prl: PRLStageConfig = field(default_factory=PRLStageConfig)
    dapo: DAPOStageConfig = field(default_factory=DAPOStageConfig)
    eval: EvalSpec = field(default_factory=EvalSpec)

    def __post_init__(self):
        if not isinstance(self.bf16, bool) and self.bf16 != "auto":
            raise ValueError(f"bf16 must be true, false or \"auto\", got {self.bf16!r}")

    def to_dict(self) -> dict:
        return asdict(self)


def config_from_dict(data: dict, where: str = "config") -> TrainConfig:
    return build_dataclass(TrainConfig, data, where)


def load_config(path: str | Path | None = None, overrides: dict | list[str] | None = None) -> TrainConfig:
    data = read_config_file(path, "training config") if path is not None else {}
    return config_from_dict(apply_overrides(data, overrides), str(path or "config"))
