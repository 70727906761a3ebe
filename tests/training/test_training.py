"""Training stages through TRL: one real DAPO step with a gradient check on retrieved tokens, resumable SFT,
and the whole pipeline resumed after an interruption."""
import json
import resource

import pytest
import torch
from transformers import TrainerCallback

from kunlunlab.agent.rollout import RolloutConfig
from kunlunlab.training.mixing import MixingConfig, TrajectoryBuilder
from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
from kunlunlab.training.config import DAPOStageConfig, SFTStageConfig, load_config
from kunlunlab.training.dapo import SearchRollout
from kunlunlab.training.rewards import RewardConfig


@pytest.fixture(scope="module")
def bm25(world):
    return build_retriever(world.passages, IndexConfig(kind="bm25"))


class Interrupt(Exception):
    pass


class InterruptAt(TrainerCallback):
    """Simulates a killed run: raises after optimizer step ``step`` (checkpoints up to then exist) or, with
    ``after_save``, once that step's checkpoint is written (before the stage ends)."""

    def __init__(self, step, after_save=False):
        self.step, self.after_save = step, after_save

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == self.step and not self.after_save:
            raise Interrupt(f"killed at step {self.step}")

    def on_save(self, args, state, control, **kwargs):
        if state.global_step == self.step and self.after_save:
            raise Interrupt(f"killed after saving step {self.step}")


@pytest.mark.slow
def test_one_real_dapo_step_gives_retrieved_tokens_zero_gradient(world, questions, bm25, tmp_path):
    from kunlunlab.models import load_llm
    from kunlunlab.training.dapo import SearchRollout, rl_dataset, run_dapo

    model, tok = load_llm()
    grads = []

    def keep_grad(module, inputs, output):
        if output.requires_grad:
            output.register_hook(lambda g: grads.append(g.detach().clone()))

    model.model.norm.register_forward_hook(keep_grad)
    batch_ids = []  # the token ids of every forward: TRL shuffles a generation's rows before its updates

    def keep_ids(module, inputs, output):
        batch_ids.append(inputs[0].detach().clone())

    model.model.embed_tokens.register_forward_hook(keep_ids)
    cfg = DAPOStageConfig(steps=1, prompts_per_step=1, num_generations=4, dynamic_sampling=False, save_steps=100,
                          learning_rate=1e-5)
    # The untrained model searches when its reply opens with a search and it closes the query within its turn (at
    # temperature 1 not every sample does: four samples, so that the test does not stand on one seed's draws); the
    # engine then appends real results.
    rollout = SearchRollout(bm25.search, tok, {q.question: q.answers for q in questions},
                            RolloutConfig(max_turn_tokens=24, max_total_tokens=200, top_k=2, max_result_chars=200),
                            cfg, RewardConfig(), assistant_prefix="<think>I need to look this up.</think>\n<search>")
    outputs = []

    def recording(prompts, trainer):  # the engine's rollout, with its output kept for the checks below
        out = rollout(prompts, trainer)
        outputs.append(out)
        return out

    def by_length(prompts, completions, **kw):  # distinct rewards, so advantages are non-zero
        return [float(len(c)) for c in completions]

    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer = run_dapo(model, tok, rl_dataset([questions[0].question], [questions[0].answers]), recording, cfg,
                       RewardConfig(), tmp_path / "dapo", reward_funcs=[by_length])
    assert trainer.state.global_step == 1 and trainer.args.loss_type == "dapo" and trainer.args.epsilon_high == 0.28
    out = outputs[0]
    env_mask, completion_ids, prompt_ids = out["env_mask"], out["completion_ids"], out["prompt_ids"]
    assert len(completion_ids) == 4 and any(0 in m for m in env_mask), "the rollout must contain retrieved tokens"
    assert any("<result>" in tok.decode([i for i, m in zip(ids, mask) if not m])
               for ids, mask in zip(completion_ids, env_mask))
    assert len(grads) == 1
    grad = grads[0]  # d loss / d final hidden state, (batch, prompt width + completion width, hidden)
    width = max(len(p) for p in prompt_ids)
    forward_ids = [r.tolist() for r in batch_ids[-1]]
    for row, (ids, mask) in enumerate(zip(completion_ids, env_mask)):
        # the trainer's row of this rollout (TRL shuffles the rows of a generation batch before its updates)
        matches = [b for b, fwd in enumerate(forward_ids) if fwd[width:width + len(ids)] == list(ids)]
        assert matches, f"rollout row {row} is not in the trainer's batch"
        at = matches[0]
        for j, m in enumerate(mask):
            g = grad[at, width + j - 1]  # the hidden state that predicts completion token j
            if m == 0:
                assert torch.count_nonzero(g) == 0, f"retrieved token {j} of row {row} got a gradient"
        model_positions = [width + j - 1 for j, m in enumerate(mask) if m == 1]
        assert torch.count_nonzero(grad[at, model_positions]) > 0, "model tokens must get a gradient"
    changed = sum(not torch.equal(before[n], p) for n, p in model.named_parameters() if n in before)
    assert changed > 0, "the optimizer step must move the weights"


def _sft_setup(world, questions, bm25, model_path):
    from kunlunlab.models import load_llm
    from kunlunlab.training.sft import freeze_for_sft, sft_dataset

    model, tok = load_llm(model_path)
    freeze_for_sft(model, 2)
    builder = TrajectoryBuilder(bm25.search, world.passages, MixingConfig(rdra_background=False),
                                top_k=1, max_result_chars=120)
    dataset = sft_dataset(tok, [builder.world(q) for q in questions[:8]], 1024)
    return model, tok, dataset


@pytest.mark.slow
def test_sft_resumes_after_interruption_with_nothing_lost(world, questions, bm25, tmp_path, tiny_model):
    from kunlunlab.training.sft import run_sft

    cfg = SFTStageConfig(batch_size=2, max_steps=4, save_steps=2, learning_rate=1e-3, train_layers=2)
    # resuming is the trainer's doing: a tiny random model (conftest.py) shows it, fast
    model, tok, dataset = _sft_setup(world, questions, bm25, tiny_model)
    straight = run_sft(model, tok, dataset, cfg, tmp_path / "straight")
    reference = {n: p.detach().clone() for n, p in model.named_parameters()}

    model, tok, dataset = _sft_setup(world, questions, bm25, tiny_model)
    with pytest.raises(Interrupt):
        run_sft(model, tok, dataset, cfg, tmp_path / "killed", callbacks=[InterruptAt(3)])
    assert (tmp_path / "killed" / "checkpoint-2").is_dir() and not (tmp_path / "killed" / "checkpoint-4").exists()
    model, tok, dataset = _sft_setup(world, questions, bm25, tiny_model)  # a new process: fresh weights, resumed from disk
    resumed = run_sft(model, tok, dataset, cfg, tmp_path / "killed")
    assert resumed.state.global_step == 4
    losses = lambda t: [round(r["loss"], 5) for r in t.state.log_history if "loss" in r]
    assert losses(resumed) == losses(straight)
    for n, p in model.named_parameters():
        assert torch.allclose(p, reference[n], atol=1e-6), n


@pytest.mark.slow
def test_pipeline_resumes_mid_dapo_and_writes_the_summary(tmp_path, monkeypatch, capsys, tiny_model):
    from kunlunlab.training.pipeline import SMOKE_OVERRIDES, train

    # what a run does, not what it learns: a tiny random model (conftest.py) generates fast to every budget
    # the long-answer evaluation too (the smoke size leaves it out)
    # every stage in this process: the callbacks interrupt it, and its peaks are this process's (the
    # own-process route has its own test below)
    overrides = {**SMOKE_OVERRIDES, "dapo.steps": 2, "dapo.save_steps": 1, "hotpot": False, "eval.summary_questions": 1,
                 "model": tiny_model, "own_process_stages": []}
    cfg = load_config("experiments/configs/training/train_embedded_cpu.json", overrides)
    with pytest.raises(Interrupt):
        train(cfg, tmp_path, dapo_callbacks=[InterruptAt(2)])
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["sft_done"] and not state.get("dapo_done") and "eval_before" in state
    assert (tmp_path / "dapo" / "checkpoint-1").is_dir()  # the interrupted stage can resume; the finished one
    assert (tmp_path / "sft" / "final").is_dir() and not list((tmp_path / "sft").glob("checkpoint-*"))  # need not
    # resumed, and killed again once the last step's checkpoint is on disk: the next resume trains nothing more
    with pytest.raises(Interrupt):
        train(cfg, tmp_path, dapo_callbacks=[InterruptAt(2, after_save=True)])
    state = json.loads((tmp_path / "state.json").read_text())
    assert (tmp_path / "dapo" / "checkpoint-2").is_dir() and not state.get("dapo_done")

    from kunlunlab.cli import main

    assert main(["train", "--config", "experiments/configs/training/train_embedded_cpu.json", "--run-dir", str(tmp_path),
                 "--smoke", "--set", "dapo.steps=2", "dapo.save_steps=1", "hotpot=false", "eval.summary_questions=1",
                 f"model={tiny_model}", "own_process_stages=[]"]) == 0
    summary = json.loads((tmp_path / "training_summary.json").read_text())
    for key in ("em_before", "em_after", "f1_before", "f1_after", "format_compliance_before",
                "format_compliance_after", "steps", "seconds"):
        assert key in summary
    assert summary["steps_by_stage"] == {"sft": 2, "dapo": 2}
    assert summary["world_summary"]["n"] == 1 and (tmp_path / "eval_after_summary.jsonl").is_file()
    rollouts = [json.loads(line) for line in (tmp_path / "dapo_rollouts.jsonl").read_text().splitlines()]
    assert {r["step"] for r in rollouts} == {0, 1}
    assert (tmp_path / "dapo" / "final").is_dir() and not list(tmp_path.glob("*/checkpoint-*"))
    # each stage's record of the process's peak resident memory up to its end (both runs were this process's)
    order, peaks = ["eval_before", "sft", "dapo", "eval_after"], summary["peak_host_gb"]
    assert all(isinstance(peaks[k], float) and peaks[k] > 0.05 for k in order)
    assert [peaks[k] for k in order] == sorted(peaks[k] for k in order)  # a peak so far never falls
    assert peaks["eval_after"] <= resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20 + 0.01

    # the same folder with another config is refused (it would hand back this run's models), not resumed
    saved = (tmp_path / "train_config.json").read_text()
    capsys.readouterr()
    assert main(["train", "--config", "experiments/configs/training/train_embedded_cpu.json", "--run-dir", str(tmp_path),
                 "--smoke", "--set", "dapo.steps=2", "dapo.save_steps=1", "hotpot=false", "eval.summary_questions=1",
                 f"model={tiny_model}", "own_process_stages=[]", "sft.learning_rate=1e-4"]) == 2
    assert "holds a training run of another config (differs in ['sft']" in capsys.readouterr().err  # bad input: exit 2
    assert (tmp_path / "train_config.json").read_text() == saved
    # ... while a config that differs only in how the run uses the machine (how often a stage saves, which process
    # trains it) holds the same run and resumes there
    from kunlunlab.training.pipeline import check_run_folder

    check_run_folder(load_config("experiments/configs/training/train_embedded_cpu.json",
                                 {**overrides, "dapo.save_steps": 2, "sft.save_steps": 7, "own_process_stages": ["sft"]}),
                     tmp_path)


def test_config_file_and_overrides_are_validated(tmp_path):
    cfg = load_config("experiments/configs/training/train_embedded_cpu.json", ["sft.learning_rate=3e-5", "mixing.epochs=5"])
    assert cfg.sft.learning_rate == 3e-5 and cfg.mixing.epochs == 5 and cfg.dapo.epsilon_high == 0.28
    with pytest.raises(ValueError, match="unknown keys"):
        load_config(None, {"sft.learning_rat": 1})
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ValueError, match="invalid JSON"):
        load_config(bad)
    with pytest.raises(FileNotFoundError):
        load_config(tmp_path / "missing.json")
    multi = load_config("experiments/configs/training/train_qwen_multigpu.json")
    assert multi.dapo.use_vllm and multi.deepspeed and multi.model


def test_bf16_auto_follows_the_hardware_and_bad_values_are_refused(monkeypatch):
    import kunlunlab.models as models
    from kunlunlab.models import resolve_train_bf16

    assert load_config("experiments/configs/training/train_embedded_cpu.json").bf16 == "auto"
    assert resolve_train_bf16(True, "cpu") is True and resolve_train_bf16(False, "cpu") is False
    monkeypatch.setattr(models, "native_bf16_cpu", lambda: False)   # an AVX2-only CPU: emulated bf16 is slow
    assert resolve_train_bf16("auto", "cpu") is False
    monkeypatch.setattr(models, "native_bf16_cpu", lambda: True)    # AMX / AVX512-BF16
    assert resolve_train_bf16("auto", "cpu") is True
    with pytest.raises(ValueError, match=r"bf16=.yes.: expected true or false or .auto."):
        load_config(None, {"bf16": "yes"})


def test_rollouts_go_to_the_vllm_server_when_the_trainer_uses_vllm(world, questions, bm25, backend):
    """Multi-GPU recipe path: TRL's vLLM server speaks /v1/completions; our serve-llm stands in for it. The
    trainer here has no ``vllm_generation`` (TRL creates its client on the main process only): the server's
    address comes from the trainer's arguments and its model name from GET /v1/models, as on any rank."""
    from types import SimpleNamespace

    from kunlunlab.agent.server import create_app
    from kunlunlab.http.server import ServerThread
    from kunlunlab.training.dapo import SearchRollout

    model = backend.model
    model.name_or_path = str(model.name_or_path)
    cfg = DAPOStageConfig(num_generations=2, dynamic_sampling=False, temperature=0.0)
    rollout = SearchRollout(bm25.search, backend.tokenizer, {q.question: q.answers for q in questions},
                            RolloutConfig(max_turn_tokens=16, max_total_tokens=96, top_k=1), cfg, RewardConfig())
    with ServerThread(create_app(backend)) as url:
        trainer = SimpleNamespace(
            use_vllm=True, num_generations=2, model=model, state=SimpleNamespace(global_step=0),
            args=SimpleNamespace(vllm_mode="server", seed=0, vllm_server_base_url=url + "/"),
            accelerator=SimpleNamespace(unwrap_model=lambda m: m))
        out = rollout([questions[0].question] * 2, trainer)
    assert rollout._remote is not None and rollout._remote.url.startswith(url)
    assert rollout._remote.model == backend.name  # the served model's id, as GET /v1/models lists it
    assert len(out["completion_ids"]) == 2 and all(len(m) == len(c) for m, c in zip(out["env_mask"], out["completion_ids"]))
    trainer.args.vllm_mode = "colocate"
    rollout._remote = None
    with pytest.raises(ValueError, match="vllm_mode"):
        rollout([questions[0].question] * 2, trainer)


def _answer_turn(answer, tidy=True):
    return f"<think>so</think><short_answer>\\boxed{{{answer}}}</short_answer>" + ("" if tidy else " extra")


def _scripted_rollout(tokenizer, plan, dapo, rewards=None, searches=None, supporting=None):
    """A ``SearchRollout`` whose rollouts are scripted: ``plan[q][k]`` is the text of question q's k-th sample,
    ``searches[q][k]`` (optional) the passage ids its searches returned."""
    from kunlunlab.agent.rollout import Trajectory
    from kunlunlab.training.dapo import SearchRollout

    class Scripted(SearchRollout):
        def _backend(self, trainer, model):
            return None

        def _roll(self, backend, questions, seed):
            seen, out = {}, []
            for q in questions:
                k = seen.get(q, 0)
                seen[q] = k + 1
                text = plan[q][k]
                out.append(Trajectory(q, [1, 2], [5, 6], [1, 1], [0.0, 0.0], [{"kind": "model", "text": text}],
                                      finish="answer", answer=text.split("{")[1].split("}")[0],
                                      doc_ids=[list(ids) for ids in (searches or {}).get(q, [[]] * (k + 1))[k]]))
                out[-1].final_answer = out[-1].answer
            return out

    answers = {q: [f"gold-{q}"] for q in plan}
    return Scripted(None, tokenizer, answers, RolloutConfig(), dapo, rewards or RewardConfig(), supporting=supporting)


def _stub_trainer():
    from types import SimpleNamespace

    model = SimpleNamespace(training=True, eval=lambda: None, train=lambda mode=True: None)
    return SimpleNamespace(num_generations=2, model=model, state=SimpleNamespace(global_step=0),
                           args=SimpleNamespace(seed=0), accelerator=SimpleNamespace(unwrap_model=lambda m: m))


def test_dynamic_sampling_drops_accuracy_flat_groups_and_refills_the_batch(backend):
    """DAPO's dynamic sampling: groups whose accuracy is all-equal (even if their shaped totals differ) are
    replaced by informative groups of other training questions, whose answers reach the rewards."""
    turn = _answer_turn
    # Per question: what its 2 samples answer (gold is "gold-<question>").
    plan = {"q0": [turn("gold-q0"), turn("gold-q0")],                 # all right: flat
            "q1": [turn("wrong"), turn("wrong", tidy=False)],          # all wrong, totals differ: flat by accuracy
            "q2": [turn("gold-q2"), turn("wrong")],                    # informative
            "q3": [turn("wrong"), turn("wrong")],                      # flat
            "q4": [turn("wrong"), turn("gold-q4")]}                    # informative
    trainer = _stub_trainer()
    rollout = _scripted_rollout(backend.tokenizer, plan, DAPOStageConfig(max_resample=3))
    out = rollout(["q0", "q0", "q1", "q1"], trainer)
    kept = [a[0] for a in out["answers"]]
    assert sorted({kept[0], kept[2]}) == ["gold-q2", "gold-q4"] and kept[0] == kept[1] and kept[2] == kept[3]
    assert all(any(m) for m in out["env_mask"])              # nothing left out of the loss
    stats = rollout.history[-1]
    assert stats["flat_groups_before"] == 2 and stats["refilled_groups"] == 2 and stats["flat_groups"] == 0
    # with no refill rounds, the flat groups stay but carry no loss ... unless every group is flat
    rollout = _scripted_rollout(backend.tokenizer, plan, DAPOStageConfig(max_resample=0))
    out = rollout(["q0", "q0", "q2", "q2"], trainer)
    assert [any(m) for m in out["env_mask"]] == [False, False, True, True]
    out = rollout(["q0", "q0", "q1", "q1"], trainer)
    assert all(any(m) for m in out["env_mask"])


def test_dynamic_sampling_refills_no_more_than_the_comparisons_rollout_budget_leaves(backend):
    """dapo.max_rollouts pays for refills too: with 8 rollouts in the budget, a call of 4 (two groups of 2, both
    flat) after 2 already generated leaves room for one refill group of 2, not two; the log counts 4 + 2."""
    turn = _answer_turn
    plan = {"q0": [turn("gold-q0")] * 2, "q1": [turn("wrong")] * 2,
            "q2": [turn("gold-q2"), turn("wrong")], "q4": [turn("wrong"), turn("gold-q4")]}
    cfg = DAPOStageConfig(max_resample=3, prompts_per_step=2, num_generations=2, steps=4, max_rollouts=8)
    rollout = _scripted_rollout(backend.tokenizer, plan, cfg)
    rollout.history.append({"step": -1, "rollouts": 2, "generated": 2})  # what earlier calls used
    rollout._generated_before = 0
    rollout(["q0", "q0", "q1", "q1"], _stub_trainer())
    stats = rollout.history[-1]
    assert stats["refilled_groups"] == 1 and stats["refill_questions_tried"] == 1 and stats["generated"] == 6
    assert stats["prompts"] == ["q0", "q0", "q1", "q1"]  # TRL's draw, before the refill replaced a group
    assert rollout.generated() == 8
    unbounded = _scripted_rollout(backend.tokenizer, plan, DAPOStageConfig(max_resample=3, num_generations=2))
    unbounded(["q0", "q0", "q1", "q1"], _stub_trainer())
    assert unbounded.history[-1]["refilled_groups"] == 2 and unbounded.history[-1]["generated"] == 8


def test_a_group_that_ends_flat_is_refilled_while_the_batch_still_runs(backend):
    """Where the session takes rows mid-rollout (the local backend's), dynamic sampling does not wait for the
    batch: q0's two samples are both right by decode step 2 (flat) while q1's take 20 steps; the refill question,
    q2 (the pool's only other question), joins at step 2 in q0's rows and, informative, takes q0's place, as a
    refill after the batch would. With no rollouts left in the budget, nothing joins and q0 leaves the loss."""
    from scripted import ContinuingScriptedBackend, CountingSearch
    from kunlunlab.training.dapo import SearchRollout

    def answer(text):
        return f"so</think><short_answer>\\boxed{{{text}}}</short_answer>"

    # question -> (the answers of its group's first and second sample, decode steps each takes)
    plan = {"Which q0?": (["gold-q0", "gold-q0"], 2), "Which q1?": (["gold-q1", "wrong"], 20),
            "Which q2?": (["wrong", "gold-q2"], 3)}

    def script(prompt, turn, row):
        question = next(q for q in plan if q in prompt)
        answers, steps = plan[question]
        return answer(answers[row % 2]), steps

    def rollout_with(cfg):
        scripted = ContinuingScriptedBackend(backend.tokenizer, script)

        class Local(SearchRollout):
            def _backend(self, trainer, model):
                return scripted

        answers = {q: ["gold-" + q.split()[1].rstrip("?")] for q in plan}
        return Local(CountingSearch(), backend.tokenizer, answers, RolloutConfig(), cfg, RewardConfig()), scripted

    rollout, scripted = rollout_with(DAPOStageConfig(max_resample=1, num_generations=2))
    out = rollout(["Which q0?", "Which q0?", "Which q1?", "Which q1?"], _stub_trainer())
    assert scripted.added == [(2, [4, 5])]  # at step 2, in the rows q0 left, long before q1's samples end at 20
    assert [a[0] for a in out["answers"]] == ["gold-q2", "gold-q2", "gold-q1", "gold-q1"]
    assert [p["answer"] for p in out["parse"]] == ["wrong", "gold-q2", "gold-q1", "wrong"]
    assert all(any(m) for m in out["env_mask"])
    stats = rollout.history[-1]
    assert (stats["flat_groups_before"], stats["refilled_groups"], stats["refill_questions_tried"],
            stats["flat_groups"], stats["generated"]) == (1, 1, 1, 0, 6)
    assert stats["prompts"] == ["Which q0?", "Which q0?", "Which q1?", "Which q1?"]

    rollout, scripted = rollout_with(DAPOStageConfig(max_resample=1, num_generations=2, prompts_per_step=2,
                                                     steps=4, max_rollouts=5))
    rollout._generated_before = 0
    out = rollout(["Which q0?", "Which q0?", "Which q1?", "Which q1?"], _stub_trainer())
    assert scripted.added == []
    assert [any(m) for m in out["env_mask"]] == [False, False, True, True]
    assert rollout.history[-1]["generated"] == 4


@pytest.mark.parametrize("includes_budget, w_budget, q0_in_loss", [(False, 0.5, False), (True, 0.5, True),
                                                                   (True, 0.0, False)])
def test_a_group_right_everywhere_but_unequal_in_searches_is_informative_when_flatness_includes_the_budget(
        backend, includes_budget, w_budget, q0_in_loss):
    """dapo.flat_includes_budget: both samples of q0 answer right, the second searches its one gold passage
    twice (one search past the optimal stop: budget 1 − 0.25 = 0.75 against 1.0). Judged on accuracy the
    group is flat and leaves the loss; judged on accuracy and budget (with the budget reward on) it stays."""
    plan = {"q0": [_answer_turn("gold-q0")] * 2, "q2": [_answer_turn("gold-q2"), _answer_turn("wrong")]}
    searches = {"q0": [[["d1"]], [["d1"], ["d1"]]], "q2": [[], []]}
    rollout = _scripted_rollout(backend.tokenizer, plan,
                                DAPOStageConfig(max_resample=0, flat_includes_budget=includes_budget),
                                RewardConfig(w_budget=w_budget, budget_penalty=0.25, budget_extra="past_stop"),
                                searches=searches, supporting={"q0": ["d1"]})
    out = rollout(["q0", "q0", "q2", "q2"], _stub_trainer())
    assert out["budget"] == [1.0, 0.75, None, None]
    assert [any(m) for m in out["env_mask"]] == [q0_in_loss, q0_in_loss, True, True]
    assert rollout.history[-1]["accuracy"] == 0.75


def test_dapo_accuracy_scores_a_summary_questions_facts(bm25, questions):
    """The rollout's accuracy signal (what dynamic sampling judges flatness on) reads a summary-oriented question's
    gold facts: the long answer that states them earns 1, the bare box only its share."""
    from types import SimpleNamespace

    facts = ["Ara was produced by Bel.", "Bel is headquartered in Cim."]
    rollout = SearchRollout(bm25.search, None, {"Describe how Ara is connected to Cim.": ["Bel"]}, RolloutConfig(),
                            DAPOStageConfig(), RewardConfig(), facts={"Describe how Ara is connected to Cim.": facts})
    long = SimpleNamespace(text="<think>x</think>\n<long_answer>Ara was produced by Bel. Bel is headquartered in Cim. "
                                "\\boxed{Bel}</long_answer>", model_tokens=20, final_answer=None)
    short = SimpleNamespace(text="<think>x</think>\n<short_answer>\\boxed{Bel}</short_answer>", model_tokens=5,
                            final_answer=None)
    question = "Describe how Ara is connected to Cim."
    assert rollout._accuracies([question, question], [long, short]) == [1.0, 0.5 + 0.5 * (1 / 5 + 1 / 5) / 2]
