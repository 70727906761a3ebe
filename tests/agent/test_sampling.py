"""Sampling in the local session: the inverse-CDF draw follows the distribution it is given, never draws a token of
probability zero, and a seeded session samples the same tokens again."""
import torch

from kunlunlab.agent.backends import SamplingConfig, text_ids
from kunlunlab.agent.transformers_backend import TransformersBackend, inverse_cdf_sample
from kunlunlab.models import load_llm
from tiny_training import tiny_llama


def test_inverse_cdf_draws_follow_the_probabilities_and_skip_impossible_tokens():
    probs = torch.tensor([[0.1, 0.0, 0.6, 0.3, 0.0]] * 4 + [[0.0, 0.0, 0.0, 0.0, 1.0]])
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(5, 5)
    draws = 4000
    for _ in range(draws):
        chosen = inverse_cdf_sample(probs, generator)
        counts[torch.arange(5), chosen] += 1
    shares = counts[:4].sum(0) / (4 * draws)
    assert torch.allclose(shares, torch.tensor([0.1, 0.0, 0.6, 0.3, 0.0]), atol=0.015)
    assert counts[:4, 1].sum() == 0 and counts[:4, 4].sum() == 0  # probability zero: never drawn
    assert counts[4].tolist() == [0, 0, 0, 0, draws]  # all mass on the last token: always it


def test_a_seeded_session_samples_the_same_tokens_again_and_another_seed_others():
    tokenizer = load_llm()[1]
    backend = TransformersBackend(model=tiny_llama(tokenizer, seed=5), tokenizer=tokenizer, dtype="float32")
    prompts = [text_ids(tokenizer, "Question one\n"), text_ids(tokenizer, "Another question\n")]

    def sample(seed: int) -> list[list[int]]:
        session = backend.open(prompts, SamplingConfig(temperature=1.0, seed=seed))
        out = session.generate([0, 1], 24, stop=())
        return [out[r].token_ids for r in (0, 1)]

    assert sample(3) == sample(3)
    assert sample(3) != sample(4)
