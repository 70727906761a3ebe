"""Each peer's recipe trains at smoke size through ``kunlunlab train --smoke --config .../peers/<name>.json``: its SFT
data is written in its protocol, its RL stage rolls out in it and scores with its own reward, and its evaluation
runs its own agent, so the checkpoint is what the Table 2 row of that peer measures. None of that depends on what the
model learns, so the recipes train a tiny random model here (``tiny_training.py``), which generates fast to every
budget; the embedded model trains in them in make run's notebook 08 and the kept Table 2 runs."""
import json

import pytest

from kunlunlab.agent.protocols import get_protocol
from kunlunlab.cli import main
from kunlunlab.paths import PROJECT_ROOT, read_jsonl

pytestmark = pytest.mark.slow

# what each protocol's SFT trajectories show (the peer's own tags) and what they never show (this project's)
MARKS = {"search_r1": ("<information>Doc 1(Title:", "<answer>"), "research": (" <result>\n", "\\boxed{"),
         "r1_searcher": ("<|begin_of_query|>", "<|begin_of_documents|>\n(1)")}


@pytest.mark.parametrize("name", sorted(MARKS))
def test_a_peer_recipe_trains_in_its_own_protocol_at_smoke_size(name, tmp_path, tiny_model):
    config = PROJECT_ROOT / f"experiments/configs/training/peers/{name}.json"
    code = main(["train", "--smoke", "--config", str(config), "--run-dir", str(tmp_path),
                 "--set", "eval.before=false", "hotpot=false", "eval.summary_questions=0", f"model={tiny_model}"])
    assert code == 0
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["steps"]["sft"] > 0 and state["steps"]["dapo"] == 1
    protocol = get_protocol(name)
    trajectories = read_jsonl(tmp_path / "trajectories.jsonl")
    texts = ["".join(s["text"] for s in t["segments"]) for t in trajectories]
    for mark in MARKS[name]:
        assert any(mark in text for text in texts), mark
    assert not any("<short_answer>" in text or "<result>\n(1)" in text for text in texts)
    assert all(t["prompt_messages"] == protocol.messages(t["question"], t["background"]) for t in trajectories)
    # the rollouts ran in the protocol and its reward scored them (TRL logs each reward function by name)
    log = read_jsonl(tmp_path / "dapo_log.jsonl")
    rewards = {k for row in log for k in row if k.startswith("rewards/")}
    assert any(name.split("_")[0] in k for k in rewards), rewards
    records = read_jsonl(tmp_path / "eval_after_world.jsonl")
    assert records and all(r["trajectory"]["protocol"] == name for r in records)
    agent = json.loads((tmp_path / "dapo" / "final" / "kunlunlab_agent.json").read_text())
    assert agent["method"] == name
