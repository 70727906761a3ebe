"""A released peer checkpoint runs with the prompt it was trained on: a base model (no chat template) gets the peer's
raw base-model prompt, an instruct model its messages through the chat template, unless the user says which."""
import copy
from types import SimpleNamespace

import pytest

from kunlunlab.agent.methods import MethodConfig, make_method
from kunlunlab.agent.protocols.r1_searcher import R1_SEARCHER_BASE
from kunlunlab.agent.protocols.research import RESEARCH_BASE

QUESTION = "Who directed Jaws?"


@pytest.fixture(scope="module")
def tokenizers(backend):
    base = copy.deepcopy(backend.tokenizer)
    base.chat_template = None  # as a Qwen2.5-base checkpoint's tokenizer has none
    return {"instruct": backend.tokenizer, "base": base}


def _prompt(method: str, tokenizer, kind: str = "auto") -> str:
    agent = make_method(method, SimpleNamespace(tokenizer=tokenizer, name="m"), None, MethodConfig(prompt=kind))
    return tokenizer.decode(agent._prompt_ids(QUESTION, None, agent._prefix()))


@pytest.mark.parametrize("method, expected", [
    ("research", f"{RESEARCH_BASE} User: {QUESTION}. Assistant:"),
    ("r1_searcher", f"{R1_SEARCHER_BASE}User:{QUESTION}\nAssistant: <think>"),  # its prefix opens the think span
])
def test_a_base_model_gets_the_peers_raw_base_prompt(tokenizers, method, expected):
    assert _prompt(method, tokenizers["base"]) == expected
    assert _prompt(method, tokenizers["instruct"], "base") == expected  # asked for explicitly


def test_an_instruct_model_gets_the_chat_template_unless_base_is_asked(tokenizers):
    chat = _prompt("research", tokenizers["instruct"])
    assert chat.startswith("<|im_start|>system\nYou are a helpful assistant that can solve")
    assert chat.endswith(f"<|im_start|>user\n{QUESTION}<|im_end|>\n<|im_start|>assistant\n")
    with pytest.raises(ValueError, match="prompt must be one of"):
        MethodConfig(prompt="raw")


def test_the_eval_command_takes_the_prompt_kind(tmp_path):
    from kunlunlab.cli import build_parser, eval_config_from_args

    args = build_parser().parse_args(["eval", "--dataset", "world", "--method", "research", "--prompt", "base"])
    assert eval_config_from_args(args).prompt == "base"
