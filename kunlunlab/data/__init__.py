"""Data: uniform QA/passage records, the synthetic multi-hop world, loaders for real layouts."""
from kunlunlab.data.loaders import BENCHMARK_FILES, corpus_from_examples, load_benchmark, load_corpus, load_qa
from kunlunlab.data.questions import QUESTION_TYPES, make_questions, make_world_and_questions
from kunlunlab.data.types import DataFormatError, Hop, Passage, QAExample
from kunlunlab.data.world import World

__all__ = ["BENCHMARK_FILES", "DataFormatError", "Hop", "Passage", "QAExample", "QUESTION_TYPES", "World",
           "corpus_from_examples", "load_benchmark", "load_corpus", "load_qa", "make_questions",
           "make_world_and_questions"]
