"""REX-RAG (MiliLab/REX-RAG @d9dbbb4) through the "adding an agent" route: its protocol module
(``kunlunlab/agent/protocols/rex_rag.py``, Search-R1's protocol with an exploration spec), its recipe
(``experiments/configs/training/peers/rex_rag.json``) and the mechanism (``kunlunlab/training/exploration.py``).

The rollouts here come from a stand-in backend that replies by what a row's context holds (a search first, then a
wrong answer, the right one after an exploratory prompt), and the policy that scores tokens and trains is the tiny
random Llama (tests/tiny_training.py). The importance weights are checked against values computed here from the
two distributions: the policy's token probabilities (a forward pass of this file's own) and the probe policy's
(the exploratory prompts' next-token frequencies, counted here)."""
import json
import math
from types import SimpleNamespace

import pytest
import torch

from kunlunlab.agent.backends import Segment, text_ids
from kunlunlab.agent.protocols import get_protocol
from kunlunlab.agent.protocols.rex_rag import EXPLORATION, REX_RAG_PROMPTS
from kunlunlab.agent.rollout import RolloutConfig
from kunlunlab.paths import read_jsonl
from kunlunlab.training.config import DAPOStageConfig
from kunlunlab.training.dapo import SearchRollout, rl_dataset, run_dapo
from kunlunlab.training.exploration import ExplorationGRPOTrainer, Explorer
from kunlunlab.training.rewards import RewardConfig
from scripted import CountingSearch

DEAD, MIXED = "Who founded Shylcel Holdings?", "Who founded Orvik Mining?"
GOLD = "Ann Vale"
SEARCH = "<think>I need the founder.</think>\n<search> founder </search>"
WRONG = "<think>The documents name Bob.</think>\n<answer> Bob Stone </answer>"
RIGHT = "<think>The documents name Ann.</think>\n<answer> Ann Vale </answer>"
AFTER_PROBE = " Ann, not Bob.</think>\n<answer> Ann Vale </answer>"
ALWAYS = EXPLORATION.__class__(**{**EXPLORATION.__dict__, "probe_share": 1.0, "keep_ratio_start": 1.0})
RECIPE = "experiments/configs/training/peers/rex_rag.json"


class StandIn:
    """Rows reply by their context: a search; after the documents the wrong answer (the first session's
    ``right_rows`` the right one); after an exploratory prompt the right answer."""

    name = "stand-in"

    def __init__(self, tokenizer, right_rows=()):
        self.tokenizer, self.right_rows, self.sessions = tokenizer, set(right_rows), 0

    def open(self, prompts, sampling=None):
        outer, first = self, self.sessions == 0
        self.sessions += 1
        context = {i: list(p) for i, p in enumerate(prompts)}

        class Session:
            def generate(self, rows, max_new_tokens, stop=()):
                out = {}
                for r in rows:
                    seen = outer.tokenizer.decode(context[r])
                    if any(p in seen for p in REX_RAG_PROMPTS):
                        reply = AFTER_PROBE
                    elif "<information>" in seen:
                        reply = RIGHT if first and r in outer.right_rows else WRONG
                    else:
                        reply = SEARCH
                    ids = text_ids(outer.tokenizer, reply)
                    context[r] += ids
                    out[r] = Segment(ids, [-0.5] * len(ids), outer.tokenizer.decode(ids), "stop")
                return out

            def append(self, tokens):
                for r, ids in tokens.items():
                    context[r] += list(ids)

            def release(self, rows):
                pass

        return Session()


@pytest.fixture(scope="module")
def tiny(tiny_model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model).eval(), AutoTokenizer.from_pretrained(tiny_model)


def _rollout(tok, backend, spec=ALWAYS, **dapo) -> SearchRollout:
    rollout = SearchRollout(CountingSearch(), tok, {DEAD: [GOLD], MIXED: [GOLD]},
                            RolloutConfig(top_k=1, max_searches=5, max_total_tokens=400, max_turn_tokens=64),
                            DAPOStageConfig(**{"num_generations": 4, "prompts_per_step": 2, "dynamic_sampling": False,
                                               "temperature": 1.0, **dapo}),
                            RewardConfig(kind="rex_rag", overlong_shaping=False), protocol="rex_rag")
    rollout._backend = lambda trainer, model: backend
    rollout.explorer = Explorer(spec) if spec is not None else None
    return rollout


def _trainer(model):
    return SimpleNamespace(accelerator=SimpleNamespace(unwrap_model=lambda m: m), model=model, num_generations=4,
                           state=SimpleNamespace(global_step=0), args=SimpleNamespace(seed=0))


def _find(ids: list[int], part: list[int]) -> int:
    return next(k for k in range(len(ids) - len(part) + 1) if ids[k:k + len(part)] == part)


def test_the_protocol_is_search_r1_s_with_rex_rag_s_exploration_as_data():
    rex, sr1 = get_protocol("rex_rag"), get_protocol("search_r1")
    assert rex.peer and rex.exploration is EXPLORATION and sr1.exploration is None
    assert rex.messages("Q?") == sr1.messages("Q?") and rex.stop_strings == sr1.stop_strings
    assert rex.invalid_block == "\nMy action is invalid. " and rex.max_searches == 5
    assert len(REX_RAG_PROMPTS) == 30 and all(p.startswith("<think> ") for p in REX_RAG_PROMPTS)
    assert EXPLORATION.probe_share == 0.2 and EXPLORATION.keep_ratio_start == 0.08
    assert rex.rewards["rex_rag"]("<think>x</think>\n<answer> Ann Vale </answer>", [GOLD]) == 1.0
    from kunlunlab.training.pipeline import run_config

    cfg = run_config(RECIPE)
    assert cfg.agent.method == cfg.rewards.kind == cfg.eval.method == "rex_rag"


def test_a_dead_end_group_gets_probes_and_a_group_with_a_right_answer_is_left_alone(tiny):
    model, tok = tiny
    prompts = [DEAD] * 4 + [MIXED] * 4
    plain = _rollout(tok, StandIn(tok, right_rows={4}), spec=None)(prompts, _trainer(model))
    rollout = _rollout(tok, StandIn(tok, right_rows={4}))
    out = rollout(prompts, _trainer(model))
    texts = [tok.decode(ids) for ids in out["completion_ids"]]
    for k in range(4):  # the dead end: every sample cut before its answer, a prompt appended, continued
        prompt = next(p for p in REX_RAG_PROMPTS if p in texts[k])
        assert "Bob Stone" not in texts[k] and texts[k].count("<answer>") == 1
        assert texts[k].index("The documents name Bob.") < texts[k].index(prompt) < texts[k].index(
            "<answer> Ann Vale </answer>")
        ids, p_ids = out["completion_ids"][k], text_ids(tok, prompt)
        start = _find(ids, p_ids)
        assert out["env_mask"][k][start:start + len(p_ids)] == [1] * len(p_ids)  # the prompt is trained on
        assert ids[:start] == text_ids(tok, texts[k][:texts[k].index(prompt)])
    assert out["completion_ids"][4:] == plain["completion_ids"][4:]  # the group with a right answer: untouched
    assert out["env_mask"][4:] == plain["env_mask"][4:]
    assert all(a == 0.5 for a, m in zip(out["exploration_scale"][4], out["env_mask"][4]) if m)  # 1 - alpha
    assert not any(p in t for t in texts[4:] for p in REX_RAG_PROMPTS)
    stats = rollout.history[-1]
    assert (stats["dead_end_groups"], stats["probe_groups"], stats["probe_group_share"]) == (1, 1, 0.5)
    assert (stats["probes_rolled"], stats["probes_kept"], stats["mix_alpha"]) == (4, 4, 0.5)
    assert stats["accuracy"] == 5 / 8 and stats["probe_accuracy"] == 1.0 and stats["error_rate"] == 7 / 8
    assert stats["generated"] == 12 and rollout.generated() == 12  # the probes are in the rollout budget
    assert rollout.explorer.keep_ratio == pytest.approx(0.9 * 1.0 + 0.1 * 1.0)


def test_probes_stop_at_the_rollout_budget_and_none_are_kept_below_the_keep_ratio(tiny):
    model, tok = tiny
    prompts = [DEAD] * 4 + [MIXED] * 4
    rollout = _rollout(tok, StandIn(tok, right_rows={4}), max_rollouts=10)
    rollout(prompts, _trainer(model))
    stats = rollout.history[-1]
    assert stats["probes_rolled"] == 2 and stats["generated"] == 10 and rollout.generated() == 10
    upstream = _rollout(tok, StandIn(tok, right_rows={4}),
                        spec=EXPLORATION.__class__(**{**EXPLORATION.__dict__, "probe_share": 1.0}))
    upstream(prompts, _trainer(model))  # keep ratio 0.08: ceil(8 x 0.08) = 1 probe kept of 4 rolled
    stats = upstream.history[-1]
    assert (stats["probes_rolled"], stats["probes_kept"], stats["mix_alpha"]) == (4, 1, 1 / 8)
    assert upstream.explorer.keep_ratio == pytest.approx(0.9 * 0.08 + 0.1 * 1.0)


def _frequencies(tok) -> callable:
    """The probe policy on the prompt's tokens, counted here: the first token 1, then the share of the prompts
    that start with the tokens so far and continue with this one."""
    tokenised = [text_ids(tok, p) for p in REX_RAG_PROMPTS]

    def frequency(prefix: list[int], token: int) -> float:
        if not prefix:
            return 1.0
        going_on = [t for t in tokenised if t[:len(prefix)] == prefix and len(t) > len(prefix)]
        return sum(t[len(prefix)] == token for t in going_on) / len(going_on)

    return frequency


@pytest.mark.parametrize("updates", [1, 2])  # 1: TRL keeps no old log-probs (on-policy); 2: it computes them
def test_probe_tokens_get_the_importance_weight_of_the_mixture_in_the_trained_loss(tiny, tiny_model, tmp_path,
                                                                                  monkeypatch, updates):
    from transformers import AutoModelForCausalLM

    _, tok = tiny
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    rollout = _rollout(tok, StandIn(tok, right_rows={4}), steps=updates, updates_per_generation=updates,
                       micro_batch_size=4, learning_rate=1e-3, save_steps=100, epsilon_high=0.2)
    seen = []
    original = ExplorationGRPOTrainer._generate_and_score_completions

    def recording(self, inputs):  # the batch the loss reads, and this file's own pi_old at that moment
        out = original(self, inputs)
        rows = []
        with torch.no_grad():
            for r in range(out["completion_ids"].shape[0]):
                prompt = out["prompt_ids"][r][out["prompt_mask"][r].bool()].tolist()
                n = int(out["completion_mask"][r].sum())
                completion = out["completion_ids"][r][:n].tolist()
                logits = self.model(input_ids=torch.tensor([prompt + completion])).logits[0].float()
                logps = torch.log_softmax(logits[len(prompt) - 1:-1], dim=-1)
                rows.append((completion, logps.gather(1, torch.tensor(completion)[:, None])[:, 0]))
        seen.append((out, rows))
        return out

    monkeypatch.setattr(ExplorationGRPOTrainer, "_generate_and_score_completions", recording)
    trainer = run_dapo(model, tok, rl_dataset([DEAD, MIXED], [[GOLD], [GOLD]]), rollout, rollout.dapo,
                       rollout.rewards, tmp_path / "dapo")
    assert isinstance(trainer, ExplorationGRPOTrainer) and trainer.state.global_step == updates
    out, rows = seen[0]
    stats = rollout.history[0]
    alpha, error_rate = stats["mix_alpha"], stats["error_rate"]
    assert (alpha, error_rate, stats["probes_kept"]) == (0.5, 7 / 8, 4)
    frequency = _frequencies(tok)
    mask = out["completion_mask"] * out["tool_mask"]
    probes = 0
    for r, (completion, logp) in enumerate(rows):
        pi = logp.exp().double()
        mu = torch.zeros_like(pi)  # the policy's own samples: the probe policy never draws them
        text = tok.decode(completion)
        prompt = next((p for p in REX_RAG_PROMPTS if p in text), None)
        if prompt is not None:
            probes += 1
            p_ids = text_ids(tok, prompt)
            j = _find(completion, p_ids)
            mu[:j] = pi[:j] / error_rate ** (1 / j)  # the prefix, drawn among the wrong samples
            for k in range(len(p_ids)):
                mu[j + k] = frequency(p_ids[:k], p_ids[k])
            mu[j + len(p_ids):] = pi[j + len(p_ids):]  # the continuation is the policy's
        expected = ((1 - alpha) * pi + alpha * mu).log()
        loss_tokens = mask[r][:len(completion)].bool()
        got = out["old_per_token_logps"][r][:len(completion)].double()
        assert torch.allclose(got[loss_tokens], expected[loss_tokens], atol=2e-4), r
        weights = (logp.double() - got).exp()[loss_tokens]
        if prompt is None:
            assert torch.allclose(weights, torch.full_like(weights, 2.0), atol=1e-3)  # 1 / (1 - alpha)
        else:
            after = torch.arange(len(completion))[loss_tokens] >= j + len(p_ids)
            assert torch.allclose(weights[after], torch.ones_like(weights[after]), atol=1e-3)
    assert probes == 4
    logged = [row for row in trainer.state.log_history if "exploration/importance_weight" in row]
    assert logged and all(math.isfinite(row["exploration/importance_weight"]) for row in logged)
    assert stats["importance_weight_mean"] > 1.0  # the policy's samples weigh 1 / (1 - alpha) = 2


@pytest.mark.slow
def test_rex_rag_trains_at_smoke_size_through_the_harness_and_is_evaluated_in_its_protocol(tiny_model, tmp_path,
                                                                                           capsys):
    from kunlunlab.cli import main
    from kunlunlab.training.pipeline import run_config, train

    cfg = run_config(RECIPE, {"model": tiny_model, "eval.before": False, "hotpot": False,
                              "eval.summary_questions": 0}, smoke=True)
    assert cfg.agent.method == "rex_rag"
    train(cfg, tmp_path)
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["steps"]["sft"] > 0 and state["steps"]["dapo"] >= 1
    rows = read_jsonl(tmp_path / "dapo_rollouts.jsonl")
    assert rows and all({"probe_group_share", "importance_weight_mean", "dead_end_groups"} <= set(r) for r in rows)
    assert all(r["generated"] == r["rollouts"] + r["probes_rolled"] for r in rows)
    records = read_jsonl(tmp_path / "eval_after_world.jsonl")
    assert records and all(r["trajectory"]["protocol"] == "rex_rag" for r in records)
    out = tmp_path / "cli.jsonl"
    assert main(["eval", "--dataset", "world", "--method", "rex_rag", "--limit", "2", "--index-kind", "bm25",
                 "--model", str(tmp_path / "dapo" / "final"), "--out", str(out),
                 "--set", "rollout.max_turn_tokens=16"]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 2 and all(r["trajectory"]["protocol"] == "rex_rag" for r in records)
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["method"] == "rex_rag"
