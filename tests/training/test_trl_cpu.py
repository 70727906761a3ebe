"""TRL's fused LM head scoring labelled positions only on CPU: the same loss and gradients as TRL's own CPU path."""
import pytest


def _tiny_model(seed: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    return LlamaForCausalLM(config)


def _loss_and_grads(model, ids, mask, labels):
    out = model(input_ids=ids, attention_mask=mask, labels=labels, fused_lm_head=True)
    out.loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return out, grads


def test_labelled_positions_only_gives_trl_s_loss_gradients_and_metrics(monkeypatch):
    import torch
    import trl.trainer.utils as trl_utils
    from trl.trainer.utils import add_fused_lm_head

    from kunlunlab.training.trl_cpu import score_labelled_positions_on_cpu

    from trl.kernels import chunked_logprob

    # TRL's own switch, whether or not a training test in this process already replaced it (restored after)
    monkeypatch.setattr(trl_utils, "_use_triton", chunked_logprob._use_triton)
    assert not trl_utils._use_triton(torch.device("cpu"))  # TRL itself scores every position on CPU

    ids = torch.randint(0, 300, (2, 12))
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # left padding
    labels = ids.clone()
    labels[:, :5] = -100  # the prompt
    labels[0, 8:10] = -100  # a retrieved block inside the completion
    labels[1, :3] = -100

    models = [_tiny_model(0), _tiny_model(0)]
    for m in models:
        add_fused_lm_head(m, outputs=("log_probs", "entropy", "is_top1"))
    reference, reference_grads = _loss_and_grads(models[0], ids, mask, labels)

    assert score_labelled_positions_on_cpu() and score_labelled_positions_on_cpu()  # idempotent
    assert trl_utils._use_triton(torch.device("cpu"))
    compact, compact_grads = _loss_and_grads(models[1], ids, mask, labels)

    assert compact.loss.item() == pytest.approx(reference.loss.item(), rel=1e-5)
    labelled = labels[:, 1:] != -100
    assert torch.equal(compact.label_mask, labelled)
    assert torch.allclose(compact.log_probs, reference.log_probs, atol=1e-5)
    assert torch.allclose(compact.entropy[labelled], reference.entropy[labelled], atol=1e-5)
    assert torch.equal(compact.is_top1[labelled], reference.is_top1[labelled])
    assert compact.log_probs[~labelled].abs().sum() == 0  # unlabelled positions carry nothing
    assert reference_grads.keys() == compact_grads.keys() and len(compact_grads) > 0
    for name, grad in reference_grads.items():
        assert torch.allclose(compact_grads[name], grad, atol=1e-5), name
