"""An evaluation through a busy ``kunlunlab serve-llm`` completes with every record (issue 55): three evaluations
share one server whose queue holds nothing behind the generation in flight (``max_queue=0``), so most of their
requests meet a 503 with ``Retry-After: 1``; each client waits and asks again, and no question is lost."""
import threading
import time
from dataclasses import replace

from kunlunlab.agent.backends import Segment, text_ids
from kunlunlab.agent.server import create_app
from kunlunlab.eval.harness import EvalConfig, evaluate, load_data, make_backend
from kunlunlab.http.server import ServerThread
from kunlunlab.models import resolve_llm
from kunlunlab.paths import read_jsonl

ANSWER = "The answer is \\boxed{Qxzzyv}."
QUESTIONS, EVALUATIONS = 4, 3


class SteadyBackend:
    """Answers every prompt with :data:`ANSWER` after ``seconds``: long enough for the evaluations to collide."""

    name = "steady-stand-in"

    def __init__(self, tokenizer, seconds: float):
        self.tokenizer, self.seconds, self.generations = tokenizer, seconds, 0

    def open(self, prompts, sampling=None):
        outer = self

        class Session:
            def generate(self, rows, max_new_tokens, stop=(), cancel=None):
                time.sleep(outer.seconds)
                outer.generations += 1
                ids = text_ids(outer.tokenizer, ANSWER)[:max_new_tokens]
                return {r: Segment(ids, [-0.1] * len(ids), outer.tokenizer.decode(ids), "stop", None) for r in rows}

        return Session()


def test_an_evaluation_through_a_full_serve_llm_queue_loses_no_record(tmp_path):
    from transformers import AutoTokenizer

    config = EvalConfig(dataset="world", method="naive_gen", limit=QUESTIONS, model=resolve_llm(None),
                        index_kind="bm25", batch_size=1, world_passages=300)
    examples, passages = load_data(config)
    stand_in = SteadyBackend(AutoTokenizer.from_pretrained(config.model), seconds=0.2)
    app = create_app(stand_in, max_queue=0)
    summaries, failures = {}, []
    with ServerThread(app) as url:
        config = replace(config, llm_url=url)
        backends = [make_backend(config) for _ in range(EVALUATIONS)]

        def run(i: int) -> None:
            try:
                summaries[i] = evaluate(config, tmp_path / f"eval{i}.jsonl", backend=backends[i], examples=examples,
                                        passages=passages, progress=False)
            except Exception as err:  # reported below, with the others' numbers
                failures.append(f"evaluation {i}: {type(err).__name__}: {err}")

        start = time.perf_counter()
        threads = [threading.Thread(target=run, args=(i,)) for i in range(EVALUATIONS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        seconds = time.perf_counter() - start
    assert not failures, failures
    rejected = app.state.queue.counts["rejected"]
    retried = sum(b.service.stats["retried"].get(503, 0) for b in backends)
    waited = sum(b.service.stats["waited_s"] for b in backends)
    print(f"\nbusy serve-llm: {rejected} requests rejected with 503, {retried} retried; {waited:.1f} s waited in "
          f"all; {EVALUATIONS} evaluations of {QUESTIONS} questions in {seconds:.1f} s")
    assert rejected >= 1  # the queue was full: the evaluations did collide
    assert retried == rejected  # every rejected request was sent again, none given up
    assert waited >= rejected * 1.0  # each wait at least the second the server asked for
    for i in range(EVALUATIONS):
        records = read_jsonl(tmp_path / f"eval{i}.jsonl")
        assert [r["id"] for r in records] == [ex.id for ex in examples]  # every question, in order
        assert {r["prediction"] for r in records} == {"Qxzzyv"} and summaries[i]["n"] == QUESTIONS
    assert stand_in.generations == EVALUATIONS * QUESTIONS  # each question generated once: none lost, none doubled
