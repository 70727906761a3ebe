"""The generation backend's packed linear layers (oneDNN's weight layout on a CPU in bfloat16): the same tokens and
log-probs as plain linears, training untouched, and a borrowed model left alone."""
import pytest
import torch

from kunlunlab.agent.backends import text_ids
from kunlunlab.agent.packed_linear import _packing_agrees, pack_linears, packed_linear_class
from kunlunlab.agent.transformers_backend import TransformersBackend
from kunlunlab.models import load_llm
from tiny_training import tiny_llama


@pytest.fixture(scope="module")
def tokenizer():
    return load_llm()[1]


def _needs_packing():
    probe = torch.nn.Linear(64, 96).to(torch.bfloat16)
    if not _packing_agrees(probe):
        pytest.skip("this CPU has no oneDNN bfloat16 kernel whose packed product equals F.linear's")


def _unpacked(model):
    for module in model.modules():
        if type(module) is packed_linear_class():
            module.__class__ = torch.nn.Linear


def _generate(backend, tokenizer):
    prompts = [text_ids(tokenizer, "Question one\n"), text_ids(tokenizer, "Another, much longer question two\n")]
    session = backend.open(prompts)
    first = session.generate([0, 1], {0: 6, 1: 11}, stop=())
    session.append({0: text_ids(tokenizer, "\n<result>\n(1) Paris is the capital.\n</result>\n")})
    second = session.generate([0, 1], {0: 8, 1: 8}, stop=())
    return ([first[r].token_ids + second[r].token_ids for r in (0, 1)],
            [first[r].logprobs + second[r].logprobs for r in (0, 1)])


def test_an_owned_bfloat16_copy_generates_on_packed_weights_exactly_what_plain_linears_generate(tokenizer):
    """The backend's bfloat16 copy of a float32 policy runs every linear layer (the head included) on packed weights
    and generates, through a prefill, decode steps and an appended block, the same tokens with log-probs equal to
    the last bit as the same copy on plain ``F.linear``; the policy itself is not touched."""
    _needs_packing()
    policy = tiny_llama(tokenizer, seed=3)
    backend = TransformersBackend(model=policy, tokenizer=tokenizer, dtype="bfloat16")
    linears = [m for m in backend.model.modules() if isinstance(m, torch.nn.Linear)]
    assert backend.packed_linears == len(linears) == 2 * 7 + 1
    assert all(type(m) is packed_linear_class() for m in linears)
    assert all(type(m) is torch.nn.Linear for m in policy.modules() if isinstance(m, torch.nn.Linear))
    packed = _generate(backend, tokenizer)
    _unpacked(backend.model)
    plain = _generate(backend, tokenizer)
    assert packed[0] == plain[0]
    assert packed[1] == plain[1]  # exactly: the same arithmetic, not a close one


def test_a_packed_layer_trains_on_its_plain_weight_and_follows_in_place_changes():
    """With gradients on, a packed layer is the plain layer (gradients reach its weight); a weight changed in place
    (as ``load_state_dict`` does) is packed again before the next product, so no stale weights are ever used."""
    _needs_packing()
    layer = torch.nn.Sequential(torch.nn.Linear(64, 96)).to(torch.bfloat16)
    reference = torch.nn.Linear(64, 96).to(torch.bfloat16)
    reference.load_state_dict(layer[0].state_dict())
    assert pack_linears(layer) == 1
    x = torch.randn(5, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    layer(x).float().sum().backward()
    reference(x).float().sum().backward()
    assert torch.equal(layer[0].weight.grad, reference.weight.grad)
    with torch.no_grad():
        layer[0].weight.mul_(-2.0)
        reference.weight.mul_(-2.0)
        assert torch.equal(layer(x), reference(x))
        assert torch.equal(layer(x[:1]), reference(x[:1]))  # one row, as at a decode step


def test_a_borrowed_or_float32_model_keeps_plain_linears(tokenizer):
    """A training model the backend borrows (already in the generation dtype) is never packed: the trainer keeps
    its own layers; float32 is not packed either (oneDNN's float32 kernel rounds unlike MKL's)."""
    borrowed = tiny_llama(tokenizer).to(torch.bfloat16)
    assert TransformersBackend(model=borrowed, tokenizer=tokenizer, dtype="bfloat16").packed_linears == 0
    assert all(type(m) is torch.nn.Linear for m in borrowed.modules() if isinstance(m, torch.nn.Linear))
    owned_float = TransformersBackend(model=tiny_llama(tokenizer).to(torch.bfloat16), tokenizer=tokenizer,
                                      dtype="float32")
    assert owned_float.packed_linears == 0
    assert pack_linears(torch.nn.Sequential(torch.nn.Linear(8, 8))) == 0  # float32 weights
