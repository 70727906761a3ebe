"""The RL stage's algorithm is a knob: every loss type the pinned TRL offers, GSPO through sequence-level importance
sampling, the advantage scaling, and DAPO's four parts each switchable (clip-higher, dynamic sampling, overlong
shaping, the token-level loss); the reward a peer's recipe optimises (Search-R1, ReSearch, R1-Searcher's two stages)."""
import dataclasses
import re
from types import SimpleNamespace

import pytest
from trl import GRPOConfig

from kunlunlab.configs import apply_overrides, build_dataclass
from kunlunlab.training.config import LOSS_TYPES, PROCESS_ONLY_FIELDS, DAPOStageConfig, TrainConfig, load_config
from kunlunlab.training.dapo import grpo_args
from kunlunlab.training.rewards import RewardConfig, reward_functions


def test_the_loss_types_are_the_ones_the_installed_trl_documents():
    help_text = next(f for f in dataclasses.fields(GRPOConfig) if f.name == "loss_type").metadata["help"]
    supported = help_text.split("Supported values are", 1)[1].split(".", 1)[0]  # "'grpo', ..., and 'vespo'"
    documented = set(re.findall(r"'([a-z_]+)'", supported))
    assert set(LOSS_TYPES) == documented


@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_reaches_trl_s_arguments(loss_type, tmp_path):
    level = "sequence" if loss_type == "luspo" else "token"  # LUSPO is sequence-level by construction
    args = grpo_args(DAPOStageConfig(loss_type=loss_type, importance_sampling_level=level), RewardConfig(), tmp_path,
                     0, world_size=1)
    assert (args.loss_type, args.importance_sampling_level) == (loss_type, level)


def test_gspo_and_the_advantage_scaling_are_one_set_each(tmp_path):
    cfg = load_config(None, ["dapo.loss_type=grpo", "dapo.importance_sampling_level=sequence",
                             "dapo.scale_rewards=none"])
    args = grpo_args(cfg.dapo, cfg.rewards, tmp_path, 0, world_size=1)
    assert (args.loss_type, args.importance_sampling_level, args.scale_rewards) == ("grpo", "sequence", "none")


def test_dapo_s_parts_switch_off_one_set_at_a_time(tmp_path):
    """DAPO (the default) against GRPO, part by part: each set changes exactly its part in what TRL and the
    rollout get, and all four together are GRPO's settings."""
    default = load_config(None)
    assert (default.dapo.loss_type, default.dapo.epsilon_high, default.dapo.dynamic_sampling,
            default.rewards.overlong_shaping) == ("dapo", 0.28, True, True)
    parts = {"dapo.epsilon_high=0.2": ("epsilon_high", 0.2), "dapo.loss_type=grpo": ("loss_type", "grpo")}
    for override, (field, value) in parts.items():
        args = grpo_args(load_config(None, [override]).dapo, default.rewards, tmp_path, 0, world_size=1)
        base = grpo_args(default.dapo, default.rewards, tmp_path, 0, world_size=1)
        assert getattr(args, field) == value and getattr(base, field) != value
    assert load_config(None, ["dapo.dynamic_sampling=false"]).dapo.dynamic_sampling is False
    # the overlong shaping is the fifth reward function; off, its weight is 0 and the others keep theirs
    off = load_config(None, ["rewards.overlong_shaping=false"]).rewards
    assert [f.__name__ for f in reward_functions(off)][4] == "overlong_reward"
    assert off.weights == [0.2, 0.1, 1.0, 0.2, 0.0] and default.rewards.weights == [0.2, 0.1, 1.0, 0.2, 1.0]


def test_an_unknown_loss_type_is_refused_at_load():
    with pytest.raises(ValueError, match="loss_type"):
        load_config(None, ["dapo.loss_type=ppo"])


def _completion(text):
    return [{"role": "assistant", "content": text}]


def test_each_peer_reward_scores_its_own_protocol():
    right = {"search_r1": "<think>x</think>\n<answer> Paris </answer>",
             "research": "<think> x </think> <answer> The final answer is \\[ \\boxed{Paris} \\] </answer><|im_end|>"}
    for kind, text in right.items():
        (reward, *_) = reward_functions(RewardConfig(kind=kind, overlong_shaping=False))
        assert reward([None, None], [_completion(text), _completion(text.replace("Paris", "Rome"))],
                      answers=[["Paris"], ["Paris"]], finish=["answer", "answer"]) [0] == 1.0
    assert RewardConfig(kind="search_r1", overlong_shaping=False).weights == [1.0]


def test_r1_searcher_switches_from_its_stage1_to_its_stage2_reward_at_the_share_of_the_steps():
    """Stage 1 pays for invoking retrieval with well-formed document blocks (+0.5) and the format (+0.5) beside the
    cover-EM term; stage 2 is the answer's F1 minus 2 for a format failure (R1-Searcher's reward servers)."""
    (reward, _) = reward_functions(RewardConfig(kind="r1_searcher", stage1_share=0.5))
    searched = ("I need it. <|begin_of_query|> capital of France <|end_of_query|>\n\n<|begin_of_documents|>\n"
                "(1)Title: Paris Text:  Paris is the capital.\n<|end_of_documents|>\n\nSo it is Paris.</think>\n\n"
                "<answer> Paris </answer>")
    state = lambda step: SimpleNamespace(global_step=step, max_steps=8)
    stage1 = reward([None], [_completion(searched)], answers=[["Paris"]], trainer_state=state(3))[0]
    stage2 = reward([None], [_completion(searched)], answers=[["Paris"]], trainer_state=state(4))[0]
    assert stage1 == pytest.approx(2.0)  # +1 answer, +0.5 retrieval, +0.5 format
    assert stage2 == pytest.approx(1.0)  # F1 1.0, format kept


def test_a_reward_that_does_not_read_the_agent_s_protocol_is_refused():
    with pytest.raises(ValueError, match="does not read"):
        load_config(None, ["rewards.kind=search_r1"])
    with pytest.raises(ValueError, match="eval.method=research"):
        load_config(None, ["agent.method=research", "rewards.kind=research"])


@pytest.mark.parametrize("name", ["search_r1", "research", "r1_searcher"])
def test_each_peer_recipe_loads_with_its_protocol_reward_and_algorithm(name):
    from kunlunlab.paths import PROJECT_ROOT

    cfg = load_config(PROJECT_ROOT / f"experiments/configs/training/peers/{name}.json")
    assert cfg.agent.protocol == name and cfg.eval.method == name and cfg.rewards.kind == name
    assert cfg.dapo.loss_type == "grpo" and cfg.dapo.dynamic_sampling is False
    assert cfg.dapo.epsilon_high == cfg.dapo.epsilon  # no clip-higher: GRPO's symmetric clip
    # the shared budget: make run's SFT and RL sizes, as the kunlun recipe has them
    base = load_config(PROJECT_ROOT / "experiments/configs/training/train_embedded_cpu.json")
    assert (cfg.dapo.steps, cfg.dapo.prompts_per_step, cfg.dapo.num_generations, cfg.dapo.learning_rate) == \
        (base.dapo.steps, base.dapo.prompts_per_step, base.dapo.num_generations, base.dapo.learning_rate)
    # (less how often SFT saves a checkpoint: how a run uses the machine, not what it trains)
    process_only = {path.split(".", 1)[1] for path in PROCESS_ONLY_FIELDS if path.startswith("sft.")}
    assert process_only == {"save_steps"}
    assert ({k: v for k, v in dataclasses.asdict(cfg.sft).items() if k not in process_only}
            == {k: v for k, v in dataclasses.asdict(base.sft).items() if k not in process_only})
    assert cfg.mixing.samples_per_epoch == base.mixing.samples_per_epoch


@pytest.mark.parametrize("kind, right", [
    ("search_r1", "<think>x</think>\n<answer> Paris </answer>"),
    ("research", "<think> x </think> <answer> The final answer is \\[ \\boxed{Paris} \\] </answer><|im_end|>")])
def test_the_rollout_log_reports_the_peer_reward_trl_optimises(kind, right):
    """``dapo_rollouts.jsonl``'s reward of a peer's recipe is its own reward (it was the dual-mode one, 0 for every
    peer trajectory, while TRL optimised the peer's)."""
    from kunlunlab.agent.rollout import RolloutConfig, Trajectory
    from kunlunlab.training.dapo import SearchRollout

    rollout = SearchRollout(None, None, {"Q?": ["Paris"]}, RolloutConfig(), DAPOStageConfig(),
                            RewardConfig(kind=kind, overlong_shaping=False), protocol=kind)
    trajs = [Trajectory("Q?", [], steps=[{"kind": "model", "text": text}], finish="answer")
             for text in (right, right.replace("Paris", "Rome"))]
    state = SimpleNamespace(state=SimpleNamespace(global_step=0, max_steps=4))
    rewards = rollout._peer_rewards(["Q?", "Q?"], trajs, [rollout._record(t) for t in trajs], state)
    assert rewards[0] == 1.0 and rewards[1] == (0.1 if kind == "research" else 0.0)  # ReSearch: 0.1 if well formed
