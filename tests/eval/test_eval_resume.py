"""Evaluation streams its records (issue 44): every finished question is on disk when a retrieval service, a
generation server or the judge's server dies, or Ctrl-C stops the run; a rerun into the same file resumes after
the last complete record and redoes nothing before it; a changed configuration, other questions or a file it
cannot vouch for are refused. The services are killed on a request count, so what a fault leaves is known
before the run: with batches of 2, a service that dies on the third batch's request leaves exactly 4 records."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections import Counter
from dataclasses import replace
from functools import partial

import pytest
from fastapi import FastAPI
from fastapi.responses import JSONResponse

import kunlunlab.eval.harness as harness
from kunlunlab.agent.methods import METHODS
from kunlunlab.agent.backends import Segment, text_ids
from kunlunlab.agent.errors import GenerationServiceError
from kunlunlab.agent.rollout import RolloutConfig
from kunlunlab.cli import main
from kunlunlab.eval.harness import EvalConfig, EvalRetrievalError, evaluate, load_examples
from kunlunlab.eval.records import RecordsConflict, kept_records, records_config_path, records_of_same_evaluation
from kunlunlab.eval.judge import LLMJudge
from kunlunlab.paths import PROJECT_ROOT
from kunlunlab.retrieval import IndexConfig, build_retriever
from kunlunlab.http.client import free_port
from kunlunlab.http.server import ServerThread
from kunlunlab.retrieval.service import create_app
from scripted import PassiveSession

N, BATCH = 8, 2  # 8 world questions in batches of 2


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from kunlunlab.models import resolve_llm

    return AutoTokenizer.from_pretrained(resolve_llm(None))


@pytest.fixture(scope="module")
def world_eval():
    """The 8 questions and the corpus of ``kunlunlab eval --dataset world --limit 8``, a BM25 index over it."""
    examples, passages = load_examples(EvalConfig(dataset="world", limit=N))
    return examples, build_retriever(passages, IndexConfig(kind="bm25"))


def replies_for(examples) -> dict[str, str]:
    """The stand-in model's answer to each question: the gold answer for even question numbers, else a wrong one
    (so EM is 0.5 on any even number of questions, and the judge has a wrong answer to grade in every batch)."""
    return {ex.question: ex.answers[0] if i % 2 == 0 else "unknown" for i, ex in enumerate(examples)}


def question_in(text: str, questions) -> str:
    found = [q for q in questions if q in text]
    assert len(found) == 1, text[-400:]
    return found[0]


def last_line(stderr: str) -> str:
    """The last line a terminal shows (progress bars rewrite theirs with carriage returns)."""
    shown = [line.split("\r")[-1] for line in stderr.split("\n")]
    return [line for line in shown if line.strip()][-1]


def record_ids(path) -> list[str]:
    return [json.loads(line)["id"] for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------------- stand-ins
class Answering:
    """A local generation backend that answers each prompt from the question in it (``replies``), boxed as the
    baselines ask, and logs the questions of every call; ``fail`` (questions of a call -> an exception or None)
    makes a call fail as a dying server or Ctrl-C would. ``boxed=False`` replies as a judge does."""

    def __init__(self, tokenizer, replies: dict[str, str], name="answering-standin", fail=None, boxed=True):
        self.tokenizer, self.replies, self.name, self.fail, self.boxed = tokenizer, replies, name, fail, boxed
        self.calls: list[list[str]] = []

    @property
    def answered(self) -> list[str]:
        return [q for call in self.calls for q in call]

    def open(self, prompts, sampling=None):
        outer = self

        class Session(PassiveSession):
            def generate(self, rows, max_new_tokens, stop=()):
                rows = list(rows)
                questions = [question_in(outer.tokenizer.decode(prompts[r]), outer.replies) for r in rows]
                error = outer.fail(questions) if outer.fail else None
                if error is not None:
                    raise error
                outer.calls.append(questions)
                out = {}
                for r, q in zip(rows, questions):
                    text = f"\\boxed{{{outer.replies[q]}}}" if outer.boxed else outer.replies[q]
                    ids = text_ids(outer.tokenizer, text)
                    out[r] = Segment(ids, [-0.1] * len(ids), text, "eos")
                return out

        return Session()


class Search:
    """The evaluation's retriever (BM25 over the world): dies, as a service past its retries, on the first search
    that asks about question ``die_from`` or later while ``dead``; logs every query."""

    def __init__(self, retriever, examples, die_from: int | None = None):
        self.retriever, self.passages = retriever, retriever.passages
        self.doomed = [ex.question for ex in examples[die_from:]] if die_from is not None else []
        self.queries: list[str] = []

    def search(self, queries, k=5):
        if any(q in query for q in self.doomed for query in queries):
            raise EvalRetrievalError("retrieval service at http://127.0.0.1:1 is unavailable after 3 attempts")
        self.queries += queries
        return self.retriever.search(queries, k)


class Killable:
    """``make_app()`` served on one loopback port until ``budget`` requests to ``path`` were answered; the next
    finds it dying (HTTP 500 while it shuts down, then the port closed), as a killed server. ``restart`` serves a
    fresh app on the same port, so the same command line reaches it again."""

    def __init__(self, make_app, path: str, budget: int | None = None):
        self.make_app, self.path, self.port = make_app, path, free_port()
        self.thread = None
        self.start(budget)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, budget: int | None = None) -> None:
        served = [0]
        app = self.make_app()

        @app.middleware("http")
        async def die(request, call_next):
            if request.url.path == self.path:
                if budget is not None and served[0] >= budget:
                    self.thread.server.should_exit = True
                    return JSONResponse({"detail": "killed"}, status_code=500)
                served[0] += 1
            return await call_next(request)

        self.thread = ServerThread(app, port=self.port)
        self.thread.start()

    def restart(self, budget: int | None = None) -> None:
        self.thread.stop()
        self.start(budget)

    def close(self) -> None:
        self.thread.stop()


def completions_app(tokenizer, replies: dict[str, str], log: list[str], gate=None):
    """An OpenAI-compatible ``/v1/completions`` stand-in for ``kunlunlab serve-llm``: each prompt (token ids)
    answered from its question; ``gate(questions)`` runs first (to hold a request) and may drop it (False: 503,
    nothing answered or logged)."""
    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": "standin", "object": "model"}]}

    @app.post("/v1/completions")
    def completions(body: dict):
        questions = [question_in(tokenizer.decode(p), replies) for p in body["prompt"]]
        if gate is not None and not gate(questions):
            return JSONResponse({"detail": "dropped"}, status_code=503)
        log.extend(questions)
        return {"object": "text_completion", "model": "standin",
                "choices": [{"index": i, "text": f"\\boxed{{{replies[q]}}}", "finish_reason": "stop"}
                            for i, q in enumerate(questions)]}

    return app


def chat_judge_app(questions, log: list[str]):
    """An OpenAI-compatible ``/v1/chat/completions`` judge stand-in that answers "no" to everything."""
    app = FastAPI()

    @app.get("/v1/models")
    def models() -> dict:
        return {"object": "list", "data": [{"id": "judge-standin", "object": "model"}]}

    @app.post("/v1/chat/completions")
    def chat(body: dict) -> dict:
        log.append(question_in(" ".join(m["content"] for m in body["messages"]), questions))
        return {"choices": [{"message": {"role": "assistant", "content": "no"}}]}

    return app


def logged_retriever(passages, questions, log: list[str]):
    """A BM25 index over ``passages`` that logs the queries it answers that are one of ``questions``."""
    retriever = build_retriever(passages, IndexConfig(kind="bm25"))
    search = retriever.search

    def logged(queries, k=5):
        log.extend(q for q in queries if q in questions)
        return search(queries, k)

    retriever.search = logged
    return retriever


@pytest.fixture
def judge_cache(tmp_path, monkeypatch):
    """Judge verdicts cached in this test's folder: none from another run, none left in the user's cache."""
    monkeypatch.setattr(harness, "LLMJudge", partial(LLMJudge, cache_path=tmp_path / "judge_cache.jsonl"))


VOLATILE = ("wall_seconds", "seconds_per_question", "judge", "resumed", "search_errors")


def _config(method="naive_rag", **kw):
    return EvalConfig(dataset="world", method=method, limit=N, batch_size=BATCH, index_kind="bm25", **kw)


# ---------------------------------------------------------------------------- the harness
@pytest.mark.parametrize("method, generations", [("naive_rag", 1), ("iter_retgen", 3), ("ircot", 1)])
def test_a_fault_keeps_every_finished_question_and_the_rerun_does_only_the_rest(
        method, generations, tokenizer, world_eval, tmp_path):
    examples, retriever = world_eval
    ids = [ex.id for ex in examples]
    questions = [ex.question for ex in examples]
    out = tmp_path / "records.jsonl"
    config = _config(method)
    first = Answering(tokenizer, replies_for(examples))
    with pytest.raises(EvalRetrievalError):  # the service dies on the third batch's first search
        evaluate(config, out, backend=first, examples=examples, retriever=Search(retriever, examples, die_from=4),
                 progress=False, resume=True)
    assert record_ids(out) == ids[:4]  # all 4 finished questions, nothing of the batch in flight
    assert records_config_path(out).is_file()
    assert Counter(first.answered) == Counter({q: generations for q in questions[:4]})

    second = Answering(tokenizer, replies_for(examples))
    search = Search(retriever, examples)
    summary = evaluate(config, out, backend=second, examples=examples, retriever=search, progress=False,
                       resume=True)
    assert Counter(second.answered) == Counter({q: generations for q in questions[4:]})  # nothing redone
    assert not set(questions[:4]) & {q for query in search.queries for q in questions if q in query}
    assert record_ids(out) == ids
    assert summary["n"] == 8 and summary["resumed"] == 4 and summary["em"] == 0.5

    whole = tmp_path / "uninterrupted.jsonl"
    reference = evaluate(config, whole, backend=Answering(tokenizer, replies_for(examples)), examples=examples,
                         retriever=Search(retriever, examples), progress=False, resume=True)
    assert reference["resumed"] == 0
    assert {k: v for k, v in summary.items() if k not in VOLATILE} == \
        {k: v for k, v in reference.items() if k not in VOLATILE}

    def strip(path):
        return [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in path.read_text().splitlines()]

    assert strip(out) == strip(whole)


def test_a_torn_last_line_is_redone_on_the_uninterrupted_runs_batch_boundaries(tokenizer, world_eval, tmp_path):
    examples, retriever = world_eval
    out = tmp_path / "records.jsonl"
    config = replace(_config(), batch_size=3)
    evaluate(config, out, backend=Answering(tokenizer, replies_for(examples)), examples=examples,
             retriever=Search(retriever, examples), progress=False, resume=True)
    lines = out.read_text().splitlines(keepends=True)
    out.write_text("".join(lines[:4]) + lines[4][:40])  # a crash in the middle of writing record 5
    again = Answering(tokenizer, replies_for(examples))
    summary = evaluate(config, out, backend=again, examples=examples, retriever=Search(retriever, examples),
                       progress=False, resume=True)
    questions = [ex.question for ex in examples]
    # batches of 3 are questions 0-2, 3-5, 6-7: the rerun finishes the second one, then runs the third
    assert again.calls == [questions[4:6], questions[6:8]]
    assert summary["resumed"] == 4 and record_ids(out) == [ex.id for ex in examples]
    assert all(line.endswith("\n") for line in out.read_text().splitlines(keepends=True))


def _four_records(tokenizer, examples, retriever, out, config=None):
    with pytest.raises(EvalRetrievalError):
        evaluate(config or _config(), out, backend=Answering(tokenizer, replies_for(examples)), examples=examples,
                 retriever=Search(retriever, examples, die_from=4), progress=False, resume=True)
    assert len(record_ids(out)) == 4


def test_a_changed_config_is_refused_naming_what_changed_and_the_file_is_left_as_it_was(
        tokenizer, world_eval, tmp_path):
    examples, retriever = world_eval
    out = tmp_path / "records.jsonl"
    _four_records(tokenizer, examples, retriever, out)
    before = out.read_bytes()
    backend = Answering(tokenizer, replies_for(examples))
    with pytest.raises(RecordsConflict) as err:
        evaluate(_config("naive_gen"), out, backend=backend, examples=examples, retriever=Search(retriever, examples),
                 progress=False, resume=True)
    assert f"{out} holds 4 records of another evaluation config (method: 'naive_rag' there, 'naive_gen' now); " \
           f"pass another --out, or delete {out} to start over" == str(err.value)
    with pytest.raises(RecordsConflict, match=r"\(rollout.top_k: 3 there, 5 now\)"):
        kept_records(_config(rollout=RolloutConfig(top_k=5)), out, examples)
    assert out.read_bytes() == before and backend.calls == []
    # how fast and where it runs may change: a smaller batch resumes
    summary = evaluate(replace(_config(), batch_size=1), out, backend=backend, examples=examples,
                       retriever=Search(retriever, examples), progress=False, resume=True)
    assert summary["resumed"] == 4 and len(backend.calls) == 4 and record_ids(out) == [ex.id for ex in examples]


def test_records_it_cannot_vouch_for_are_refused(tokenizer, world_eval, tmp_path):
    examples, retriever = world_eval
    out = tmp_path / "records.jsonl"
    _four_records(tokenizer, examples, retriever, out)
    with pytest.raises(RecordsConflict, match=r"holds records of other questions \(record 1 is 'syn-1-000000', "
                                              r"this run's is 'syn-1-000007'\)"):
        kept_records(_config(), out, examples[::-1])
    with pytest.raises(RecordsConflict, match="record 3 is 'syn-1-000002', this run has 2 questions"):
        kept_records(_config(), out, examples[:2])
    lines = out.read_text().splitlines(keepends=True)
    out.write_text(lines[0] + "{not json\n" + "".join(lines[2:]))
    with pytest.raises(RecordsConflict, match="line 2 of 4 is not a record"):
        kept_records(_config(), out, examples)
    out.write_text("".join(lines))
    records_config_path(out).unlink()
    with pytest.raises(RecordsConflict, match="holds 4 records but no records.jsonl.config.json"):
        kept_records(_config(), out, examples)


def test_a_larger_run_of_the_same_evaluation_lends_its_records_and_no_other_does(tokenizer, world_eval, tmp_path):
    """Notebook 08 takes its prompt baselines from notebook 06's records: only from a run of the same evaluation
    (any number of questions), only when every question it needs is there, in its own question order."""
    examples, retriever = world_eval
    out = tmp_path / "records.jsonl"
    evaluate(_config(), out, backend=Answering(tokenizer, replies_for(examples)), examples=examples,
             retriever=Search(retriever, examples), progress=False, resume=True)
    wanted = [examples[5], examples[2]]
    got = records_of_same_evaluation(replace(_config(), limit=2, batch_size=1), out, wanted)
    assert [r["id"] for r in got] == [examples[5].id, examples[2].id]
    assert [r["em"] for r in got] == [0.0, 1.0]  # question 5 was answered wrongly, question 2 rightly
    assert records_of_same_evaluation(replace(_config(), limit=2, rollout=RolloutConfig(top_k=5)), out, wanted) is None
    # naive_rag has no turn loop: an agent's budgets do not change its records (notebook 08's 256 tokens, 06's 1,024)
    budgets = RolloutConfig(max_total_tokens=256, max_turn_tokens=16, max_searches=1, max_result_chars=50)
    assert [r["id"] for r in records_of_same_evaluation(replace(_config(), rollout=budgets), out, wanted)] == \
        [examples[5].id, examples[2].id]
    assert records_of_same_evaluation(_config("naive_gen"), out, wanted) is None
    other = replace(examples[2], answers=["somebody else"])
    assert records_of_same_evaluation(_config(), out, [examples[5], other]) is None
    out.write_text("".join(out.read_text().splitlines(keepends=True)[:4]))  # questions 0-3 only
    assert records_of_same_evaluation(_config(), out, wanted) is None
    assert [r["id"] for r in records_of_same_evaluation(_config(), out, [examples[2]])] == [examples[2].id]
    assert records_of_same_evaluation(_config(), tmp_path / "absent.jsonl", wanted) is None
    records_config_path(out).write_text("{not json")  # a damaged sidecar vouches for nothing
    assert records_of_same_evaluation(_config(), out, [examples[2]]) is None  # question 2 is still there


class Recording(Answering):
    """:class:`Answering` that also logs every generation call as (prompt tail, token limit per row, stop strings)."""

    def __init__(self, tokenizer, replies):
        super().__init__(tokenizer, replies)
        self.log: list[tuple] = []

    def open(self, prompts, sampling=None):
        session, outer = super().open(prompts, sampling), self
        answer = session.generate

        def generate(rows, max_new_tokens, stop=()):
            rows = list(rows)
            limits = [max_new_tokens[r] if isinstance(max_new_tokens, dict) else max_new_tokens for r in rows]
            outer.log.append(([outer.tokenizer.decode(prompts[r][-200:]) for r in rows], limits, tuple(stop)))
            return answer(rows, max_new_tokens, stop)

        session.generate = generate
        return session


@pytest.mark.parametrize("method, turn_loop", [("naive_gen", False), ("naive_rag", False), ("iter_retgen", False),
                                               ("ircot", False), ("search_o1", True)])
def test_a_method_without_a_turn_loop_generates_the_same_under_any_agent_budget(
        method, turn_loop, tokenizer, world_eval, tmp_path):
    """What lets notebook 08 reuse notebook 06's prompt baselines at another token budget: a method declaring no
    turn loop makes the same generation calls, with the same limits, and writes the same records whatever the
    rollout's searches, turn and total budgets and result length are; Search-o1, which declares one, does not."""
    examples, retriever = world_eval
    assert METHODS[method].turn_loop is turn_loop
    runs = []
    for i, budgets in enumerate([RolloutConfig(), RolloutConfig(max_total_tokens=200, max_turn_tokens=12,
                                                                max_searches=1, max_result_chars=40,
                                                                block_repeated_queries=False, result_suffix="\n")]):
        backend = Recording(tokenizer, replies_for(examples))
        out = tmp_path / f"{i}.jsonl"
        evaluate(replace(_config(method, rollout=budgets), limit=4), out, backend=backend, examples=examples[:4],
                 retriever=Search(retriever, examples), progress=False)
        records = [{k: v for k, v in json.loads(line).items() if k != "seconds"} for line in out.read_text().splitlines()]
        runs.append((backend.log, records))
    assert runs[0][0]  # the stand-in answered
    assert (runs[0] == runs[1]) is not turn_loop


def test_without_resume_the_file_starts_over_and_its_sidecar_goes(tokenizer, world_eval, tmp_path):
    examples, retriever = world_eval
    out = tmp_path / "records.jsonl"
    _four_records(tokenizer, examples, retriever, out)
    summary = evaluate(_config("naive_gen"), out, backend=Answering(tokenizer, replies_for(examples)),
                       examples=examples[:3], retriever=Search(retriever, examples), progress=False)
    assert summary["resumed"] == 0 and record_ids(out) == [ex.id for ex in examples[:3]]
    assert not records_config_path(out).exists()  # it described the records this run replaced


def test_the_judge_grades_each_batch_before_it_is_written(tokenizer, world_eval, tmp_path, judge_cache):
    """A judge server that dies on its second call: the first batch is on disk with its verdicts, and the rerun
    grades only the answers it has not graded (a right answer is graded by rule, without the judge)."""
    examples, retriever = world_eval
    questions = [ex.question for ex in examples]
    out = tmp_path / "records.jsonl"
    config = _config(judge="judge-standin")
    dying = Answering(tokenizer, {q: "no" for q in questions}, name="judge-standin", boxed=False,
                      fail=lambda qs: GenerationServiceError("judge server died") if dying.calls else None)
    with pytest.raises(GenerationServiceError):
        evaluate(config, out, backend=Answering(tokenizer, replies_for(examples)), judge_backend=dying,
                 examples=examples, retriever=Search(retriever, examples), progress=False, resume=True)
    kept = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["lj"]) for r in kept] == [("syn-1-000000", 1.0), ("syn-1-000001", 0.0)]
    judge = Answering(tokenizer, {q: "no" for q in questions}, name="judge-standin", boxed=False)
    summary = evaluate(config, out, backend=Answering(tokenizer, replies_for(examples)), judge_backend=judge,
                       examples=examples, retriever=Search(retriever, examples), progress=False, resume=True)
    assert dying.answered == [questions[1]] and judge.answered == [questions[3], questions[5], questions[7]]
    assert summary["lj"] == 0.5 and summary["resumed"] == 2
    assert [json.loads(line)["lj"] for line in out.read_text().splitlines()] == [1.0, 0.0] * 4


# ---------------------------------------------------------------------------- kunlunlab eval
@pytest.fixture
def eval_services(tokenizer, world_eval):
    """The retrieval service (the real one, BM25 over the world) and a generation server stand-in, each on its
    own port and killable; the questions each saw."""
    examples, retriever = world_eval
    replies = replies_for(examples)
    searched, generated = [], []
    served = logged_retriever(retriever.passages, replies, searched)
    retrieval = Killable(lambda: create_app(served), "/retrieve")
    llm = Killable(lambda: completions_app(tokenizer, replies, generated), "/v1/completions")
    yield retrieval, llm, searched, generated
    retrieval.close()
    llm.close()


def eval_argv(retrieval, llm, out, method="naive_rag"):
    return ["eval", "--dataset", "world", "--method", method, "--limit", str(N), "--batch-size", str(BATCH),
            "--retriever-url", retrieval.url, "--llm-url", llm.url, "--out", str(out)]


def test_eval_resumes_after_a_killed_retrieval_service_and_a_killed_generation_server(
        eval_services, world_eval, tmp_path, capsys):
    retrieval, llm, searched, generated = eval_services
    examples, _ = world_eval
    ids, questions = [ex.id for ex in examples], [ex.question for ex in examples]
    out = tmp_path / "records.jsonl"
    retrieval.restart(budget=2)  # dies on the third batch's search
    assert main(eval_argv(retrieval, llm, out)) == 1
    err = capsys.readouterr().err
    line = last_line(err)
    assert line.startswith("kunlunlab eval: retrieval failed, evaluation stopped: retrieval service at "
                           + retrieval.url)
    assert line.endswith(f"; 4 of 8 records kept in {out}: rerun the same command to resume")
    assert "Traceback" not in err and record_ids(out) == ids[:4]

    retrieval.restart()
    llm.restart(budget=1)  # answers the third batch, dies on the fourth: that one is searched, never answered
    assert main(eval_argv(retrieval, llm, out)) == 1
    line = last_line(capsys.readouterr().err)
    assert line.startswith(f"kunlunlab eval: a generation server failed, evaluation stopped: generation server at "
                           f"{llm.url}/v1 is unavailable after 6 attempts: ")
    assert line.endswith(f"; 6 of 8 records kept in {out}: rerun the same command to resume")
    assert record_ids(out) == ids[:6]

    llm.restart()
    assert main(eval_argv(retrieval, llm, out)) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[0] == f"kunlunlab eval: records go to {out} (resuming after 6 of 8 questions)"
    summary = json.loads(printed[-1])
    assert (summary["n"], summary["resumed"], summary["em"]) == (8, 6, 0.5)
    assert record_ids(out) == ids
    assert Counter(generated) == Counter(questions)  # every question answered once, over three runs
    # each question searched once, but the fourth batch's twice: the second run searched it, then lost its generator
    assert Counter(searched) == Counter(questions[:6] + questions[6:] * 2)

    assert main(eval_argv(retrieval, llm, out, method="naive_gen")) == 2
    line = last_line(capsys.readouterr().err)
    assert line == (f"kunlunlab eval: {out} holds 8 records of another evaluation config (method: 'naive_rag' there, "
                    f"'naive_gen' now); pass another --out, or delete {out} to start over")


@pytest.mark.slow
def test_eval_in_a_subprocess_keeps_its_records_through_a_killed_service_and_ctrl_c(
        eval_services, world_eval, tokenizer, tmp_path, capsys):
    """The issue's case through the real command line: the retrieval service killed after 2 of 4 batches, then
    Ctrl-C while the generation server holds the fourth batch; each run keeps every finished question and says
    so in its last line; the rerun completes the file."""
    retrieval, llm, searched, generated = eval_services
    examples, _ = world_eval
    ids, questions = [ex.id for ex in examples], [ex.question for ex in examples]
    out = tmp_path / "records.jsonl"
    command = [sys.executable, "-m", "kunlunlab.cli", *eval_argv(retrieval, llm, out)]
    retrieval.restart(budget=2)
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT)
    assert run.returncode == 1 and "Traceback" not in run.stderr, run.stderr[-2000:]
    assert last_line(run.stderr).endswith(f"; 4 of 8 records kept in {out}: rerun the same command to resume")
    assert record_ids(out) == ids[:4]

    arrived, release = threading.Event(), threading.Event()

    def hold_the_fourth_batch(batch) -> bool:  # once: the rerun's fourth batch is answered
        if questions[6] not in batch or arrived.is_set():
            return True
        arrived.set()
        release.wait(60)
        return False  # its client was interrupted: answered to no one

    llm.make_app = lambda: completions_app(tokenizer, replies_for(examples), generated, hold_the_fourth_batch)
    llm.restart()
    retrieval.restart()
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=PROJECT_ROOT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert arrived.wait(240), "the fourth batch never reached the generation server"
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        release.set()
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130 and "Traceback" not in stderr, stderr[-2000:]
    assert last_line(stderr) == f"kunlunlab eval: interrupted; 6 of 8 records kept in {out}: rerun the same command " \
                                "to resume"
    assert record_ids(out) == ids[:6]

    generated.clear()
    assert main(eval_argv(retrieval, llm, out)) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["resumed"] == 6
    assert record_ids(out) == ids and generated == questions[6:]


# ---------------------------------------------------------------------------- kunlunlab suite
SUITE_QUESTIONS = 6


@pytest.fixture
def suite_setup(tokenizer, data_dir, judge_cache, monkeypatch):
    """The held-out HotpotQA questions of a suite, the retrieval service over their corpus and a chat judge, both
    killable, and the suite's model replaced by the answering stand-in (the loads are counted)."""
    import kunlunlab.studies.suite as suite
    from kunlunlab.data.loaders import load_named_corpus

    cfg = suite.SuiteConfig(datasets=("hotpotqa_distractor",), hotpot_questions=SUITE_QUESTIONS)
    examples = suite.suite_data(cfg)["hotpotqa_distractor"][0]
    assert len(examples) == SUITE_QUESTIONS
    replies = replies_for(examples)
    searched, judged, loads = [], [], []
    served = logged_retriever(load_named_corpus("hotpotqa_distractor"), replies, searched)

    def model(*args, **kwargs):
        loads.append(args)
        return Answering(tokenizer, replies)

    monkeypatch.setattr(suite, "TransformersBackend", model)
    retrieval = Killable(lambda: create_app(served), "/retrieve")
    judge = Killable(lambda: chat_judge_app(replies, judged), "/v1/chat/completions")
    yield examples, retrieval, judge, searched, judged, loads
    retrieval.close()
    judge.close()


def suite_argv(retrieval, judge, out, *extra):
    return ["suite", "--out", str(out), "--retriever-url", retrieval.url, "--index-kind", "bm25",
            "--set", 'datasets=["hotpotqa_distractor"]', 'baselines=["naive_gen"]', "method=naive_rag",
            "ablations=[]", f"hotpot_questions={SUITE_QUESTIONS}", f"batch_size={BATCH}", "judge=judge-standin",
            f"judge_url={judge.url}", *extra]


def test_suite_resumes_after_a_killed_judge_and_a_killed_retrieval_service(suite_setup, tmp_path, capsys):
    examples, retrieval, judge, searched, judged, loads = suite_setup
    ids, questions = [ex.id for ex in examples], [ex.question for ex in examples]
    out = tmp_path / "suite"
    records = out / "records"
    naive_gen, naive_rag = (records / f"hotpotqa_distractor.{m}.jsonl" for m in ("naive_gen", "naive_rag"))
    judge.restart(budget=1)  # grades the first batch's wrong answer, dies on the second batch's
    assert main(suite_argv(retrieval, judge, out)) == 1
    err = capsys.readouterr().err
    line = last_line(err)
    assert line.startswith(f"kunlunlab suite: a generation server failed, suite stopped: judge server at {judge.url}/v1")
    assert line.endswith(f"; 2 records kept in {records} (1 file): rerun the same command to resume")
    assert "Traceback" not in err and record_ids(naive_gen) == ids[:2] and not naive_rag.exists()

    judge.restart()
    retrieval.restart(budget=1)  # naive_rag's first batch is searched; the service dies on its second
    assert main(suite_argv(retrieval, judge, out)) == 1
    line = last_line(capsys.readouterr().err)
    assert line.startswith(f"kunlunlab suite: retrieval failed, suite stopped: retrieval service at {retrieval.url}")
    assert line.endswith(f"; 8 records kept in {records} (2 files): rerun the same command to resume")
    assert record_ids(naive_gen) == ids and record_ids(naive_rag) == ids[:2]

    retrieval.restart()
    assert main(suite_argv(retrieval, judge, out)) == 0
    capsys.readouterr()
    assert record_ids(naive_gen) == ids and record_ids(naive_rag) == ids
    summaries = json.loads((out / "suite_summary.json").read_text())["summaries"]
    assert [(s["variant"], s["n"], s["resumed"], s["em"], s["lj"]) for s in summaries] == \
        [("naive_gen", 6, 6, 0.5, 0.5), ("naive_rag", 6, 2, 0.5, 0.5)]
    # the judge graded each wrong answer once (naive_rag's repeat naive_gen's: cached), the service searched each
    # question once
    assert judged == [questions[1], questions[3], questions[5]]
    assert Counter(searched) == Counter(questions)
    assert len(loads) == 3

    assert main(suite_argv(retrieval, judge, out, "hotpot_questions=4")) == 2
    line = last_line(capsys.readouterr().err)
    assert line == (f"kunlunlab suite: {records} holds 12 records of a suite of another config (hotpot_questions: 6 "
                    f"there, 4 now); pass another --out, or delete {records} to start over")
    assert len(loads) == 3  # refused before the model loads


def test_suite_ctrl_c_keeps_the_finished_questions(suite_setup, tmp_path, capsys, tokenizer, monkeypatch):
    import kunlunlab.studies.suite as suite

    examples, retrieval, judge, _, _, _ = suite_setup
    replies = replies_for(examples)
    model = Answering(tokenizer, replies, fail=lambda qs: KeyboardInterrupt() if len(model.calls) == 2 else None)
    monkeypatch.setattr(suite, "TransformersBackend", lambda *a, **k: model)
    out = tmp_path / "suite"
    assert main(suite_argv(retrieval, judge, out)) == 130
    line = last_line(capsys.readouterr().err)
    assert line == (f"kunlunlab suite: interrupted; 4 records kept in {out / 'records'} (1 file): rerun the same "
                    "command to resume")
    assert record_ids(out / "records" / "hotpotqa_distractor.naive_gen.jsonl") == [ex.id for ex in examples[:4]]


def test_each_suite_row_s_records_name_the_model_it_ran_on(suite_setup, tmp_path, capsys):
    """The baselines run on the backbone (the training config's model: the embedded one), the method on the
    checkpoint; each records file's sidecar names its own row's model (it named the checkpoint for every row)."""
    examples, retrieval, judge, _, _, loads = suite_setup
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    out = tmp_path / "suite"
    assert main(suite_argv(retrieval, judge, out, "--model", str(checkpoint))) == 0
    capsys.readouterr()
    identity = {m: json.loads(records_config_path(out / "records" / f"hotpotqa_distractor.{m}.jsonl").read_text())
                ["identity"]["model"] for m in ("naive_gen", "naive_rag")}
    assert identity == {"naive_gen": None, "naive_rag": str(checkpoint)}
    assert [args[0] for args in loads] == [None, str(checkpoint)]  # the backbone's rows first, the checkpoint's last


def test_a_rerun_keeps_the_nlr_router_its_records_were_routed_by(tmp_path, monkeypatch):
    """Router training measures latencies, so a second training would route differently from the +NLR records
    already on disk: a resumed suite keeps router.pt and its training summary; without resume it trains anew."""
    from contextlib import contextmanager

    import kunlunlab.studies.suite as suite
    from kunlunlab.data.types import Passage

    passages = [Passage(id=f"p{i}", title=f"T{i}", text=f"text {i}") for i in range(4)]
    trainings = []

    def fake_train_router(config, out, local_corpus_out=None):
        trainings.append(out)
        out.write_bytes(b"policy %d" % len(trainings))
        local_corpus_out.write_text("".join(json.dumps({"id": p.id, "contents": f'"{p.title}"\n{p.text}'}) + "\n"
                                            for p in passages[:2]))
        keys = ("heldout", "train", "local_passages", "network_passages", "added_latency_ms", "network_errors",
                "seconds")
        return None, {**{k: len(trainings) for k in keys}, "heldout": {"policy": {"recall": 0.5},
                                                                          "always_local": {"recall": 0.25}},
                      "config": "not kept"}

    @contextmanager
    def fake_tier(*args, **kwargs):
        yield "http://127.0.0.1:1"

    monkeypatch.setattr(suite, "train_router", fake_train_router)
    monkeypatch.setattr(suite, "network_tier", fake_tier)
    rows = []

    def run(dataset, name, examples, local, **overrides):
        rows.append((name, [p.id for p in local], overrides.get("router")))
        return []

    base = suite.suite_eval_config(suite.SuiteConfig())
    summaries = [{"router": {"decisions": 1}}]

    def nlr(resume):
        return suite._nlr_rows(suite.SuiteConfig(nlr=True), base, passages, [], tmp_path, {}, run, lambda m: None,
                               resume, summaries)

    first = nlr(resume=True)
    assert len(trainings) == 1 and first["training"]["seconds"] == 1 and "config" not in first["training"]
    again = nlr(resume=True)
    assert len(trainings) == 1 and again == first and (tmp_path / "router.pt").read_bytes() == b"policy 1"
    assert rows[-2:] == [("local ½, no NLR", ["p0", "p1"], None), ("+NLR", ["p0", "p1"], str(tmp_path / "router.pt"))]
    anew = nlr(resume=False)
    assert len(trainings) == 2 and anew["training"]["seconds"] == 2


def test_an_out_that_cannot_hold_records_is_one_line_before_any_model_loads(tmp_path, capsys):
    argv = ["eval", "--dataset", "world", "--method", "naive_gen", "--limit", "2", "--index-kind", "bm25",
            "--model", "/no/such/model", "--out", str(tmp_path)]  # a model that would fail to load, were it loaded
    assert main(argv) == 2
    assert last_line(capsys.readouterr().err) == (f"kunlunlab eval: --out {tmp_path} is a folder: give the records "
                                                  f"file's path, e.g. {tmp_path / 'records.jsonl'}")
    records = tmp_path / "records.jsonl"
    records.write_text('{"id": "elsewhere"}\n')
    assert main(argv[:-1] + [str(records)]) == 2
    assert last_line(capsys.readouterr().err) == (
        f"kunlunlab eval: {records} holds 1 record but no records.jsonl.config.json saying what they measure (an "
        f"older version's or a non-resumable run's file); pass another --out, or delete {records} to start over")
    suite_out = tmp_path / "suite.txt"
    suite_out.write_text("not a folder")
    assert main(["suite", "--out", str(suite_out)]) == 2
    assert last_line(capsys.readouterr().err) == (f"kunlunlab suite: --out {suite_out} is a file: give a folder "
                                                  "(records, tables.md, suite_summary.json go there)")
