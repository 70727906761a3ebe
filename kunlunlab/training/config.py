"""One typed config for the whole training run; JSON files, ``--set a.b=value`` overrides and
papermill parameters all map onto it (TRL-style: config here, trainers in their own modules).

Each value is defined in one place. Keys that moved (:data:`MOVED_KEYS`) are still read, so every kept run
record's ``train_config.json`` loads, with one warning line. Fields that the chosen settings make inert
(:data:`INERT_WHEN`) are named in one warning line when :func:`load_config` reads them."""
from __future__ import annotations

import copy
import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from kunlunlab.agent.methods import METHODS, PEER_METHODS
from kunlunlab.agent.protocols import NamesView, get_protocol
from kunlunlab.agent.rdra import RDRAConfig
from kunlunlab.data.splits import Splits
from kunlunlab.configs import (apply_overrides, build_dataclass, choice, leaf_paths, leaf_values, non_negative, positive,
                               positive_or, probability, read_config_file, within)
from kunlunlab.agent.stie import STIEConfig
from kunlunlab.models import INFERENCE_DTYPES
from kunlunlab.retrieval.retriever import INDEX_KINDS
from kunlunlab.training.dpo import DPOStageConfig
from kunlunlab.training.mixing import MixingConfig
from kunlunlab.training.process_rewards import MCTSConfig
from kunlunlab.training.rewards import RewardConfig

log = logging.getLogger(__name__)

# what trains: the whole method, its plain agent, the peers' agents (every peer protocol registered, read when checked)
AGENT_METHODS = NamesView(lambda: ("kunlun", "agent", *PEER_METHODS))
# The RL stage's loss types, as TRL 1.16's GRPOConfig.loss_type documents them (tests/training/test_rl_algorithms.py
# checks the list against the installed TRL); GSPO is loss_type "grpo" with importance_sampling_level "sequence"
LOSS_TYPES = ("grpo", "dr_grpo", "dapo", "bnpo", "cispo", "sapo", "luspo", "vespo")
TRACKERS = ("tensorboard", "wandb")
MODEL_DTYPES = ("auto", "float32", "bfloat16", "float16")
OWN_PROCESS_STAGES = ("sft", "prl", "dapo")  # the training stages, in the order they run; each can run in a child process
# How a run uses the machine, not what it trains: which process trains a stage, and how often a stage writes a
# checkpoint to resume from (a checkpoint of the embedded model, weights and Adam state, costs ~6 s on 2 cores).
# A run folder resumes under other values of these.
PROCESS_ONLY_FIELDS = ("own_process_stages", "sft.save_steps", "dapo.save_steps", "prl.dpo.save_steps")


@dataclass
class SFTStageConfig:
    """Stage 1, format cold start (TRL ``SFTTrainer``)."""

    enabled: bool = True
    learning_rate: float = positive(3e-4)  # measured: 3e-4 vs 1e-4 took held-out EM after SFT from 15 to 32.5 (embedded model)
    batch_size: int = positive(4)    # sequences per device and accumulation step, batched by similar length
    grad_accum: int = positive(1)
    micro_batch_size: int | None = positive(None)  # sequences per forward/backward (None: batch_size); a divisor of
                                     # batch_size fed as gradient accumulation, so an optimizer step sees the same
                                     # sequences and the same token-mean loss at a fraction of the peak memory
    warmup_ratio: float = probability(0.05)
    train_layers: int | None = positive(None)  # train only the top N decoder layers (None: all); embeddings stay frozen
    max_length: int = positive(1280)  # whole-agent samples (RDRA background + 4-hop chains) reach ~1.2k tokens
    max_steps: int = positive_or(-1, -1)  # -1: one pass over the mixed epochs, in schedule order
    save_steps: int = positive(10)
    logging_steps: int = positive(1)

    def __post_init__(self):
        micro = self.micro_batch_size
        if micro is not None and (micro < 1 or self.batch_size % micro):
            raise ValueError(f"sft.micro_batch_size={micro} must be a positive divisor of sft.batch_size={self.batch_size}")

    @property
    def forward_batch_size(self) -> int:
        """Sequences per forward/backward: the micro-batch, else the whole batch."""
        return self.micro_batch_size or self.batch_size

    @property
    def accumulation_steps(self) -> int:
        """Forward/backward passes per optimizer step: ``grad_accum`` batches, each in micro-batches."""
        return self.grad_accum * (self.batch_size // self.forward_batch_size)


@dataclass
class DAPOStageConfig:
    """Stage 2, DAPO (TRL ``GRPOTrainer`` with ``loss_type="dapo"``) over rollouts of the shared engine."""

    enabled: bool = True
    steps: int = positive(8)         # optimizer updates (TRL's max_steps); rollout calls = steps / updates_per_generation
    prompts_per_step: int = positive(2)  # questions per rollout batch, all training processes together
    num_generations: int = positive(4)
    micro_batch_size: int | None = positive(None)  # sequences per forward/backward on one device (None: a whole update's)
    updates_per_generation: int = positive(1)  # optimizer updates per rollout batch; >= 2 lets the importance ratio move so
                                     # clip-higher can bind (kunlunlab.training.geometry)
    learning_rate: float = positive(5e-6)
    # The RL algorithm, a knob (defaults: DAPO, Yu et al. 2025). DAPO's four parts, each switchable on its own:
    # clip-higher (epsilon_high > epsilon; = epsilon switches it off), dynamic sampling (dynamic_sampling), overlong
    # shaping (rewards.overlong_shaping) and the token-level loss (loss_type "dapo"; "grpo" averages per sequence)
    loss_type: str = choice("dapo", LOSS_TYPES)
    importance_sampling_level: str = choice("token", ("token", "sequence"))  # "sequence" + loss_type "grpo": GSPO
    scale_rewards: str = choice("group", ("group", "batch", "none"))  # advantage scaling: group std (GRPO, DAPO),
                                     # batch std (REINFORCE++'s global normalisation), none (Dr. GRPO)
    epsilon: float = non_negative(0.2)  # clip low
    epsilon_high: float = non_negative(0.28)  # clip-higher (DAPO)
    beta: float = non_negative(0.0)  # no KL term (DAPO); GRPO / Search-R1 / ReSearch: 0.001
    temperature: float = positive(1.0)
    top_p: float = within(1.0, 0, 1, low_open=True)
    dynamic_sampling: bool = True    # groups with all-equal accuracy are replaced by informative groups (refill)
    max_resample: int = non_negative(1)  # refill rounds per step
    max_rollouts: int | None = positive(None)  # a comparison's rollout budget: rollouts generated in the stage,
                                     # dynamic sampling's refills included; the stage ends before a rollout call
                                     # it cannot pay for (None: steps alone bound it)
    flat_includes_budget: bool = False  # with rewards.w_budget > 0: equal accuracy but unequal budget is informative
    max_turn_tokens: int = positive(160)  # training turns reach 124 tokens (two facts + two next queries); 96 cut them
    max_total_tokens: int = positive(1024)  # lets 4-hop bridge comparisons finish
    save_steps: int = positive(2)
    logging_steps: int = positive(1)
    use_vllm: bool = False           # multi-GPU: generation on TRL's vLLM (see experiments/configs)
    vllm_mode: str = choice("server", ("server", "colocate"))
    vllm_server_url: str | None = None  # the `trl vllm-serve` address (None: TRL's default host and port, 8000)


@dataclass
class LoRAConfig:
    """Low-rank adapters through peft (TRL's ``peft_config``) for SFT, PRL's DPO and DAPO: a 7B model then trains
    on one 80 GB GPU. Each stage trains a fresh adapter on the previous stage's weights and merges it into them
    when it finishes, so every ``<stage>/final`` is a whole model that ``kunlunlab eval --model`` reads."""

    enabled: bool = False
    r: int = positive(16)
    alpha: int = positive(32)
    dropout: float = probability(0.05, high_open=True)
    target_modules: list[str] | str = "all-linear"

    def peft_config(self):
        """The ``peft.LoraConfig`` of these settings, or None when LoRA is off."""
        if not self.enabled:
            return None
        from peft import LoraConfig  # deferred: peft is needed only when LoRA is on

        return LoraConfig(r=self.r, lora_alpha=self.alpha, lora_dropout=self.dropout,
                          target_modules=self.target_modules, task_type="CAUSAL_LM")


@dataclass
class RetrievalSource:
    """Where the real data's searches go (HotpotQA/2Wiki SFT trajectories, real RL prompts' rollouts, their
    held-out evaluation): a retrieval service (``url``: Search-R1's ``POST /retrieve``, which ``kunlunlab
    serve-retriever`` speaks; every training process uses the one service) or a saved index folder
    (``index_dir``: what ``kunlunlab build-index`` writes, loaded without embedding its corpus). Neither: each
    real corpus is indexed in process, as before. A service that stays down after ``attempts`` tries
    (exponential ``backoff`` seconds, ``timeout`` each) stops training with one line naming it. The synthetic
    world keeps its own in-process index (``index_kind``): its passages are in no external corpus."""

    url: str | None = None
    index_dir: str | None = None
    attempts: int = positive(5)
    backoff: float = non_negative(1.0)
    timeout: float = positive(60.0)

    def __post_init__(self):
        if self.url and self.index_dir:
            raise ValueError("retrieval: set url or index_dir, not both")
        if self.attempts < 1:
            raise ValueError(f"retrieval.attempts must be at least 1, got {self.attempts}")

    @property
    def configured(self) -> bool:
        return bool(self.url or self.index_dir)


@dataclass
class DataSpec:
    """Real QA data beside the synthetic world. ``rl_prompts``: a Search-R1/veRL train file (parquet or jsonl:
    ``prompt``, ``reward_model.ground_truth``) or any layout :func:`~kunlunlab.data.loaders.load_qa` reads
    (FlashRAG jsonl ``golden_answers``, HotpotQA JSON); answers come from the layout's own field. Its first
    ``rl_heldout`` questions are held out for evaluation (never trained on), the rest are DAPO prompts:
    ``rl_prompts_share`` of the prompt pool (1.0 replaces the world's questions; 0.5 mixes them one to one).
    ``sft_share``: share of each SFT epoch written from its questions that carry gold supporting titles and
    their paragraphs (HotpotQA layout), searched through ``retrieval``."""

    rl_prompts: str | None = None
    rl_prompts_limit: int | None = positive(None)  # read the first N questions of the file (None: all)
    rl_heldout: int = non_negative(20)
    rl_prompts_share: float = probability(1.0)
    sft_share: float = probability(0.0)

    def __post_init__(self):
        for name in ("rl_prompts_share", "sft_share"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"data.{name} must lie in [0, 1], got {getattr(self, name)}")
        if self.rl_heldout < 0:
            raise ValueError(f"data.rl_heldout must be at least 0, got {self.rl_heldout}")


@dataclass
class PRLStageConfig:
    """Optional stage between SFT and DAPO: ReasonRAG's process supervision (arXiv 2505.14069) — MCTS over
    the SFT model's steps on ``questions`` training questions, SPRE step values, step preference pairs,
    DPO through TRL (``kunlunlab/training/process_rewards.py``, ``kunlunlab/training/preferences.py``,
    ``kunlunlab/training/dpo.py``). Off by default: KunLunBaizeRAG's stage 2 is DAPO; turn DAPO off
    (``dapo.enabled=false``) to train with ReasonRAG's recipe alone."""

    enabled: bool = False
    questions: int = positive(16)
    mcts: MCTSConfig = field(default_factory=MCTSConfig)
    dpo: DPOStageConfig = field(default_factory=DPOStageConfig)


@dataclass
class AgentSpec:
    """The agent that is trained and evaluated. ``kunlun``: RDRA background (§2.1) in every prompt of the
    training data, the rollouts and the evaluation, and STIE (§2.2) over the answer rounds; ``agent``: the
    search-think protocol alone (the ablation); ``search_r1``, ``research``, ``r1_searcher``: a peer's agent in its
    own protocol (:mod:`kunlunlab.agent.protocols`), its SFT data rendered in it (:mod:`kunlunlab.training.peer_data`);
    the peer recipes are experiments/configs/training/peers/*.json."""

    method: str = choice("kunlun", AGENT_METHODS)
    rdra: RDRAConfig = field(default_factory=RDRAConfig)
    stie: STIEConfig = field(default_factory=STIEConfig)

    def __post_init__(self):
        if self.method not in AGENT_METHODS:
            raise ValueError(f"agent.method must be one of {AGENT_METHODS}, got {self.method!r}")

    @property
    def whole(self) -> bool:
        return self.method == "kunlun"

    @property
    def protocol(self) -> str:
        """The agent protocol its data, rollouts and evaluation speak: its method's (a peer's agent: the peer's own)."""
        return METHODS[self.method].protocol


@dataclass
class EvalSpec:
    method: str = choice("kunlun", METHODS)  # the inference pipeline measured before and after training
    before: bool = True              # False: skip the evaluation before training (a variant of a measured run)
    after_sft: bool = False          # also evaluate between SFT and RL (tag "sft"): RL's own effect, paired on the
                                     # same questions as the evaluation after training
    world_questions: int = positive(40)  # held-out synthetic questions (never in the training set); at least one:
                                     # the training summary and the comparison tables read them
    hotpot_questions: int = non_negative(20)  # held-out HotpotQA distractor questions (0: skip)
    summary_questions: int = non_negative(20)  # held-out summary-oriented world questions (0: skip)
    batch_size: int = positive(20)
    max_total_tokens: int = positive(1024)  # the same budgets as the DAPO rollouts
    max_turn_tokens: int = positive(160)


@dataclass
class TrainConfig:
    model: str | None = None         # None: the embedded SmolLM2-135M-Instruct; hub id or local path
    world_passages: int = positive(2000)
    world_seed: int = non_negative(0)
    train_questions: int = non_negative(400)
    summary_share: float = probability(0.1, high_open=True)  # summary-oriented questions ("Describe how X is connected to Y.", the long-answer
                                     # mode, §2.3 eq. 18) added beside the train_questions factoid ones, to make this
                                     # share of the world's training questions: in the SFT mix and DAPO's prompts
    question_seed: int = non_negative(1)
    heldout_seed: int = non_negative(2)
    index_kind: str = choice("flat", INDEX_KINDS)
    embedder: str | None = None
    top_k: int | None = positive(1)  # passages per query, in training data, rollouts and evaluation alike; measured:
                                     # recall@1 of the world's hop queries is 97 % (99 % at 2) and samples are ~20 %
                                     # shorter; a comparison's budget for every arm (null: the protocol's own top-k)
    max_searches: int | None = non_negative(None)  # searches per question in rollouts and evaluation; None: the
                                     # protocol's own (AgentProtocol.max_searches); a number: a comparison's budget,
                                     # the same for every arm
    max_result_chars: int = positive(300)
    hotpot: bool = True              # add HotpotQA distractor trajectories (when the data folder is present)
    hotpot_train_fraction: float = probability(0.5)  # the first half trains, the rest is held out for evaluation
    twowiki: bool = False            # add 2Wiki dev questions with silver evidence chains in the 2Wiki corpus
                                     # (kunlunlab.data.evidence; mixing.twowiki_share of each epoch)
    twowiki_heldout: int = non_negative(100)  # the first N 2Wiki dev questions (what evaluations read) are never trained on
    threads: int | None = positive(None)
    heap_keep_gb: float = non_negative(1.0)  # on a CPU: TRL's LM-head tiles taken from the heap, and up to this many
                                     # GB of freed memory kept at its top for the next step's (kunlunlab/training/
                                     # cpu_heap.py); 0: malloc left as it is
    own_process_stages: list[str] = field(default_factory=list)  # training stages (sft, prl, dapo) that run each
                                     # in a child process which returns its whole heap when it exits; the run reads
                                     # the stage's final model back (kunlunlab/training/own_process.py); one
                                     # process only (no accelerate), no trainer callbacks from the caller
    seed: int = non_negative(0)
    bf16: bool | Literal["auto"] = False  # bf16 autocast in training; "auto": where the hardware has native bf16
    device: str = "auto"             # where the model lives: auto (CUDA when present; under accelerate this
                                     # process's GPU), cpu, cuda, cuda:N
    model_dtype: str = choice("auto", MODEL_DTYPES)  # the weights' dtype: auto (bfloat16 on a GPU with bf16, float32 elsewhere)
    inference_dtype: str = choice("auto", INFERENCE_DTYPES)  # rollouts and evaluations generate in it (auto: bfloat16 on AMX/AVX512-BF16 CPUs)
    gradient_checkpointing: bool = False
    deepspeed: str | None = None     # a DeepSpeed JSON config (multi-GPU); launched through accelerate
    report_to: list[str] | str = field(default_factory=list)  # TRL trainers' trackers: tensorboard, wandb (offline);
                                     # event files go to <run>/<stage>/runs; the jsonl logs are kept either way
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    retrieval: RetrievalSource = field(default_factory=RetrievalSource)
    data: DataSpec = field(default_factory=DataSpec)
    agent: AgentSpec = field(default_factory=AgentSpec)
    mixing: MixingConfig = field(default_factory=MixingConfig)
    rewards: RewardConfig = field(default_factory=RewardConfig)
    sft: SFTStageConfig = field(default_factory=SFTStageConfig)
    prl: PRLStageConfig = field(default_factory=PRLStageConfig)
    dapo: DAPOStageConfig = field(default_factory=DAPOStageConfig)
    eval: EvalSpec = field(default_factory=EvalSpec)

    def __post_init__(self):
        if not 0.0 <= self.summary_share < 1.0:
            raise ValueError(f"summary_share must lie in [0, 1), got {self.summary_share}")
        if not isinstance(self.bf16, bool) and self.bf16 != "auto":
            raise ValueError(f"bf16 must be true, false or \"auto\", got {self.bf16!r}")
        if isinstance(self.report_to, str):  # --set report_to=tensorboard
            self.report_to = [] if self.report_to in ("", "none") else [t for t in self.report_to.split(",") if t]
        unknown = sorted(set(self.report_to) - set(TRACKERS))
        if unknown:
            raise ValueError(f"report_to: unknown tracker(s) {unknown}; choose from {list(TRACKERS)}")
        unknown = sorted(set(self.own_process_stages) - set(OWN_PROCESS_STAGES))
        if unknown:
            raise ValueError(f"own_process_stages: unknown stage(s) {unknown}; choose from {list(OWN_PROCESS_STAGES)}")
        if self.model_dtype not in MODEL_DTYPES:
            raise ValueError(f"model_dtype must be one of {MODEL_DTYPES}, got {self.model_dtype!r}")
        if not (self.device in ("auto", "cpu", "cuda") or self.device.startswith("cuda:")):
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {self.device!r}")
        if self.agent.method in PEER_METHODS and self.eval.method != self.agent.method:
            # a peer's agent speaks only its own protocol: evaluated as anything else it never closes a tag
            raise ValueError(f"agent.method={self.agent.method} trains {self.agent.method}'s protocol: set "
                             f"eval.method={self.agent.method} (got {self.eval.method!r})")
        protocol = get_protocol(self.agent.protocol)
        kinds = (*(("kunlun",) if protocol.answer_modes else ()), *protocol.reward_kinds)
        if self.rewards.kind not in kinds:
            # each reward reads one protocol's tags: any other protocol scores 0 on every sample (the dual-mode
            # reward, kind kunlun, reads this project's answer modes)
            raise ValueError(f"rewards.kind={self.rewards.kind} does not read agent.method={self.agent.method}'s "
                             f"protocol ({protocol.name}): it takes rewards.kind {' or '.join(kinds)} (the kunlun "
                             "and agent methods take kunlun, a peer's agent its own reward)")

    @property
    def passages_per_search(self) -> int:
        """The top-k every stage of this run uses: ``top_k``, else the agent protocol's declared one."""
        return get_protocol(self.agent.protocol).passages_per_search(self.top_k)

    def search_limit(self, token_budget: int) -> int:
        """The searches per question of a rollout with ``token_budget`` tokens: ``max_searches``, else the agent
        protocol's declared limit (:meth:`~kunlunlab.agent.protocols.AgentProtocol.search_limit`)."""
        return get_protocol(self.agent.protocol).search_limit(self.max_searches, token_budget)

    def splits(self, world_heldout: int | None = None, hotpot_heldout: int | None = None,
               summary_heldout: int | None = None) -> Splits:
        """The questions this config trains on and holds out (:mod:`kunlunlab.data.splits`); an evaluation may
        ask for other held-out counts, which draws from the same pools (the training questions stay out)."""
        return Splits(world_passages=self.world_passages, world_seed=self.world_seed,
                      train_questions=self.train_questions, summary_share=self.summary_share,
                      summary_heldout=self.eval.summary_questions if summary_heldout is None else summary_heldout,
                      question_seed=self.question_seed,
                      heldout_seed=self.heldout_seed,
                      world_heldout=self.eval.world_questions if world_heldout is None else world_heldout,
                      hotpot=self.hotpot, hotpot_train_fraction=self.hotpot_train_fraction,
                      hotpot_heldout=self.eval.hotpot_questions if hotpot_heldout is None else hotpot_heldout,
                      twowiki=self.twowiki, twowiki_heldout=self.twowiki_heldout, rl_prompts=self.data.rl_prompts,
                      rl_prompts_limit=self.data.rl_prompts_limit, rl_heldout=self.data.rl_heldout)

    def to_dict(self) -> dict:
        return asdict(self)


# Keys that moved: MixingConfig kept copies of the run's retrieval sizes and seed, which the run always
# overwrote with its own, so a value set there never had an effect. Old path -> the field that sets it.
MOVED_KEYS = {"mixing.top_k": "top_k", "mixing.max_result_chars": "max_result_chars", "mixing.seed": "seed"}

# (the setting, whether the config has it, the fields it makes inert): a field listed here has no effect on
# training or evaluation while its setting holds. A stage switched off (sft/prl/dapo.enabled, lora.enabled
# false) is not listed: its whole section is off by name. Plan-free RDRA never runs eqs. 2-3 and D_1 fills
# every background slot (kunlunlab.agent.rdra.joint_context); with LoRA peft trains the adapters alone.
INERT_WHEN = (
    ("agent.rdra.use_plan=false", lambda c: not c.agent.rdra.use_plan,
     ("agent.rdra.plan_k", "agent.rdra.plan_tokens", "agent.rdra.max_plan_queries",
      "agent.rdra.query_whole_plan", "agent.rdra.background_share", "mixing.plan_samples")),
    ("lora.enabled=true", lambda c: c.lora.enabled, ("sft.train_layers",)),
    ("mixing.rdra_background=false", lambda c: not c.mixing.rdra_background, ("mixing.background_facts",)),
    ("mixing.stie_feedback_share=0", lambda c: c.mixing.stie_feedback_share == 0, ("mixing.stie_wrong_first",)),
    ("dapo.use_vllm=false", lambda c: not c.dapo.use_vllm, ("dapo.vllm_mode", "dapo.vllm_server_url")),
    ("hotpot=false", lambda c: not c.hotpot,
     ("hotpot_train_fraction", "mixing.hotpot_share", "eval.hotpot_questions")),
    ("twowiki=false", lambda c: not c.twowiki, ("twowiki_heldout", "mixing.twowiki_share")),
    ("no data.rl_prompts", lambda c: not c.data.rl_prompts,
     ("data.rl_prompts_limit", "data.rl_heldout", "data.rl_prompts_share", "data.sft_share")),
    ("no retrieval.url or index_dir", lambda c: not c.retrieval.configured,
     ("retrieval.attempts", "retrieval.backoff", "retrieval.timeout")),
)


def _values(cfg: TrainConfig) -> dict:
    """``cfg``'s values by dotted path, as its JSON file holds them (tuples as lists)."""
    return leaf_values(json.loads(json.dumps(cfg.to_dict())))


def inert_fields(cfg: TrainConfig) -> dict[str, str]:
    """Every field the settings of ``cfg`` make inert (dotted path -> the setting that does)."""
    return {path: setting for setting, holds, paths in INERT_WHEN if holds(cfg) for path in paths}


def effective_settings(cfg: TrainConfig) -> dict:
    """``cfg``'s values by dotted path, less the fields its settings make inert and those that say only how a
    run uses the machine (:data:`PROCESS_ONLY_FIELDS`): two configs with the same effective settings train and
    evaluate alike."""
    inert = inert_fields(cfg)
    return {path: value for path, value in _values(cfg).items() if path not in inert and path not in PROCESS_ONLY_FIELDS}


def drop_moved_keys(data: dict) -> tuple[dict, list[str]]:
    """``data`` without :data:`MOVED_KEYS` (a copy; ``data`` is left as it is) and the moved keys it held."""
    found = [key for key in MOVED_KEYS if key in leaf_paths(data)]
    if not found:
        return data, []
    data = copy.deepcopy(data)
    for key in found:
        section, name = key.split(".")
        del data[section][name]
    return data, found


def config_from_dict(data: dict, where: str = "config") -> TrainConfig:
    """A TrainConfig from a plain dict. A moved key (:data:`MOVED_KEYS`, as every run record written before
    the move holds) is dropped with one warning line naming it and where its value comes from; its value
    had no effect then either."""
    data, moved = drop_moved_keys(data)
    if moved:
        log.warning("%s: %s moved to %s; the value given here is ignored (as it always was: the run's own "
                    "value applied)", where, ", ".join(moved), ", ".join(MOVED_KEYS[k] for k in moved))
    return build_dataclass(TrainConfig, data, where)


def set_inert_fields(cfg: TrainConfig, data: dict) -> list[str]:
    """The fields ``data`` (a config file with its overrides) sets to a value other than the default that
    ``cfg``'s settings make inert. A default value is not counted: left in place (as in a run's own
    ``train_config.json``, which lists every field) it changes nothing either way."""
    inert = inert_fields(cfg)
    resolved, default = _values(cfg), _values(TrainConfig())
    return [path for path in sorted(leaf_paths(data)) if path in inert and resolved[path] != default[path]]


def load_config(path: str | Path | None = None, overrides: dict | list[str] | None = None) -> TrainConfig:
    """The config of a JSON file (None: the defaults) with ``overrides``; fields it sets that its own
    settings make inert are named in one warning line."""
    data = read_config_file(path, "training config") if path is not None else {}
    data = apply_overrides(data, overrides)
    where = str(path or "config")
    cfg = config_from_dict(data, where)
    inert = set_inert_fields(cfg, data)
    if inert:
        reasons = inert_fields(cfg)
        by_setting = {reasons[path]: [] for path in inert}
        for path in inert:
            by_setting[reasons[path]].append(path)
        log.warning("%s: set but inert, without effect: %s", where,
                    "; ".join(f"{', '.join(paths)} (with {setting})" for setting, paths in by_setting.items()))
    return cfg
