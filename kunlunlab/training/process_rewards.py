"""Process rewards after ReasonRAG (Zhang et al., "Process vs. Outcome Reward: Which is Better for Agentic RAG
Reinforcement Learning", arXiv 2505.14069): Monte-Carlo tree search over reasoning steps and Shortest Path Reward
Estimation (SPRE) of every step. The step-level preference pairs for DPO (:mod:`kunlunlab.training.dpo`) drawn
from the searched trees are :mod:`kunlunlab.training.preferences`.

**Steps.** A step is one model turn of this repository's search-think protocol (:mod:`kunlunlab.agent.protocol`):
``<think>…</think><search>…</search>`` or an answer. A tree per question; every :class:`StepNode` holds the token
ids of its prefix (prompt + path so far, each ``<result>`` block appended by the environment exactly as
:class:`~kunlunlab.agent.rollout.RolloutEngine` appends it), the step's own sampled ids, its action, depth,
visits, value and children.

**Expansion** resumes generation from a node's token ids (never decoded and re-encoded) for ONE model turn,
``children_per_node`` samples per node, and appends the environment's result block after a search. One
batched ``generate`` call expands the selected leaf of every tree at once, and all queries of that turn go to
the search function in one call, as in the rollout engine. Identical sibling samples are merged.

**Selection** is UCT, ``value + c_uct * sqrt(ln N(parent) / N(child))`` (unvisited children first).

**Values (SPRE).** A terminal answer at depth ``d`` (every model turn is a step; the root, the prompt, has depth
0) is worth ``F1(answer, gold) * alpha**d``; a branch that ends without an answer (no action, cut off, out of
budget, or still searching at ``max_depth``) is worth 0; an internal node's value is the visit-weighted mean of
its children's values. A non-terminal leaf gets a selection value from ``value_source``:

* ``rollout`` — ReasonRAG's eq. 1 taken literally: ``rollouts_k`` sampled continuations to the end with the
  rollout engine, each scored ``F1 * alpha**(steps to its answer)``, averaged;
* ``judge`` — an OpenAI-compatible chat endpoint rates the partial path 0-10
  (:class:`~kunlunlab.training.path_judge.PathJudge`);
* ``gold`` (default, deterministic, no model call) — the share of the question's gold supporting passage ids
  retrieved so far on the path.

``judge`` and ``gold`` scores lie in [0, 1] and are discounted by ``alpha**(d + 1)``: the SPRE reward the path
would earn if it answered at the very next step with that score standing in for F1. Undiscounted, a search
that found every gold passage (1.0) would outrank a correct answer given now (``alpha**d``), the opposite of
SPRE's shortest-path preference. (This discount is ours; ReasonRAG scores every node by rollouts.)

Departures from ReasonRAG, on purpose:

* steps are this protocol's turns, not ReasonRAG's three actions (query generation, evidence extraction,
  answer generation); evidence is read inside ``<think>`` of the next turn;
* the default leaf value is ``gold`` (cheap and deterministic on the synthetic world) instead of rollouts;
* the answer is forced after ``max_depth`` by the environment, not by the policy: the result block of a search
  at depth ``max_depth - 1`` carries ``force_answer_notice`` (as the engine's search-limit notice does), and a
  node at ``max_depth`` that still searches is a dead end worth 0. ``max_depth`` replaces the rollout config's
  ``max_searches`` inside the tree (rollouts of the ``rollout`` source get the remaining searches);
* no STIE feedback rounds inside the tree: an answer ends its path.
"""
from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Sequence

from kunlunlab.agent.backends import Backend, SamplingConfig, chat_prompt_ids, text_ids
from kunlunlab.agent.protocol import RESULT_TEMPLATE, SYSTEM_PROMPT, build_messages, parse_turn
from kunlunlab.agent.rollout import RolloutConfig, RolloutEngine, SearchFn
from kunlunlab.configs import choice, non_negative, positive, within
from kunlunlab.eval.metrics import f1
from kunlunlab.training.path_judge import PathJudge

log = logging.getLogger(__name__)

VALUE_SOURCES = ("gold", "rollout", "judge")
ACTIONS = ("root", "search", "answer", "none")  # "none": a turn that neither searched nor answered (dead end)


@dataclass
class MCTSConfig:
    """ReasonRAG's tree search (arXiv 2505.14069), per question."""

    iterations: int = positive(16)   # selections per tree (each expands one leaf or revisits a terminal)
    children_per_node: int = positive(3)  # samples per expansion (identical samples merge)
    c_uct: float = non_negative(1.0)  # UCT exploration constant
    max_depth: int = positive(6)     # model turns on a path; a node at max_depth must answer (else it is worth 0)
    alpha: float = within(0.9, 0, 1, low_open=True)  # SPRE discount per step
    value_source: str = choice("gold", VALUE_SOURCES)  # selection value of a non-terminal leaf: "gold" | "rollout" | "judge"
    rollouts_k: int = positive(2)    # continuations per leaf for value_source="rollout"
    temperature: float = non_negative(1.0)  # sampling of expansions and rollouts
    top_p: float = within(1.0, 0, 1, low_open=True)
    seed: int = non_negative(0)
    min_gap: float = non_negative(0.01)  # preference pairs: least value difference between siblings
    trees_per_batch: int = positive(16)  # trees searched together (rows per generate call: this × children_per_node)
    judge_url: str | None = None     # value_source="judge": an OpenAI-compatible server (…/v1/chat/completions)
    judge_model: str | None = None
    force_answer_notice: str = "Step limit reached. Answer now with what you know."

    def __post_init__(self):
        if self.value_source not in VALUE_SOURCES:
            raise ValueError(f"value_source must be one of {VALUE_SOURCES}, got {self.value_source!r}")
        if self.iterations < 1 or self.children_per_node < 1 or self.max_depth < 1 or self.rollouts_k < 1:
            raise ValueError(f"invalid MCTS limits: {self}")
        if not 0 < self.alpha <= 1 or self.c_uct < 0 or self.min_gap < 0 or self.trees_per_batch < 1:
            raise ValueError(f"invalid MCTS constants: {self}")


@dataclass(eq=False)
class StepNode:
    """One step of a tree. ``prefix_ids`` is what the children continue from: the prompt, every step and
    environment block on the path, this step and its own environment block (``<result>`` after a search); empty
    for terminal nodes, which nothing continues from."""

    prefix_ids: list[int]
    depth: int = 0
    step_ids: list[int] = field(default_factory=list)   # the step's sampled ids (empty at the root)
    env_ids: list[int] = field(default_factory=list)    # environment ids appended after the step
    text: str = ""                                      # the step's text as generated
    env_text: str = ""
    action: str = "root"                                # "root" | "search" | "answer" | "none"
    carry: str = ""                                     # text at the end of prefix_ids the next turn is parsed with
    queries: list[str] = field(default_factory=list)
    doc_ids: list[str] = field(default_factory=list)    # passages this step's search retrieved
    answer: str | None = None
    f1: float | None = None
    finish: str = ""                                    # terminal: answer, no_action, incomplete, budget, depth
    issues: list[str] = field(default_factory=list)
    reward: float | None = None                         # SPRE reward of a terminal node
    estimate: float | None = None                       # value_source's selection value while a non-terminal leaf
    visits: int = 0
    value: float = 0.0
    children: list["StepNode"] = field(default_factory=list)
    parent: "StepNode | None" = field(default=None, repr=False)

    @property
    def terminal(self) -> bool:
        return bool(self.finish)

    def path(self) -> list["StepNode"]:
        """Root … self."""
        nodes, node = [], self
        while node is not None:
            nodes.append(node)
            node = node.parent
        return nodes[::-1]

    def path_doc_ids(self) -> list[str]:
        return [d for n in self.path() for d in n.doc_ids]

    def path_text(self) -> str:
        """Steps and environment blocks below the root (for display and the judge; training uses the ids)."""
        return "".join(n.text + n.env_text for n in self.path()[1:])

    def to_dict(self) -> dict:
        """Nested, browsable; token ids only as counts (``preferences.jsonl`` carries the ids)."""
        return {"action": self.action, "depth": self.depth, "text": self.text, "env_text": self.env_text,
                "queries": self.queries, "doc_ids": self.doc_ids, "answer": self.answer, "f1": self.f1,
                "finish": self.finish, "issues": self.issues, "reward": self.reward, "estimate": self.estimate,
                "visits": self.visits, "value": round(self.value, 6), "n_step_tokens": len(self.step_ids),
                "n_env_tokens": len(self.env_ids), "n_prefix_tokens": len(self.prefix_ids),
                "children": [c.to_dict() for c in self.children]}


@dataclass(eq=False)
class SearchTree:
    id: str
    question: str
    answers: list[str]
    root: StepNode
    supporting_ids: list[str] = field(default_factory=list)
    prompt_text: str = ""

    @property
    def prompt_len(self) -> int:
        return len(self.root.prefix_ids)

    def nodes(self) -> Iterable[StepNode]:
        stack = [self.root]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(reversed(node.children))

    def to_dict(self) -> dict:
        return {"id": self.id, "question": self.question, "answers": self.answers,
                "supporting_ids": self.supporting_ids, "prompt_ids": self.root.prefix_ids,
                "prompt_text": self.prompt_text, "root_carry": self.root.carry, "n_nodes": sum(1 for _ in self.nodes()),
                "root": self.root.to_dict()}


# -- SPRE, UCT and backpropagation ----------------------------------------------------------------------------------
def spre_reward(answer: str | None, answers: Sequence[str], depth: int, alpha: float) -> float:
    """SPRE reward of an answer given at ``depth`` (model turns from the prompt): ``F1 * alpha**depth``; 0 without
    an answer."""
    if answer is None or not answers:
        return 0.0
    return f1(answer, answers) * alpha ** depth


def uct_score(child: StepNode, parent_visits: int, c_uct: float) -> float:
    if child.visits == 0:
        return math.inf
    return child.value + c_uct * math.sqrt(math.log(max(parent_visits, 1)) / child.visits)


def select_child(node: StepNode, c_uct: float) -> StepNode:
    """The child with the highest UCT score (the first on ties)."""
    return max(node.children, key=lambda c: uct_score(c, node.visits, c_uct))


def refresh_values(node: StepNode | None) -> None:
    """From ``node`` up to the root: visits = the children's visits, value = their visit-weighted mean value."""
    while node is not None:
        if node.children:
            node.visits = sum(c.visits for c in node.children)
            node.value = (sum(c.visits * c.value for c in node.children) / node.visits) if node.visits else 0.0
        node = node.parent


def gold_coverage(doc_ids: Iterable[str], supporting_ids: Sequence[str]) -> float | None:
    """Share of the gold supporting passage ids among ``doc_ids``; None without gold ids."""
    gold = list(dict.fromkeys(supporting_ids))
    if not gold:
        return None
    seen = set(doc_ids)
    return sum(g in seen for g in gold) / len(gold)


# -- the tree search ------------------------------------------------------------------------------------------------
@dataclass
class MCTSStats:
    generate_calls: int = 0
    expanded_nodes: int = 0
    children: int = 0
    merged_duplicates: int = 0
    retrieval_calls: int = 0
    rollout_calls: int = 0
    judge_calls: int = 0
    seconds: float = 0.0


ValueFn = Callable[[list[tuple[SearchTree, StepNode]]], list[float]]


class StepTreeSearch:
    """ReasonRAG's MCTS over the protocol's turns, batched across trees.

    ``rollout`` supplies the engine's limits (``max_turn_tokens``, ``max_total_tokens`` per path, ``top_k``,
    ``max_result_chars``, ``block_repeated_queries``, ``result_suffix``); sampling comes from ``config``.
    ``value_fn`` replaces the configured value source (called with (tree, leaf) pairs, returns values in the
    SPRE scale); ``judge`` replaces the :class:`PathJudge` built from ``config.judge_url``."""

    def __init__(self, backend: Backend, search: SearchFn | None, rollout: RolloutConfig | None = None,
                 config: MCTSConfig | None = None, value_fn: ValueFn | None = None,
                 judge: Callable[[Sequence[tuple[str, Sequence[str], str]]], list[float]] | None = None):
        self.backend, self.search = backend, search
        self.rollout = rollout or RolloutConfig()
        self.config = config or MCTSConfig()
        self.tokenizer = backend.tokenizer
        self.engine = RolloutEngine(backend, search, self.rollout)  # its retrieval and result blocks
        self.value_fn = value_fn
        self._judge = judge
        self.stats = MCTSStats()
        self._calls = 0
        self._warned_no_gold = False

    # -- trees ------------------------------------------------------------------------------------------------------
    def new_tree(self, question: str, answers: Sequence[str], prompt_ids: Sequence[int], carry: str = "",
                 supporting_ids: Sequence[str] = (), tree_id: str | None = None) -> SearchTree:
        """``carry``: text at the end of the prompt that opens the reply (e.g. ``<think>``); the first turn is
        parsed as carry + generated text, as :meth:`RolloutEngine.run`'s ``prefixes``."""
        root = StepNode(prefix_ids=list(prompt_ids), carry=carry)
        text = self.tokenizer.decode(list(prompt_ids), skip_special_tokens=False)
        return SearchTree(tree_id or question, question, list(answers), root, list(supporting_ids), text)

    def select(self, tree: SearchTree) -> StepNode:
        node = tree.root
        while node.children:
            node = select_child(node, self.config.c_uct)
        return node

    def _budget_left(self, tree: SearchTree, node: StepNode) -> int:
        return self.rollout.max_total_tokens - (len(node.prefix_ids) - tree.prompt_len)

    def _sampling(self) -> SamplingConfig:
        self._calls += 1
        return SamplingConfig(temperature=self.config.temperature, top_p=self.config.top_p,
                              seed=self.config.seed + 7919 * self._calls)

    # -- expansion --------------------------------------------------------------------------------------------------
    def expand(self, leaves: Sequence[tuple[SearchTree, StepNode]]) -> list[list[StepNode]]:
        """One model turn for ``children_per_node`` samples of every leaf, in ONE generate call resumed from each
        leaf's ``prefix_ids``; every query of the turn in ONE search call. The new children are attached to their
        leaves and returned (not yet valued). A leaf without token budget left becomes a terminal dead end."""
        cfg, k = self.config, self.config.children_per_node
        out: list[list[StepNode]] = [[] for _ in leaves]
        live = []
        for j, (tree, node) in enumerate(leaves):
            if node.terminal or node.children:
                raise ValueError("only non-terminal leaves can be expanded")
            if min(self.rollout.max_turn_tokens, self._budget_left(tree, node)) < 1:
                node.finish, node.reward, node.estimate = "budget", 0.0, None
                continue
            live.append(j)
        if not live:
            return out
        rows = [j for j in live for _ in range(k)]
        limits = {r: min(self.rollout.max_turn_tokens, self._budget_left(*leaves[j])) for r, j in enumerate(rows)}
        session = self.backend.open([leaves[j][1].prefix_ids for j in rows], self._sampling())
        segments = session.generate(list(range(len(rows))), limits)
        session.release(list(range(len(rows))))
        self.stats.generate_calls += 1
        self.stats.expanded_nodes += len(live)

        pending: list[tuple[SearchTree, StepNode, StepNode, list[str], list[bool]]] = []
        for r, j in enumerate(rows):
            tree, parent = leaves[j]
            seg = segments[r]
            if any(c.step_ids == list(seg.token_ids) for c in out[j]):
                self.stats.merged_duplicates += 1
                continue
            turn = parse_turn(parent.carry + seg.text)
            child = StepNode(prefix_ids=[], depth=parent.depth + 1, step_ids=list(seg.token_ids), text=seg.text,
                             issues=list(turn.issues), parent=parent)
            out[j].append(child)
            if turn.kind == "answer":
                child.action, child.answer, child.finish = "answer", turn.answer, "answer"
                child.f1 = f1(turn.answer, tree.answers) if turn.answer is not None and tree.answers else 0.0
            elif turn.kind in ("search", "invalid"):
                child.action = "search"
                if child.depth >= cfg.max_depth:
                    child.finish = "depth"  # still searching where an answer was due: never answers
                elif turn.kind == "invalid":
                    self._attach_env(tree, parent, child, RESULT_TEMPLATE.format(
                        results="(empty query: nothing was searched)"))
                else:
                    child.queries = list(turn.queries)
                    earlier = [set(q.lower().split()) for n in parent.path() for q in n.queries]
                    repeats = [self.rollout.block_repeated_queries and set(q.lower().split()) in earlier
                               for q in child.queries]
                    pending.append((tree, parent, child, child.queries, repeats))
            else:  # incomplete (cut inside an action) or no action at all: the path ends without an answer
                child.action = "none"
                child.finish = "budget" if seg.finish == "length" else (
                    "no_action" if turn.kind == "none" else "incomplete")
        if pending:
            self._search(pending)
        for j in live:
            leaves[j][1].children = out[j]
            self.stats.children += len(out[j])
        return out

    def _search(self, pending) -> None:
        """One retrieval call for the fresh queries of every new search step, blocks built as the engine does."""
        fresh = [q for *_, qs, reps in pending for q, rep in zip(qs, reps) if not rep]
        contexts = {q: {"searches_so_far": sum(1 for n in parent.path() if n.queries),
                        "context_tokens": len(parent.prefix_ids) + len(child.step_ids)}
                    for _, parent, child, qs, _ in pending for q in qs}
        results, error = self.engine._retrieve(fresh, contexts)
        self.stats.retrieval_calls += 1 if fresh else 0
        for tree, parent, child, qs, repeats in pending:
            blocks = []
            for q, rep in zip(qs, repeats):
                if rep:
                    blocks.append(["(repeated query: see the earlier results above)"])
                    child.issues.append("repeated_query")
                else:
                    blocks.append(results.get(q, []))
                    child.doc_ids.extend(h.id for h in blocks[-1])
            if error:
                child.issues.append("search_error")
                text = RESULT_TEMPLATE.format(results=f"(search unavailable: {error[:200]})")
            else:
                text = self.engine._result_block(blocks, qs)
            self._attach_env(tree, parent, child, text)

    def _attach_env(self, tree: SearchTree, parent: StepNode, child: StepNode, text: str) -> None:
        """The environment block after a search step (plus the forced-answer notice before the last allowed
        step, plus the engine's ``result_suffix``); a block that does not fit the budget ends the path."""
        if child.depth == self.config.max_depth - 1:
            text += RESULT_TEMPLATE.format(results=self.config.force_answer_notice)
        if self.rollout.result_suffix:
            text += self.rollout.result_suffix
            child.carry = self.rollout.result_suffix
        ids = text_ids(self.tokenizer, text)
        left = self._budget_left(tree, parent) - len(child.step_ids)
        if len(ids) + 16 > left:
            child.finish, child.carry = "budget", ""
            return
        child.env_text, child.env_ids = text, ids
        child.prefix_ids = parent.prefix_ids + child.step_ids + ids

    # -- values -----------------------------------------------------------------------------------------------------
    def evaluate(self, items: Sequence[tuple[SearchTree, StepNode]]) -> None:
        """Sets each new node's first visit: SPRE reward when terminal, else the value source's estimate."""
        open_items = []
        for tree, node in items:
            if node.terminal:
                node.reward = spre_reward(node.answer, tree.answers, node.depth, self.config.alpha) \
                    if node.action == "answer" else 0.0
                node.value = node.reward
            else:
                open_items.append((tree, node))
        if open_items:
            for (_, node), v in zip(open_items, self._estimates(open_items)):
                node.estimate = node.value = float(v)
        for _, node in items:
            node.visits = max(node.visits, 1)

    def _estimates(self, items: list[tuple[SearchTree, StepNode]]) -> list[float]:
        if self.value_fn is not None:
            return self.value_fn(items)
        source = self.config.value_source
        if source == "gold":
            return [self.gold_value(tree, node) for tree, node in items]
        if source == "rollout":
            return self.rollout_values(items)
        return self.judge_values(items)

    def gold_value(self, tree: SearchTree, node: StepNode) -> float:
        """Share of gold supporting passages retrieved on the path, discounted as an answer at the next step."""
        share = gold_coverage(node.path_doc_ids(), tree.supporting_ids)
        if share is None:
            if not self._warned_no_gold:
                log.warning("question %r has no gold supporting passage ids: the gold value source gives 0",
                            tree.question[:80])
                self._warned_no_gold = True
            return 0.0
        return share * self.config.alpha ** (node.depth + 1)

    def judge_values(self, items: list[tuple[SearchTree, StepNode]]) -> list[float]:
        if self._judge is None:
            self._judge = PathJudge(self.config.judge_url or "", self.config.judge_model or "")
        scores = self._judge([(tree.question, tree.answers, node.path_text()) for tree, node in items])
        self.stats.judge_calls += len(items)
        return [float(s) * self.config.alpha ** (node.depth + 1) for s, (_, node) in zip(scores, items)]

    def rollout_values(self, items: list[tuple[SearchTree, StepNode]]) -> list[float]:
        """ReasonRAG eq. 1 literally: ``rollouts_k`` continuations of each leaf to the end (the rollout engine,
        resumed from the leaf's ids), each worth ``F1 * alpha**(leaf depth + its model turns)``, averaged. Leaves
        with the same remaining depth share one engine run."""
        cfg, k = self.config, self.config.rollouts_k
        values = [0.0] * len(items)
        by_depth: dict[int, list[int]] = {}
        for i, (_, node) in enumerate(items):
            by_depth.setdefault(node.depth, []).append(i)
        for depth, idx in sorted(by_depth.items()):
            budget = min(self._budget_left(*items[i]) for i in idx)
            if budget < 1:
                continue
            rcfg = replace(self.rollout, sampling=self._sampling(), max_total_tokens=budget,
                           max_searches=max(0, cfg.max_depth - depth - 1))
            rows = [i for i in idx for _ in range(k)]
            trajs = RolloutEngine(self.backend, self.search, rcfg).run(
                [items[i][1].prefix_ids for i in rows], [items[i][0].question for i in rows],
                prefixes=[items[i][1].carry for i in rows])
            self.stats.rollout_calls += 1
            for i, t in zip(rows, trajs):
                turns = sum(1 for s in t.steps if s["kind"] == "model")
                values[i] += spre_reward(t.answer, items[i][0].answers, depth + turns, cfg.alpha) / k
        return values

    # -- the search loop --------------------------------------------------------------------------------------------
    def step(self, trees: Sequence[SearchTree]) -> None:
        """One MCTS iteration on every tree: select, expand all selected leaves in one batch, value the new
        children, back the values up. A selected terminal leaf is revisited (its visit count grows)."""
        to_expand = []
        for tree in trees:
            leaf = self.select(tree)
            if leaf.terminal:
                leaf.visits += 1
                refresh_values(leaf.parent)
            else:
                to_expand.append((tree, leaf))
        if not to_expand:
            return
        new = self.expand(to_expand)
        self.evaluate([(tree, child) for (tree, _), children in zip(to_expand, new) for child in children])
        for tree, leaf in to_expand:
            if leaf.terminal and not leaf.children:  # no budget left to expand: a dead end
                leaf.reward = leaf.value = 0.0
                leaf.visits = max(leaf.visits, 1)
                refresh_values(leaf.parent)
            else:
                refresh_values(leaf)

    def run(self, trees: Sequence[SearchTree]) -> list[SearchTree]:
        start = time.perf_counter()
        for _ in range(self.config.iterations):
            self.step(trees)
        self.stats.seconds += time.perf_counter() - start
        return list(trees)


def build_trees(backend: Backend, search: SearchFn | None, examples: Sequence, rollout: RolloutConfig | None = None,
                config: MCTSConfig | None = None, system_prompt: str = SYSTEM_PROMPT, assistant_prefix: str = "<think>",
                backgrounds: dict[str, str] | None = None, progress: Callable[[str], None] | None = None,
                **search_kwargs) -> tuple[list[SearchTree], MCTSStats]:
    """Trees for ``examples`` (:class:`~kunlunlab.data.types.QAExample`: question, answers, supporting_ids),
    searched ``config.trees_per_batch`` at a time. Prompts are the agent's (``build_messages`` + the assistant
    prefix, as the DAPO rollouts); ``backgrounds`` (question → RDRA background) puts RDRA's block in them."""
    config = config or MCTSConfig()
    tree_search = StepTreeSearch(backend, search, rollout, config, **search_kwargs)
    trees: list[SearchTree] = []
    for start in range(0, len(examples), config.trees_per_batch):
        chunk = examples[start:start + config.trees_per_batch]
        batch = []
        for ex in chunk:
            background = (backgrounds or {}).get(ex.question)
            prompt = chat_prompt_ids(backend.tokenizer, build_messages(ex.question, background, system_prompt),
                                     assistant_prefix)
            batch.append(tree_search.new_tree(ex.question, ex.answers, prompt, assistant_prefix,
                                              getattr(ex, "supporting_ids", ()), getattr(ex, "id", None)))
        tree_search.run(batch)
        trees.extend(batch)
        if progress:
            progress(f"MCTS: {len(trees)}/{len(examples)} trees, {tree_search.stats.children} steps sampled")
    return trees, tree_search.stats


__all__ = ["ACTIONS", "VALUE_SOURCES", "MCTSConfig", "MCTSStats", "SearchTree", "StepNode", "StepTreeSearch",
           "build_trees", "gold_coverage", "refresh_values", "select_child", "spre_reward", "uct_score"]
