"""A comparison is fair by code (issue 51): one budget every arm runs under, the same SFT samples and RL prompts for
every arm of a seed, the rollout budget paid for refills too, and a check that names every way arms ran apart."""
import json
from types import SimpleNamespace

import pytest

from kunlunlab.configs import apply_overrides, leaf_values, read_config_file
from kunlunlab.data.splits import load_splits
from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
from kunlunlab.training.comparison import (BUDGET_KEYS, budget_ledger, check_ledgers, load_comparison,
                                           recipe_differences)
from kunlunlab.training.config import DAPOStageConfig, config_from_dict
from kunlunlab.training.dapo import RolloutBudgetStop
from kunlunlab.training.pipeline import mix_training_data

TABLE2 = "experiments/configs/comparisons/table2.json"


def _write(tmp_path, budget=None, arms=None, drop=()):
    data = read_config_file(TABLE2)
    data["name"] = "c"
    data["budget"] = {k: v for k, v in {**data["budget"], **(budget or {})}.items() if k not in drop}
    if arms is not None:
        data["arms"] = arms
    path = tmp_path / "c.json"
    path.write_text(json.dumps(data))
    return path


def test_every_arm_of_table2_runs_the_one_budget_and_differs_only_in_its_recipe():
    stated = json.load(open(TABLE2))["budget"]
    runs = load_comparison("table2").runs()
    assert {r.arm for r in runs} == {"kunlun", "kunlun_grpo", "search_r1", "research", "r1_searcher", "rex_rag", "ur2"}
    assert sorted({r.seed for r in runs}) == [0, 1, 2] and len(runs) == 21
    for run in runs:
        values = leaf_values(run.config.to_dict())
        assert {k: values[k] for k in stated} == stated, run.name  # the file's values, whatever the recipe said
        assert values["seed"] == run.seed
    differences = recipe_differences([r for r in runs if r.seed == 0])
    assert {"agent.method", "rewards.kind", "dapo.loss_type"} <= set(differences)
    assert not set(differences) & set(BUDGET_KEYS)
    assert differences["agent.method"]["search_r1"] == "search_r1" and differences["dapo.loss_type"]["kunlun"] == "dapo"
    # REX-RAG's and UR2's arms are their own recipes (its protocol and reward), under the same budget
    assert differences["agent.method"]["rex_rag"] == "rex_rag" and differences["rewards.kind"]["ur2"] == "ur2"
    # a recipe value the budget replaces is named, not silent: make run's recipe evaluates 50 world questions
    kunlun = next(r for r in runs if r.arm == "kunlun")
    assert "eval.world_questions: 50 -> 200" in kunlun.overridden


def test_a_comparison_that_leaves_a_budget_key_to_the_recipes_is_refused(tmp_path):
    with pytest.raises(ValueError, match="the budget must state dapo.max_rollouts"):
        load_comparison(_write(tmp_path, drop=("dapo.max_rollouts",)))
    with pytest.raises(ValueError, match=r"dapo.max_rollouts must be what dapo.steps buys \(4 rollout calls of 2 x 4 = 32\)"):
        load_comparison(_write(tmp_path, {"dapo.max_rollouts": 40}))
    variant = {"kunlun": {"recipe": "experiments/configs/training/train_embedded_cpu.json", "set": {"top_k": 3}}}
    with pytest.raises(ValueError, match=r"changes budget keys \['top_k'\]"):
        load_comparison(_write(tmp_path, arms=variant)).runs()
    with pytest.raises(ValueError, match="no arm"):
        load_comparison(TABLE2).runs(["nobody"])


def test_kunluns_mechanisms_do_not_change_which_sft_questions_it_draws(world):
    """kunlun's SFT set draws STIE feedback rounds and RDRA backgrounds, the peers' none: the questions, their
    order and which are first-turn samples must still be the same (one random stream drew both before)."""
    comparison = load_comparison("table2")
    small = {"world_passages": 600, "train_questions": 24, "hotpot": False, "index_kind": "bm25",
             "mixing.samples_per_epoch": 8, "mixing.first_turn_samples": 3}
    configs = {}
    for arm in ("kunlun", "search_r1", "research"):
        (run,) = comparison.runs([arm], [1])
        configs[arm] = config_from_dict(apply_overrides(run.config.to_dict(), small))
    data = load_splits(configs["kunlun"].splits())
    retriever = build_retriever(data.passages, IndexConfig(kind="bm25"))
    mixed = {arm: mix_training_data(cfg, data, retriever) for arm, cfg in configs.items()}
    samples = {arm: budget_ledger(configs[arm], t, None)["sft_samples"] for arm, t in mixed.items()}
    assert len(samples["kunlun"]) == 3 * (8 + 3)  # every epoch's drawn samples and first turns
    assert samples["kunlun"] == samples["search_r1"] == samples["research"]
    # ... and the mechanisms are really there, in kunlun's arm alone
    assert any(seg.get("feedback") for t in mixed["kunlun"] for seg in t.segments)
    assert any(t.background for t in mixed["kunlun"])
    for arm in ("search_r1", "research"):
        assert not any(t.background for t in mixed[arm])
        assert not any("<background>" in json.dumps(t.prompt_messages) for t in mixed[arm])


def _ledger(samples=(("world", "q1", False),), prompts=(("a", "a"),), generated=(8,), budget=8, per_call=8):
    calls = [{"step": 2 * i, "prompts": list(p), "generated": g} for i, (p, g) in enumerate(zip(prompts, generated))]
    return {"sft_samples": [list(s) for s in samples], "rl_calls": calls, "rl_generated": sum(generated),
            "limits": {"top_k": 1, "max_searches": 8, "max_turn_tokens": 160, "max_total_tokens": 1024,
                       "max_rollouts": budget, "rollouts_per_call": per_call}}


def test_the_check_names_each_way_arms_ran_apart():
    assert check_ledgers({"a": _ledger(), "b": _ledger()}) == []
    problems = check_ledgers({"a": _ledger(), "b": _ledger(samples=(("world", "q2", False),))})
    assert problems == ["b trained on other SFT samples than a (1 vs 1; first difference at sample 0)"]
    problems = check_ledgers({"a": _ledger(), "b": _ledger(prompts=(("a", "b"),))})
    assert problems == ["b drew other RL prompts than a at rollout call 0"]
    # a refilling arm made fewer calls: the calls both made must agree, and it may leave < one call unused
    fewer = _ledger(prompts=(("a", "a"), ("c", "c")), generated=(12, 8), budget=24)
    both = _ledger(prompts=(("a", "a"), ("c", "c"), ("d", "d")), generated=(8, 8, 8), budget=24)
    assert check_ledgers({"kunlun": fewer, "peer": both}) == []
    over = _ledger(prompts=(("a", "a"), ("c", "c"), ("d", "d")), generated=(12, 8, 8), budget=24)
    assert check_ledgers({"kunlun": over, "peer": both}) == ["kunlun generated 28 rollouts, over the budget's 24"]
    short = _ledger(prompts=(("a", "a"),), generated=(8,), budget=24)
    assert check_ledgers({"short": short, "peer": both}) == ["short stopped with 16 of 24 rollouts unused (a call "
                                                             "costs 8)"]
    limits = _ledger()
    limits["limits"]["max_searches"] = 4
    assert check_ledgers({"a": _ledger(), "b": limits})[0].startswith("b ran under other limits than a")


class _Counted:
    def __init__(self, used):
        self.used = used

    def generated(self):
        return self.used


@pytest.mark.parametrize("used, step, stops", [(8, 2, False), (16, 2, False), (20, 2, True), (24, 2, True),
                                               (20, 1, False)])
def test_the_rl_stage_stops_before_a_rollout_call_the_budget_cannot_pay_for(used, step, stops):
    cfg = DAPOStageConfig(steps=8, prompts_per_step=2, num_generations=4, updates_per_generation=2, max_rollouts=24)
    control = SimpleNamespace(should_training_stop=False)
    RolloutBudgetStop(_Counted(used), cfg).on_step_end(None, SimpleNamespace(global_step=step), control)
    # a call costs 2 x 4 = 8: after 16 of 24 one more fits; after 20 it does not; mid-call (odd step) nothing is due
    assert control.should_training_stop is stops


class _Logged:
    """A rollout log of one call of 8 rollouts at every even step."""

    def logged_generated(self, step):
        return 8 * ((step + 1) // 2)


@pytest.mark.parametrize("step, spent", [(4, False), (6, True), (5, False), (8, True)])
def test_a_checkpoint_where_the_budget_had_stopped_the_stage_counts_as_its_end(step, spent):
    """A run killed after its last checkpoint resumes there: whether the stage had ended is read from the
    rollout log, so a resume does not buy one more call (table2.search_r1.s2 trained 9 updates on 40 rollouts)."""
    cfg = DAPOStageConfig(steps=8, prompts_per_step=2, num_generations=4, updates_per_generation=2, max_rollouts=24)
    # by step 4 the calls at steps 0 and 2 spent 16, one more fits; by step 6 24, none does; step 5 is mid-call
    assert RolloutBudgetStop(_Logged(), cfg).spent_at(SimpleNamespace(global_step=step)) is spent


@pytest.mark.slow
def test_two_arms_trained_through_the_comparison_ran_alike(tmp_path, tiny_model):
    """kunlun's plain agent (dynamic sampling) and Search-R1 (none), trained at smoke size under one budget: the
    same SFT samples and RL prompts, rollouts within the budget, and each evaluated after SFT and after RL."""
    from kunlunlab.training.pipeline import SMOKE_OVERRIDES
    from kunlunlab.training.reruns import comparison_smoke_overrides, run_comparison

    agent = {"agent.method": "agent", "eval.method": "agent", "mixing.rdra_background": False}
    recipe = "experiments/configs/training/train_embedded_cpu.json"
    path = _write(tmp_path, arms={"agent": {"recipe": recipe, "set": agent},
                                  "agent_grpo": {"recipe": recipe, "set": {**agent, "dapo.loss_type": "grpo"}},
                                  "search_r1": "experiments/configs/training/peers/search_r1.json"})
    comparison = load_comparison(path)
    comparison.seeds = [0]
    smoke = {**SMOKE_OVERRIDES, "model": tiny_model, "hotpot": False, "index_kind": "bm25", "dapo.steps": 2,
             "dapo.updates_per_generation": 1, "dapo.num_generations": 2, "dapo.prompts_per_step": 1,
             "eval.world_questions": 2}
    result = run_comparison(comparison, tmp_path / "runs", overrides=comparison_smoke_overrides(smoke))
    assert result["problems"] == {"0": []}
    # the RL variant trained no SFT of its own: it started from the agent arm's checkpoint (its KL reference)
    assert result["sft_from"] == {"c.agent_grpo.s0": "c.agent.s0"}
    variant = json.loads((tmp_path / "runs" / "c.agent_grpo.s0" / "train_config.json").read_text())
    assert variant["sft"]["enabled"] is False
    assert variant["model"] == str((tmp_path / "runs" / "c.agent.s0" / "sft" / "final").resolve())
    ledgers = {arm: json.loads((tmp_path / "runs" / f"c.{arm}.s0" / "budget_ledger.json").read_text())
               for arm in ("agent", "agent_grpo", "search_r1")}
    assert ledgers["agent"]["sft_samples"] == ledgers["search_r1"]["sft_samples"] == \
        ledgers["agent_grpo"]["sft_samples"] != []
    assert ledgers["search_r1"]["rl_generated"] == 4  # 2 calls of 1 prompt x 2 rollouts, the whole budget
    assert ledgers["agent"]["rl_generated"] <= 4
    for arm in ("agent", "agent_grpo", "search_r1"):
        run = tmp_path / "runs" / f"c.{arm}.s0"
        after_sft = [json.loads(line)["id"] for line in (run / "eval_sft_world.jsonl").read_text().splitlines()]
        after_rl = [json.loads(line)["id"] for line in (run / "eval_after_world.jsonl").read_text().splitlines()]
        assert sorted(after_sft) == sorted(after_rl) and len(after_rl) == 2
    assert (tmp_path / "runs" / "c.fairness.json").is_file()


def test_an_rl_variant_in_another_lane_shares_its_source_s_sft_once_that_has_finished(tmp_path, monkeypatch):
    """`--arms kunlun_grpo` in a second process while `--arms kunlun` trains in the first: refused (one line)
    until kunlun's SFT is done, then trained from kunlun's checkpoint, and given kunlun's after-SFT evaluation
    only once that is complete. Arms run in the file's order whatever order --arms names them in."""
    from kunlunlab.training import reruns
    from kunlunlab.training.reruns import SharedSFTNotReady, run_comparison

    trained = {}

    def fake_train(cfg, run_dir, progress=None):  # what the harness hands a run, not the training itself
        trained[run_dir.name] = cfg
        run_dir.mkdir(parents=True)
        ledger = {"sft_samples": [] if cfg.sft.enabled is False else ["q1", "q2"], "rl_calls": [], "rl_generated": 0,
                  "limits": {"max_rollouts": None, "rollouts_per_call": 8}}
        (run_dir / "budget_ledger.json").write_text(json.dumps(ledger))
        (run_dir / "training_summary.json").write_text("{}")
        return {}

    monkeypatch.setattr(reruns, "train", fake_train)
    recipe = "experiments/configs/training/train_embedded_cpu.json"
    comparison = load_comparison(_write(tmp_path, arms={
        "kunlun": recipe, "kunlun_grpo": {"recipe": recipe, "set": {"dapo.loss_type": "grpo"}}}))
    runs = tmp_path / "runs"
    assert [r.arm for r in comparison.runs(["kunlun_grpo", "kunlun"], [0])] == ["kunlun", "kunlun_grpo"]
    with pytest.raises(SharedSFTNotReady, match=r"arm kunlun_grpo trains from the SFT of c.kunlun.s0, which has "
                                                r"not finished its SFT"):
        run_comparison(comparison, runs, ["kunlun_grpo"], [0])
    assert trained == {}
    source = runs / "c.kunlun.s0"
    source.mkdir(parents=True)
    (source / "state.json").write_text(json.dumps({"sft_done": True}))  # the other lane: SFT done, evaluating
    (source / "budget_ledger.json").write_text(json.dumps({"sft_samples": ["q1", "q2"]}))
    (source / "eval_sft_world.jsonl").write_text('{"id": "w1"}\n')  # a part of its after-SFT evaluation
    with pytest.raises(SharedSFTNotReady, match="c.kunlun.s0 has not finished its after-SFT evaluation"):
        run_comparison(comparison, runs, ["kunlun_grpo"], [0])
    variant = trained["c.kunlun_grpo.s0"]
    assert (variant.sft.enabled, variant.model) == (False, str((source / "sft" / "final").resolve()))
    assert not (runs / "c.kunlun_grpo.s0" / "eval_sft_world.jsonl").exists()
    (source / "eval_sft_world.jsonl").write_text('{"id": "w1"}\n{"id": "w2"}\n')
    (source / "state.json").write_text(json.dumps({"sft_done": True, "eval_sft": {"world": {"em": 50.0}}}))
    trained.clear()
    result = run_comparison(comparison, runs, ["kunlun_grpo"], [0])  # the trained variant is reused
    assert trained == {} and result["sft_from"] == {"c.kunlun_grpo.s0": "c.kunlun.s0"}
    assert (runs / "c.kunlun_grpo.s0" / "eval_sft_world.jsonl").read_text().count("\n") == 2
    ledger = json.loads((runs / "c.kunlun_grpo.s0" / "budget_ledger.json").read_text())
    assert (ledger["sft_samples"], ledger["sft_from"]) == (["q1", "q2"], "c.kunlun.s0")


def test_arms_that_differ_only_in_how_they_use_the_machine_share_one_sft():
    from kunlunlab.training.reruns import sft_fingerprint

    base = config_from_dict({})
    other_process = config_from_dict(apply_overrides({}, {"sft.save_steps": 7, "own_process_stages": ["sft"]}))
    other_sft = config_from_dict(apply_overrides({}, {"sft.learning_rate": 1e-4}))
    assert sft_fingerprint(base) == sft_fingerprint(other_process)
    assert sft_fingerprint(base) != sft_fingerprint(other_sft)
