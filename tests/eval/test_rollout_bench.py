"""``python -m kunlunlab.bench rollout`` at a tiny size on the embedded model: its plain side decodes as many tokens
as the rollout's model wrote (the embedded model ends its turn with EOS right after ``</search>``; a plain side
that stopped there decoded about a quarter of them and its tokens/s was mostly its prompt's prefill)."""
import pytest

from kunlunlab.bench import RolloutBenchConfig, bench_rollout

pytestmark = pytest.mark.slow


def test_the_rollout_benchmarks_plain_side_decodes_the_rollouts_token_count():
    out = bench_rollout(RolloutBenchConfig(batch=2, searches=1, n=300, stie_rounds=16))
    assert out["searches_per_question"] == 1.0 and out["appended_tokens"] > 0
    assert out["plain_tokens"] == out["model_tokens"] > 2 * 16  # more than a search turn's tokens a row
    assert out["ratio"] == pytest.approx(out["tokens_per_s_rollout"] / out["tokens_per_s_plain"], abs=0.01)
    # the appended tokens prefilled alone take time, so plain + that prefill is slower than plain
    assert out["appends_prefill_s"] > 0 and 0 < out["ratio_plain_plus_prefill"] < 1
