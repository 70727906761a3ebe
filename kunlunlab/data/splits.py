"""Which questions train and which are held out: the synthetic world's training and held-out questions, the
HotpotQA distractor halves, 2Wiki questions with silver chains, and real RL prompts (``data.rl_prompts``).

Training, evaluation, the suite and the notebooks read their splits here, so evaluating a run never imports the
trainer: a run's ``train_config.json`` gives the :class:`Splits` (``TrainConfig.splits``) and the same call
returns the same questions, none of the held-out ones a training question."""
from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import datasets

from kunlunlab.data.evidence import link_evidence
from kunlunlab.data.loaders import corpus_from_examples, load_benchmark, load_named_corpus, load_qa
from kunlunlab.data.questions import make_questions, summary_questions
from kunlunlab.data.types import DataFormatError, QAExample
from kunlunlab.data.world import World
from kunlunlab.paths import shared_data_dir

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Splits:
    """What to draw. The world's questions come from its seeds (the same for every run with them); the held-out
    pool is drawn with another seed and every question also in the training set is dropped."""

    world_passages: int = 2000
    world_seed: int = 0
    train_questions: int = 400
    summary_share: float = 0.0          # share of summary-oriented ones (the long-answer mode) among the world's
                                        # training questions, added beside the train_questions factoid ones
    summary_heldout: int = 0            # held-out summary-oriented questions, drawn like the factoid ones
    question_seed: int = 1
    heldout_seed: int = 2
    world_heldout: int = 40
    hotpot: bool = True                 # the HotpotQA distractor sample, when the data folder is present
    hotpot_train_fraction: float = 0.5  # its first half trains, the rest is held out
    hotpot_heldout: int = 20
    twowiki: bool = False               # 2Wiki dev questions with silver evidence chains
    twowiki_heldout: int = 100          # its first N dev questions (what evaluations read) never train
    rl_prompts: str | None = None       # a real RL prompt file (see :func:`load_rl_prompts`)
    rl_prompts_limit: int | None = None
    rl_heldout: int = 20                # its first N questions are held out


@dataclass
class TrainingData:
    world: object
    passages: list
    train: list                 # QAExample, synthetic training questions
    heldout: list               # QAExample, synthetic evaluation questions (disjoint from train)
    hotpot_train: list
    hotpot_heldout: list
    hotpot_passages: list
    twowiki_train: list = field(default_factory=list)     # 2Wiki dev questions with a silver chain
    twowiki_passages: list = field(default_factory=list)  # the 2Wiki paragraph corpus
    rl_train: list = field(default_factory=list)          # rl_prompts questions for DAPO (and SFT)
    rl_heldout: list = field(default_factory=list)        # its first rl_heldout questions, evaluated only
    rl_passages: list = field(default_factory=list)       # the paragraphs rl_prompts examples carry (HotpotQA layout)
    heldout_summary: list = field(default_factory=list)   # held-out summary-oriented world questions


def world_questions(splits: Splits) -> tuple[World, list[QAExample], list[QAExample]]:
    """The synthetic world and its training and held-out factoid questions (no held-out question is a training
    one). ``train_questions`` factoid questions train, and summary-oriented ones are added after them so that they
    make ``summary_share`` of the world's training questions: the factoid training and held-out questions are the
    same whatever the share (a run trained before summary questions existed is evaluated on its own split)."""
    world = World.generate(n_passages=splits.world_passages, seed=splits.world_seed)
    n_summary = n_summary_questions(splits)
    train = make_questions(world, splits.train_questions, seed=splits.question_seed, id_prefix="train")
    if n_summary:
        train += summary_questions(world, n_summary, seed=splits.question_seed, id_prefix="train-summary")
    seen = {q.question for q in train}
    pool = make_questions(world, splits.world_heldout * 2 + 20, seed=splits.heldout_seed, id_prefix="heldout")
    return world, train, [q for q in pool if q.question not in seen][:splits.world_heldout]


def n_summary_questions(splits: Splits) -> int:
    """Summary-oriented training questions beside ``train_questions`` factoid ones: ``summary_share`` of all."""
    if not 0.0 <= splits.summary_share < 1.0:
        raise ValueError(f"summary_share must lie in [0, 1), got {splits.summary_share}")
    return round(splits.train_questions * splits.summary_share / (1.0 - splits.summary_share))


def heldout_summary_questions(world: World, train: list[QAExample], splits: Splits) -> list[QAExample]:
    """``summary_heldout`` summary-oriented questions that are not training questions."""
    if not splits.summary_heldout:
        return []
    seen = {q.question for q in train}
    pool = summary_questions(world, splits.summary_heldout * 2 + 10, seed=splits.heldout_seed,
                             id_prefix="heldout-summary")
    return [q for q in pool if q.question not in seen][:splits.summary_heldout]


def load_splits(splits: Splits) -> TrainingData:
    """Every split ``splits`` asks for; real data missing from the data folder is left out with one warning."""
    world, train, heldout = world_questions(splits)
    hotpot_train, hotpot_heldout, hotpot_passages = [], [], []
    if splits.hotpot and shared_data_dir() is not None:
        examples = load_benchmark("hotpotqa_distractor")
        cut = int(len(examples) * splits.hotpot_train_fraction)
        hotpot_train, hotpot_heldout = examples[:cut], examples[cut:][:splits.hotpot_heldout]
        hotpot_passages = corpus_from_examples(examples)
    elif splits.hotpot:
        log.warning("HotpotQA distractor sample not found (KUNLUNLAB_DATA or ../shared/data): training on the "
                    "synthetic world only")
    twowiki_train, twowiki_passages = [], []
    if splits.twowiki and shared_data_dir() is not None:
        twowiki_passages = load_named_corpus("2wiki")
        # the first `twowiki_heldout` dev questions are what evaluations read (load_benchmark(limit=...))
        twowiki_train = link_evidence(load_benchmark("2wikimultihopqa")[splits.twowiki_heldout:], twowiki_passages)
    elif splits.twowiki:
        log.warning("2Wiki data not found (KUNLUNLAB_DATA or ../shared/data): no 2Wiki trajectories")
    rl_train, rl_heldout, rl_passages = real_rl_prompts(splits)
    return TrainingData(world, world.passages, train, heldout, hotpot_train, hotpot_heldout, hotpot_passages,
                        twowiki_train, twowiki_passages, rl_train, rl_heldout, rl_passages,
                        heldout_summary_questions(world, train, splits))


def real_rl_prompts(splits: Splits) -> tuple[list, list, list]:
    """(training questions, held-out questions, their own paragraphs) of ``rl_prompts``: the first
    ``rl_heldout`` questions are held out, the rest train; paragraphs only where the layout carries them."""
    if not splits.rl_prompts:
        return [], [], []
    examples = [ex for ex in load_rl_prompts(splits.rl_prompts, limit=splits.rl_prompts_limit) if ex.answers]
    if len(examples) <= splits.rl_heldout:
        raise ValueError(f"data.rl_prompts {splits.rl_prompts}: {len(examples)} questions with answers, not more "
                         f"than data.rl_heldout={splits.rl_heldout} held out: nothing is left to train on")
    with_context = [ex for ex in examples if ex.context]
    return (examples[splits.rl_heldout:], examples[:splits.rl_heldout],
            corpus_from_examples(with_context) if with_context else [])


def load_rl_prompts(path: str | Path, limit: int | None = None) -> list[QAExample]:
    """Questions with gold answers for RL from ReSearch / ZeroSearch / Search-R1 data: the veRL layout
    (``prompt``, ``reward_model.ground_truth``, ``extra_info``) as jsonl or parquet, or any QA layout
    :func:`~kunlunlab.data.loaders.load_qa` reads."""
    path = Path(path)
    if path.suffix != ".parquet":
        return load_qa(path, limit=limit)
    if not path.is_file():
        raise FileNotFoundError(f"data file not found: {path}")
    table = datasets.Dataset.from_parquet(str(path))
    if "reward_model" not in table.column_names or "prompt" not in table.column_names:
        raise DataFormatError(path, f"expected the veRL layout (prompt, reward_model, ...), got columns "
                                    f"{table.column_names}")
    rows = table.select(range(min(limit, len(table)))) if limit else table
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for row in rows:
            f.write(json.dumps(row, default=str) + "\n")
    try:
        return load_qa(f.name, layout="searchr1")
    finally:
        Path(f.name).unlink()
