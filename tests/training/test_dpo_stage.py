"""Step-level DPO (ReasonRAG, arXiv 2505.14069) through TRL's DPOTrainer on the embedded SmolLM2: the ids TRL
trains on are exactly the pre-tokenised prompt/chosen/rejected ids (no EOS after ``</search>``, no
re-tokenisation), and the stage resumes from its last checkpoint."""
import pytest

from kunlunlab.agent.backends import chat_prompt_ids, text_ids
from kunlunlab.agent.rollout import result_block
from kunlunlab.training import dpo
from kunlunlab.training.dpo import DPOStageConfig, dpo_dataset, run_dpo

SYSTEM = "Answer by searching."


def hand_pairs(tok):
    root = chat_prompt_ids(tok, [{"role": "system", "content": SYSTEM},
                                 {"role": "user", "content": "Who directed Alpha?"}], "<think>")
    search = text_ids(tok, "I need the director.</think>\n<search><query>Alpha director</query></search>")
    guess = text_ids(tok, "I guess.</think>\n<short_answer>\\boxed{Rome}</short_answer>")
    deeper = root + search + text_ids(tok, result_block([["Alpha was directed by Bob Lee."]], ["Alpha director"], 200))
    answer = text_ids(tok, "Found it.</think>\n<short_answer>\\boxed{Bob Lee}</short_answer>")
    again = text_ids(tok, "Check again.</think>\n<search><query>Alpha film</query></search>")
    return [{"prompt_ids": root, "chosen_ids": search, "rejected_ids": guess, "chosen_text": "x"},
            {"prompt_ids": deeper, "chosen_ids": answer, "rejected_ids": again},
            {"prompt_ids": deeper, "chosen_ids": again, "rejected_ids": guess}]


def fresh_model():
    from kunlunlab.models import load_llm
    from kunlunlab.training.sft import freeze_for_sft

    model, tok = load_llm()
    freeze_for_sft(model, 1)  # small optimizer state: quick checkpoints
    return model, tok


@pytest.mark.slow
def test_dpo_trains_on_exactly_the_given_ids_and_resumes(tmp_path, monkeypatch):
    trainer_cls = dpo._trainer_class()
    batches = []
    original = trainer_cls._compute_loss

    def recording(self, model, inputs, return_outputs):
        batches.append({k: v.detach().cpu().clone() for k, v in inputs.items() if hasattr(v, "cpu")})
        return original(self, model, inputs, return_outputs)

    monkeypatch.setattr(trainer_cls, "_compute_loss", recording)
    model, tok = fresh_model()
    pairs = hand_pairs(tok)
    assert len(dpo_dataset(pairs, max_length=len(pairs[1]["prompt_ids"]) + 5)) == 1  # longer pairs dropped, not cut
    cfg = DPOStageConfig(beta=0.3, learning_rate=1e-5, steps=1, batch_size=3, save_steps=1, max_length=512)
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    trainer = run_dpo(model, tok, pairs, cfg, tmp_path / "prl")
    assert trainer.state.global_step == 1 and trainer.args.loss_type == ["sigmoid"] and trainer.args.beta == 0.3
    assert (tmp_path / "prl" / "checkpoint-1").is_dir()
    assert any(not p.equal(before[n]) for n, p in model.named_parameters() if n in before)

    (batch,) = batches
    n = len(pairs)
    rows, masks = [], []
    for r in range(2 * n):  # TRL's batch: the chosen rows, then the rejected rows
        length = int(batch["attention_mask"][r].sum())
        rows.append(batch["input_ids"][r, :length].tolist())
        masks.append(batch["completion_mask"][r, :length].tolist())
    want_chosen = sorted(p["prompt_ids"] + p["chosen_ids"] for p in pairs)
    want_rejected = sorted(p["prompt_ids"] + p["rejected_ids"] for p in pairs)
    assert sorted(rows[:n]) == want_chosen and sorted(rows[n:]) == want_rejected  # no EOS, no re-tokenisation
    for ids, mask in zip(rows, masks):
        pair = next(p for p in pairs if ids[:len(p["prompt_ids"])] == p["prompt_ids"]
                    and ids[len(p["prompt_ids"]):] in (p["chosen_ids"], p["rejected_ids"]))
        assert mask == [0] * len(pair["prompt_ids"]) + [1] * (len(ids) - len(pair["prompt_ids"]))
    search_row = next(ids for ids in rows if ids == pairs[0]["prompt_ids"] + pairs[0]["chosen_ids"])
    assert tok.decode(search_row[-6:]).endswith("</search>") and search_row[-1] != tok.eos_token_id

    # a new process: fresh weights, more steps, the same folder -> resumes at step 1 and trains one more step
    batches.clear()
    model, tok = fresh_model()
    resumed = run_dpo(model, tok, pairs, DPOStageConfig(beta=0.3, learning_rate=1e-5, steps=2, batch_size=3,
                                                        save_steps=1, max_length=512), tmp_path / "prl")
    assert resumed.state.global_step == 2 and len(batches) == 1
    assert (tmp_path / "prl" / "checkpoint-2").is_dir()


def test_dpo_config_validates():
    with pytest.raises(ValueError):
        DPOStageConfig(beta=0)
    with pytest.raises(ValueError, match="no preference pair"):
        dpo_dataset([])
