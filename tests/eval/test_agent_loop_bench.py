"""``python -m kunlunlab.bench agent-loop`` (issue 54's measure of the real loop) at a tiny size on the embedded model:
it counts the model's own tokens of the evaluation ``kunlunlab eval`` runs, and with ``--repeats`` alternates
evaluation and plain ``generate`` runs and reports their medians."""
import json

import pytest

from kunlunlab.bench import AgentLoopBenchConfig, bench_agent_loop, main
from kunlunlab.eval.harness import EvalConfig, evaluate

pytestmark = pytest.mark.slow


def test_the_agent_loop_benchmark_counts_the_evaluations_model_tokens_in_each_repeat(tmp_path):
    out = bench_agent_loop(AgentLoopBenchConfig(methods="agent", questions=2, batch=2, repeats=3))

    records = tmp_path / "agent.jsonl"
    evaluate(EvalConfig(dataset="world", method="agent", limit=2, batch_size=2), records, progress=False)
    completion = sum(len(json.loads(line)["trajectory"]["completion_ids"])
                     for line in records.read_text().splitlines())
    agent = out["agent"]
    assert out["repeats"] == 3 and len(agent["runs"]) == 3
    # greedy: every repeat generates what `kunlunlab eval` generates (no search here, so no appended tokens)
    assert [run["model_tokens"] for run in agent["runs"]] == [completion] * 3 == [agent["model_tokens"]] * 3
    for key in ("seconds", "tokens_per_s", "plain_tokens_per_s", "ratio"):
        assert agent[key] == sorted(run[key] for run in agent["runs"])[1]  # the median of three
    assert all(run["plain_tokens_per_s"] > 0 and run["seconds"] > 0 for run in agent["runs"])


def test_a_repeat_count_below_one_is_one_line():
    with pytest.raises(SystemExit) as stop:
        main(["agent-loop", "--repeats", "0"])
    assert str(stop.value) == "agent-loop: --questions, --batch and --repeats must be at least 1 (got 80, 20, 0)"
