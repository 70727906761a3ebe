"""The evaluation suite's data (kunlunlab.suite.suite_data): held-out questions only."""
from __future__ import annotations

import json

import pytest

from kunlunlab.suite import SuiteConfig, suite_data


def test_2wiki_questions_a_checkpoint_trained_on_are_refused(tmp_path, data_dir):
    config = tmp_path / "train.json"
    config.write_text(json.dumps({"world_passages": 600, "train_questions": 20, "twowiki": True,
                                  "twowiki_heldout": 50}))
    ok = suite_data(SuiteConfig(train_config=str(config), datasets=("2wikimultihopqa",), limit=50))
    assert [q.id for q in ok["2wikimultihopqa"][0]][-1] == "2wikimultihopqa-49"
    with pytest.raises(ValueError, match="at most that many"):
        suite_data(SuiteConfig(train_config=str(config), datasets=("2wikimultihopqa",), limit=51))


def test_world_questions_are_the_training_configs_held_out_split(tmp_path):
    from kunlunlab.training.config import load_config
    from kunlunlab.training.pipeline import load_training_data

    config = tmp_path / "train.json"
    config.write_text(json.dumps({"world_passages": 600, "train_questions": 30, "hotpot": False}))
    questions, passages = suite_data(SuiteConfig(train_config=str(config), datasets=("world",),
                                                 world_questions=12))["world"]
    train = {q.question for q in load_training_data(load_config(config)).train}
    assert len(questions) == 12 and not train & {q.question for q in questions}
    assert len(passages) == 600
