"""Shared fixtures: one small synthetic world embedded once per session (embedding is the slow part)."""
from __future__ import annotations

import collections
import os
import shutil

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# `make test` runs the suite in pytest-xdist workers: each gets its share of the cores for torch, FAISS and the
# processes it starts (set before torch is imported), so two workers on two cores do not oversubscribe them
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    os.environ.setdefault("OMP_NUM_THREADS",
                          str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))))

import numpy as np
import pytest

from kunlunlab.data import World, make_questions
from kunlunlab.paths import shared_data_dir


def pytest_collection_modifyitems(config, items):
    """Files with the most slow tests first, each file's tests in their own order: pytest-xdist's ``--dist loadfile``
    hands whole files to the workers in collection order, and a long file handed out late ran alone at the end
    while the other worker sat idle (the notebook studies, 6 minutes, last in a fresh run: 160 % CPU on 2 cores)."""
    slow = collections.Counter(item.path for item in items if item.get_closest_marker("slow"))
    first_seen = {path: i for i, path in enumerate(dict.fromkeys(item.path for item in items))}
    items.sort(key=lambda item: (-slow[item.path], first_seen[item.path]))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> str:
    """A tiny random model with the embedded tokenizer, saved as a folder any ``model`` parameter takes
    (tests/tiny_training.py): for the tests of what a run does, which need a model that generates fast."""
    from tiny_training import save_tiny_llama

    return save_tiny_llama(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="module")
def module_scratch(tmp_path_factory):
    """Makes folders for a module's shared fixtures and removes them when the module ends: a training run writes
    models of ~0.5 GB, and pytest keeps ``tmp_path_factory``'s folders to the end of the session (a CI machine
    ran out of disk)."""
    made = []

    def make(name: str):
        made.append(tmp_path_factory.mktemp(name))
        return made[-1]

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="session")
def world():
    return World.generate(n_passages=1500, seed=7)


@pytest.fixture(scope="session")
def questions(world):
    return make_questions(world, 40, seed=1)


@pytest.fixture(scope="session")
def encoder():
    from kunlunlab.retrieval import Encoder

    return Encoder()


@pytest.fixture(scope="session")
def vectors(world, encoder):
    from kunlunlab.retrieval import corpus_embeddings

    return corpus_embeddings(encoder, world.passages, progress=False)


@pytest.fixture(scope="session")
def query_vectors(questions, encoder):
    texts = list(dict.fromkeys(h.question for q in questions for h in q.chain))
    return encoder.encode_queries(texts)


@pytest.fixture(scope="session")
def data_dir():
    root = shared_data_dir()
    if root is None:
        pytest.skip("benchmark data folder (../shared/data) not present")
    return root


def exact_top(vectors: np.ndarray, queries: np.ndarray, k: int) -> np.ndarray:
    return np.argsort(-(queries @ vectors.T), axis=1)[:, :k]


@pytest.fixture(scope="session")
def backend():
    from kunlunlab.agent.transformers_backend import TransformersBackend

    return TransformersBackend()


@pytest.fixture(scope="session")
def world_retriever(world):
    from kunlunlab.retrieval import IndexConfig, build_retriever

    return build_retriever(world.passages, IndexConfig(kind="bm25"))
