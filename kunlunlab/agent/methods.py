"""Every method as a batched pipeline on the same backend and search function, selectable by name.

``naive_gen``   Naive Generation: the question alone.
``naive_rag``   Naive RAG: top-k passages for the question, then answer.
``iter_retgen`` Iter-RetGen (Shao et al., 2023): retrieve with question + last generation, T times.
``ircot``       IRCoT (Trivedi et al., 2023): one reasoning sentence, retrieve with it, repeat.
``search_o1``   Search-o1 (Li et al., 2025): the agentic search prompt, each search's documents condensed by the
                model (Reason-in-Documents, :mod:`kunlunlab.agent.search_o1`) before they enter the chain.
``agent``       the search-think protocol agent alone (no RDRA/STIE/NLR), an ablation.
``search_r1``   the agent in Search-R1's protocol (``<search>``/``<information>``/``<answer>``), for a Search-R1
                checkpoint or a model trained here with its recipe (:mod:`kunlunlab.agent.protocols`).
``research``    the agent in ReSearch's protocol (``<search>``/``<result>``, ``<answer>`` with ``\\boxed{}``).
``r1_searcher`` the agent in R1-Searcher's protocol (``<|begin_of_query|>``, ``<|begin_of_documents|>``, ``<answer>``).
``kunlun``      KunLunBaizeRAG: RDRA background, the search-think agent, STIE over answer rounds,
                NLR routing when a network tier is given.

A peer's method is made from its protocol (:func:`peer_method`): every peer protocol registered in
:mod:`kunlunlab.agent.protocols` is a method of its name in :data:`METHODS` and :data:`PEER_METHODS`.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

from kunlunlab.agent.backends import Backend, chat_prompt_ids, generate_once
from kunlunlab.agent.protocol import (DIRECT_SYSTEM, DOCS_USER_TEMPLATE, IRCOT_SYSTEM, QUESTION_USER_TEMPLATE,
                                      SEARCH_O1_SYSTEM, SYSTEM_PROMPT, build_messages, extract_final_answer,
                                      numbered_docs)
from kunlunlab.agent.protocols import (RESERVED_METHOD_NAMES, AgentProtocol, NamesView, RegistryView, get_protocol,
                                      peer_protocols)
from kunlunlab.agent.rdra import RDRAConfig, rdra_contexts
from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine, SearchFn
from kunlunlab.agent.search_o1 import ReasonInDocumentsConfig, SearchO1Engine
from kunlunlab.agent.stie import STIEConfig, STIEController
from kunlunlab.configs import choice
from kunlunlab.retrieval.client import RetrievalServiceError


PROMPT_KINDS = ("auto", "chat", "base")  # MethodConfig.prompt
# RolloutConfig fields only a turn loop reads (the agents' engines): its searches, turns, total budget and result
# blocks. A method with ``turn_loop = False`` answers in calls of its own fixed lengths
# (``MethodConfig.answer_tokens``, ``ircot_sentence_tokens``), so these fields cannot change its records; it reads
# only the rollout's ``top_k`` and ``sampling`` (test: tests/eval/test_eval_resume.py)
TURN_LOOP_FIELDS = ("max_searches", "max_turn_tokens", "max_total_tokens", "max_result_chars",
                    "block_repeated_queries", "result_suffix")


@dataclass
class MethodConfig:
    top_k: int = 3
    answer_tokens: int = 64      # single-shot answers
    iterations: int = 3          # Iter-RetGen
    ircot_steps: int = 4
    ircot_sentence_tokens: int = 48
    max_doc_chars: int = 400
    assistant_prefix: str = "<think>"  # how agent turns start
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    rdra: RDRAConfig = field(default_factory=RDRAConfig)
    stie: STIEConfig = field(default_factory=STIEConfig)
    reason_in_documents: ReasonInDocumentsConfig = field(default_factory=ReasonInDocumentsConfig)  # search_o1
    use_rdra: bool = True
    use_stie: bool = True
    # a peer's prompt: "chat" (its messages through the chat template), "base" (its base-model prompt, raw) or
    # "auto" (chat where the tokenizer has a chat template, else base: a released base-model checkpoint's)
    prompt: str = choice("auto", PROMPT_KINDS)
    # rows a rollout keeps generating at a time over the questions of one ``run`` call (None: all at once); the
    # evaluation harness sets it to its batch size and hands a continuous method several batches per call
    max_batch: int | None = None

    def __post_init__(self):
        if self.prompt not in PROMPT_KINDS:
            raise ValueError(f"prompt must be one of {PROMPT_KINDS}, got {self.prompt!r}")


@dataclass
class MethodOutput:
    prediction: str | None
    searches: int
    doc_ids: list[str]
    trajectory: dict


class Method:
    name = ""
    continuous = False  # run() keeps config.max_batch rows generating over any number of questions
    turn_loop = True    # reads the rollout's TURN_LOOP_FIELDS (assumed of any method not declaring otherwise)

    def __init__(self, backend: Backend, search: SearchFn | None, config: MethodConfig | None = None):
        self.backend, self.search, self.config = backend, search, config or MethodConfig()
        self.tok = backend.tokenizer
        self.search_errors: list[str] = []

    def run(self, questions: list[str]) -> list[MethodOutput]:
        raise NotImplementedError

    # helpers shared by the single-shot baselines
    def _retrieve(self, queries: list[str]) -> list[list]:
        if self.search is None:
            raise ValueError(f"method {self.name!r} needs a retriever")
        try:
            return self.search(queries, self.config.top_k)
        except RetrievalServiceError as err:  # defined fallback: answer without documents, record why
            self.search_errors.append(str(err))
            return [[] for _ in queries]

    def _docs(self, hits: list) -> str:
        cap = self.config.max_doc_chars
        return numbered_docs([h.contents if len(h.contents) <= cap else h.contents[:cap] + "…" for h in hits])

    def _answer(self, users: list[str], system: str = DIRECT_SYSTEM, max_tokens: int | None = None,
                stop=()) -> list[str]:
        prompts = [chat_prompt_ids(self.tok, [{"role": "system", "content": system},
                                              {"role": "user", "content": u}]) for u in users]
        eos = self.tok.eos_token or ""
        return [s.text.replace(eos, "").strip()
                for s in generate_once(self.backend, prompts, max_tokens or self.config.answer_tokens, stop=stop,
                                       sampling=self.config.rollout.sampling)]


class NaiveGeneration(Method):
    name = "naive_gen"
    turn_loop = False

    def run(self, questions):
        texts = self._answer([QUESTION_USER_TEMPLATE.format(question=q) for q in questions])
        return [MethodOutput(extract_final_answer(t), 0, [], {"steps": [{"kind": "model", "text": t}]})
                for t in texts]


class NaiveRAG(Method):
    name = "naive_rag"
    turn_loop = False

    def run(self, questions):
        hits = self._retrieve(questions)
        users = [DOCS_USER_TEMPLATE.format(docs=self._docs(h), question=q) for q, h in zip(questions, hits)]
        texts = self._answer(users)
        return [MethodOutput(extract_final_answer(t), 1, [x.id for x in h],
                             {"steps": [{"kind": "search", "text": q, "queries": [q]},
                                        {"kind": "result", "text": self._docs(h)}, {"kind": "model", "text": t}]})
                for q, h, t in zip(questions, hits, texts)]


class IterRetGen(Method):
    name = "iter_retgen"
    turn_loop = False

    def run(self, questions):
        generations = [""] * len(questions)
        steps = [[] for _ in questions]
        doc_ids = [[] for _ in questions]
        for _ in range(self.config.iterations):
            queries = [f"{q} {g}".strip() for q, g in zip(questions, generations)]
            hits = self._retrieve(queries)
            users = [DOCS_USER_TEMPLATE.format(docs=self._docs(h), question=q) for q, h in zip(questions, hits)]
            generations = self._answer(users)
            for i, (query, h, g) in enumerate(zip(queries, hits, generations)):
                doc_ids[i].extend(x.id for x in h)
                steps[i] += [{"kind": "search", "text": query, "queries": [query]},
                             {"kind": "result", "text": self._docs(h)}, {"kind": "model", "text": g}]
        return [MethodOutput(extract_final_answer(g), self.config.iterations, d, {"steps": s})
                for g, d, s in zip(generations, doc_ids, steps)]


class IRCoT(Method):
    name = "ircot"
    turn_loop = False

    def run(self, questions):
        cfg = self.config
        hits = self._retrieve(questions)
        docs = [list(h) for h in hits]
        cot = [[] for _ in questions]
        steps = [[{"kind": "search", "text": q, "queries": [q]}, {"kind": "result", "text": self._docs(h)}]
                 for q, h in zip(questions, hits)]
        searches = [1] * len(questions)
        active = list(range(len(questions)))
        for _ in range(cfg.ircot_steps):
            if not active:
                break
            users = [DOCS_USER_TEMPLATE.format(docs=self._docs(docs[i][:2 * cfg.top_k]), question=questions[i])
                     + ("\nReasoning so far: " + " ".join(cot[i]) if cot[i] else "") for i in active]
            sentences = self._answer(users, IRCOT_SYSTEM, cfg.ircot_sentence_tokens, stop=("\n", ". "))
            still = []
            for i, s in zip(active, sentences):
                cot[i].append(s)
                steps[i].append({"kind": "model", "text": s})
                if "answer is" not in s.lower() and "\\boxed" not in s and s:
                    still.append(i)
            if still and len(cot[still[0]]) < cfg.ircot_steps:
                new = self._retrieve([cot[i][-1] for i in still])
                for i, h in zip(still, new):
                    seen = {d.id for d in docs[i]}
                    docs[i] += [d for d in h if d.id not in seen]
                    searches[i] += 1
                    steps[i] += [{"kind": "search", "text": cot[i][-1], "queries": [cot[i][-1]]},
                                 {"kind": "result", "text": self._docs(h)}]
            active = still
        return [MethodOutput(extract_final_answer(" ".join(c)), n, [d.id for d in ds], {"steps": s})
                for c, n, ds, s in zip(cot, searches, docs, steps)]


class _RolloutMethod(Method):
    system_prompt = SYSTEM_PROMPT
    protocol = "search_think"  # the agent protocol it speaks (kunlunlab.agent.protocols)
    continuous = True

    def _engine(self) -> RolloutEngine:
        return RolloutEngine(self.backend, self.search, self.config.rollout, self.protocol)

    def _messages(self, question: str, background: str | None) -> list[dict]:
        return build_messages(question, background, self.system_prompt)

    def _prefix(self) -> str:
        return self.config.assistant_prefix

    def _prompt_ids(self, question: str, background: str | None, prefix: str) -> list[int]:
        return chat_prompt_ids(self.tok, self._messages(question, background), prefix)

    def _rollout(self, questions: list[str], backgrounds: list[str | None], controller=None):
        engine = self._engine()
        prefix = self._prefix()
        prompts = [self._prompt_ids(q, b, prefix) for q, b in zip(questions, backgrounds)]
        if self.continuous:
            trajs = engine.run(prompts, questions, controller, [prefix] * len(questions), self.config.max_batch)
        else:
            trajs = engine.run(prompts, questions, controller, [prefix] * len(questions))
        for t in trajs:
            self.search_errors.extend(t.search_errors)
        self.last_stats = engine.stats
        return trajs


def _prediction(answer: str | None, trajectory) -> tuple[str | None, str]:
    """The agent's answer; without an answer tag, the same fallback extraction the baselines get (flagged)."""
    if answer:
        return answer, "answer_tag"
    model_text = "".join(s["text"] for s in trajectory.steps if s["kind"] == "model")
    return extract_final_answer(model_text.replace("<|im_end|>", "")), "fallback"


class SearchThinkAgent(_RolloutMethod):
    name = "agent"

    def run(self, questions):
        out = []
        for t in self._rollout(questions, [None] * len(questions)):
            prediction, source = _prediction(t.answer, t)
            out.append(MethodOutput(prediction, t.n_searches, [d for ids in t.doc_ids for d in ids],
                                    {**t.to_dict(), "answer_source": source}))
        return out


class SearchO1(SearchThinkAgent):
    """Search-o1 with Reason-in-Documents (:class:`~kunlunlab.agent.search_o1.SearchO1Engine`; its departures
    from the authors' code are named there). ``MethodConfig.reason_in_documents`` sets the analysis budget; the
    chain's budgets are the rollout's, the same as the other agents'."""

    name = "search_o1"
    system_prompt = SEARCH_O1_SYSTEM
    continuous = False  # its engine runs lock-step turns (the condensing step between them)

    def _engine(self) -> SearchO1Engine:
        return SearchO1Engine(self.backend, self.search, self.config.rollout, self.config.reason_in_documents)


class KunLun(_RolloutMethod):
    name = "kunlun"

    def run(self, questions):
        cfg = self.config
        t0 = time.perf_counter()
        contexts = rdra_contexts(self.backend, self.search, questions, cfg.rdra) if cfg.use_rdra else None
        rdra_s = time.perf_counter() - t0
        controller = STIEController(cfg.stie) if cfg.use_stie else None
        trajs = self._rollout(questions, [c.background for c in contexts] if contexts else [None] * len(questions),
                              controller)
        out = []
        for i, t in enumerate(trajs):
            record = t.to_dict()
            prediction, source = _prediction((controller.final_answer(i) if controller else None) or t.answer, t)
            record["answer_source"] = source
            doc_ids = [d for ids in t.doc_ids for d in ids]
            if contexts:
                c = contexts[i]
                record["rdra"] = {"plan": c.plan, "plan_queries": c.plan_queries, "doc_ids": c.doc_ids,
                                  "background": c.background, "error": c.error, "searches": c.searches,
                                  "seconds": rdra_s / len(questions)}
                doc_ids = c.doc_ids + doc_ids
                if c.error:
                    self.search_errors.append(c.error)
            record["stie_answer"] = prediction
            rdra_searches = contexts[i].searches if contexts else 0  # queries RDRA actually sent
            out.append(MethodOutput(prediction, t.n_searches + rdra_searches, doc_ids, record))
        return out


class PeerAgent(SearchThinkAgent):
    """A peer's agent (Search-R1, ReSearch, R1-Searcher) run as its own repository runs it: its prompt, assistant
    prefix, stop strings, document block, re-prompts and answer extraction (:mod:`kunlunlab.agent.protocols`), so a
    released checkpoint of the peer, or one trained here with its recipe, is evaluated in its own protocol. The
    answer is the last answer turn's; without one, the peer's own extraction over the completion (``fallback``).
    Each peer protocol's method is made from it (:func:`peer_method`); there is no class per peer."""

    def _messages(self, question: str, background: str | None) -> list[dict]:
        return get_protocol(self.protocol).messages(question, background)

    def _prefix(self) -> str:
        return get_protocol(self.protocol).assistant_prefix

    def prompt_kind(self) -> str:
        """``chat`` (the peer's messages through the model's chat template) or ``base`` (the raw prompt the peer's
        base-model checkpoints were trained with: ReSearch's and R1-Searcher's Qwen2.5-base runs, Search-R1's
        ``template_type="base"``). ``MethodConfig.prompt`` "auto" picks as the peers' own inference scripts do: the
        chat template where the tokenizer has one, else the base prompt."""
        kind = self.config.prompt
        if kind == "auto":
            has_base = get_protocol(self.protocol).build_base_prompt is not None
            kind = "chat" if getattr(self.tok, "chat_template", None) or not has_base else "base"
        return kind

    def _prompt_ids(self, question: str, background: str | None, prefix: str) -> list[int]:
        if self.prompt_kind() == "chat":
            return chat_prompt_ids(self.tok, self._messages(question, background), prefix)
        text = get_protocol(self.protocol).base_prompt(question, background) + prefix
        return self.tok(text, add_special_tokens=False)["input_ids"]

    def run(self, questions):
        protocol = get_protocol(self.protocol)
        out = []
        for t in self._rollout(questions, [None] * len(questions)):
            prediction, source = (t.answer, "answer_tag") if t.answer else (protocol.final_answer(t.text), "fallback")
            out.append(MethodOutput(prediction, t.n_searches, [d for ids in t.doc_ids for d in ids],
                                    {**t.to_dict(), "answer_source": source, "protocol": protocol.name}))
        return out


_PEER_CLASSES: dict[str, tuple[AgentProtocol, type[PeerAgent]]] = {}


def peer_method(protocol: AgentProtocol) -> type[PeerAgent]:
    """The method of a peer's protocol: a :class:`PeerAgent` named after it that speaks it (one class per protocol
    object, made once)."""
    made = _PEER_CLASSES.get(protocol.name)
    if made is None or made[0] is not protocol:
        cls = type(f"PeerAgent_{protocol.name}", (PeerAgent,), {"name": protocol.name, "protocol": protocol.name,
                                                               "__module__": __name__})
        made = _PEER_CLASSES[protocol.name] = (protocol, cls)
    return made[1]


_FIXED_METHODS: dict[str, Callable[..., Method]] = {m.name: m for m in (NaiveGeneration, NaiveRAG, IterRetGen, IRCoT,
                                                                        SearchO1, SearchThinkAgent, KunLun)}
RESERVED_METHOD_NAMES.update(_FIXED_METHODS)  # a peer protocol named like one would be shadowed: refused
# every method by name: the fixed ones above, then one PeerAgent per registered peer protocol (read when used, so
# a protocol registered at run time is a method too)
METHODS: Mapping[str, Callable[..., Method]] = RegistryView(
    lambda: {**_FIXED_METHODS, **{p.name: peer_method(p) for p in peer_protocols() if p.name not in _FIXED_METHODS}})
PROMPT_BASELINES = ("naive_gen", "naive_rag", "iter_retgen", "ircot", "search_o1")  # prompting only, no training
PEER_METHODS = NamesView(lambda: tuple(p.name for p in peer_protocols()))  # the peers' agents, each in its protocol


def make_method(name: str, backend: Backend, search: SearchFn | None, config: MethodConfig | None = None) -> Method:
    if name not in METHODS:
        raise ValueError(f"unknown method {name!r}; choose from {sorted(METHODS)}")
    return METHODS[name](backend, search, config)
