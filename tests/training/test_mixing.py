"""Progressive data mixing: the schedule against eqs. 14-16, trajectories with real retrieval, the SFT mask."""
import json
import random
import re

import pytest

from kunlunlab.agent.protocol import parse_turn
from kunlunlab.data.splits import load_rl_prompts
from kunlunlab.training.mixing import (NOISE_KINDS, MixingConfig, TrajectoryBuilder, data_stats, evidence_sentence,
                                   hq_share, mix, noise_ratio, schedule, tokenize_trajectory)
from kunlunlab.retrieval.retriever import IndexConfig, build_retriever
from kunlunlab.training.rewards import format_compliant, parse_completion


# the plain search-think mixture (the `agent` ablation's): no RDRA background, plan samples or STIE rounds
PLAIN = {"rdra_background": False, "plan_samples": 0, "stie_feedback_share": 0.0}
# the run's retrieval sizes (TrainConfig.top_k / max_result_chars), which every builder is given
SIZES = {"top_k": 2, "max_result_chars": 300}
ONE = {"top_k": 1, "max_result_chars": 300}


@pytest.fixture(scope="module")
def bm25(world):
    return build_retriever(world.passages, IndexConfig(kind="bm25"))


@pytest.fixture(scope="module")
def tokenizer():
    from kunlunlab.models import load_llm

    return load_llm()[1]


def test_schedule_follows_equations_14_to_16():
    cfg = MixingConfig(epochs=6, turning_epoch=4, hq_share_start=0.5, hq_shape=2.0, noise_start=0.2, noise_end=0.8,
                       samples_per_epoch=10)
    assert hq_share(0, cfg) == 0.5                        # eq. 14: cold start at 1:1
    for e in range(6):
        progress = min(1.0, e / 4)
        assert hq_share(e, cfg) == pytest.approx(0.5 + 0.5 * progress ** 2)      # eq. 15
        assert noise_ratio(e, cfg) == pytest.approx(0.2 + 0.6 * progress)        # eq. 16
    assert hq_share(4, cfg) == hq_share(5, cfg) == 1.0    # 100 % from the turning epoch on
    rows = schedule(cfg)
    assert [r["n_hq"] + r["n_noisy"] for r in rows] == [10] * 6 and rows[0]["n_noisy"] == 5 and rows[4]["n_noisy"] == 0
    shares = [r["hq_share"] for r in rows]
    assert shares == sorted(shares)


def test_invalid_mixing_config_is_rejected():
    with pytest.raises(ValueError, match="hq_share_start"):
        MixingConfig(hq_share_start=1.5)
    with pytest.raises(ValueError, match="noise_kinds"):
        MixingConfig(noise_kinds=("typos",))


def test_high_quality_trajectory_follows_the_gold_chain_with_real_results(world, questions, bm25):
    builder = TrajectoryBuilder(bm25.search, world.passages, MixingConfig(**PLAIN), **SIZES)
    for ex in questions[:10]:
        t = builder.world(ex)
        assert t.quality == "hq" and not t.noise
        rec = parse_completion(t.text)
        assert format_compliant(rec) and rec.answer == ex.answers[0]
        env = [s["text"] for s in t.segments if s["role"] == "env"]
        for hop in ex.chain:  # every gold passage is in some result block, the hop's answer with it
            assert any(world.passages[int(hop.passage_id[1:])].title in block for block in env)
        model_turns = [s for s in t.segments if s["role"] == "model"]
        assert all(parse_turn(("<think>" if i == 0 else "") + s["text"]).kind in ("search", "answer")
                   for i, s in enumerate(model_turns))


def test_think_turns_quote_the_shown_sentence_that_holds_each_hop_answer(world, questions, bm25):
    builder = TrajectoryBuilder(bm25.search, world.passages, MixingConfig(**PLAIN, quote_evidence=True), **SIZES)
    quoted = 0
    for ex in questions[:20]:
        t = builder.world(ex)
        segs = t.segments
        for i, seg in enumerate(segs):
            if seg["role"] != "model" or i == 0:
                continue
            for quote, answer in re.findall(r'"([^"]+)" So: ([^.]+)\.', seg["text"]):
                assert quote in segs[i - 1]["text"]        # copied verbatim from the result just shown
                assert answer in quote                     # and it holds the stated hop answer
                quoted += 1
        hops_stated = sum(1 for h in ex.chain if f"{h.answer}." in t.text)
        assert hops_stated == len(ex.chain)
    assert quoted >= 20
    assert evidence_sentence("(1) \"A\"\nA was born in 1901. He was married to Bo Ek.", "Bo Ek") == "He was married to Bo Ek."
    assert evidence_sentence("(1) \"A\"\nA was known for songs.", "no") is None   # yes/no is never quoted
    plain = TrajectoryBuilder(bm25.search, world.passages, MixingConfig(**PLAIN), **SIZES)   # the default: no quotes
    assert "So:" not in plain.world(questions[0]).text


def test_noisy_trajectories_still_reach_the_gold_answer(world, questions, bm25):
    builder = TrajectoryBuilder(bm25.search, world.passages, MixingConfig(**PLAIN), **SIZES)
    rng = random.Random(3)
    seen = set()
    for ex in questions[:30]:
        t = builder.world(ex, rho=1.0, rng=rng, kinds=NOISE_KINDS)
        seen.update(t.noise)
        assert t.quality == "noisy" and parse_completion(t.text).answer == ex.answers[0]
        if "wrong_hop" in t.noise:  # the wrong turn is out of the loss, the correction is in it
            untrained = [s for s in t.segments if s["role"] == "model" and not s["train"]]
            assert len(untrained) == 1
            later = t.segments[t.segments.index(untrained[0]) + 2]
            assert later["train"] and "Correction:" in later["text"]
        if "distractor" in t.noise:
            assert "The results do not answer this" in t.text
        if "background" in t.noise:
            assert t.background
    assert seen == set(NOISE_KINDS)


def test_sft_dataset_keeps_epochs_in_order_and_batches_similar_lengths(world, questions, bm25, tokenizer):
    from kunlunlab.training.sft import sft_dataset

    cfg = MixingConfig(epochs=2, turning_epoch=1, samples_per_epoch=8, **PLAIN)
    trajs = mix(TrajectoryBuilder(bm25.search, world.passages, cfg, **SIZES), questions, cfg, seed=2)
    ds = sft_dataset(tokenizer, trajs, 4096, batch_size=4)
    lengths = [len(ids) for ids in ds["input_ids"]]
    assert len(ds) == 16
    for e in (0, 1):  # epoch 0 fills the first 8 rows, epoch 1 the next 8
        want = sorted(tuple(tokenize_trajectory(tokenizer, t)["input_ids"]) for t in trajs if t.epoch == e)
        assert sorted(tuple(ids) for ids in ds["input_ids"][8 * e:8 * e + 8]) == want
    for b in range(0, 16, 4):  # within a batch lengths are sorted: similar lengths share a batch
        assert lengths[b:b + 4] == sorted(lengths[b:b + 4])


def test_mix_obeys_the_schedule_epoch_by_epoch(world, questions, bm25):
    cfg = MixingConfig(epochs=3, turning_epoch=2, samples_per_epoch=12, **PLAIN)
    trajs = mix(TrajectoryBuilder(bm25.search, world.passages, cfg, **SIZES), questions, cfg, seed=1)
    assert [t.epoch for t in trajs] == sorted(t.epoch for t in trajs)  # curriculum order
    for row in schedule(cfg):
        epoch = [t for t in trajs if t.epoch == row["epoch"]]
        assert len(epoch) == 12 and sum(t.quality == "noisy" for t in epoch) == row["n_noisy"]
    stats = data_stats(trajs)
    assert {"epoch", "quality", "hops", "searches", "chars"} <= set(stats[0])


def test_first_turn_samples_hold_the_decomposition_only(world, questions, bm25):
    cfg = MixingConfig(epochs=2, turning_epoch=1, samples_per_epoch=6, first_turn_samples=3, **PLAIN)
    trajs = mix(TrajectoryBuilder(bm25.search, world.passages, cfg, **SIZES), questions, cfg, seed=4)
    partial = [t for t in trajs if t.partial]
    assert len(partial) == 6 and len(trajs) == 18
    for t in partial:
        assert len(t.segments) == 1 and t.segments[0]["role"] == "model"
        turn = parse_turn("<think>" + t.segments[0]["text"])
        assert turn.kind == "search" and turn.queries
    for e in (0, 1):  # the first-turn questions are not the epoch's full-trajectory questions
        full = {t.question for t in trajs if t.epoch == e and not t.partial}
        assert not full & {t.question for t in partial if t.epoch == e}


def test_sft_tokens_mask_exactly_prompt_results_and_wrong_turns(world, questions, bm25, tokenizer):
    builder = TrajectoryBuilder(bm25.search, world.passages, MixingConfig(**PLAIN), **SIZES)
    t = builder.world(questions[1], rho=1.0, rng=random.Random(0), kinds=("wrong_hop",))
    row = tokenize_trajectory(tokenizer, t)
    ids, mask = row["input_ids"], row["completion_mask"]
    assert len(ids) == len(mask)
    trained = tokenizer.decode([i for i, m in zip(ids, mask) if m])
    untrained = tokenizer.decode([i for i, m in zip(ids, mask) if not m])
    assert "<result>" not in trained and "<result>" in untrained
    assert "<question>" in untrained and "<short_answer>" in trained
    for seg in t.segments:
        assert (seg["text"].strip() in trained) == (seg["role"] == "model" and seg["train"])


def test_sft_collator_of_trl_keeps_the_mask(world, questions, bm25, tokenizer):
    """TRL's own label builder and collator turn completion_mask == 0 into -100, nothing else."""
    from trl import SFTConfig, SFTTrainer

    from kunlunlab.models import load_llm
    from kunlunlab.training.sft import sft_dataset

    builder = TrajectoryBuilder(bm25.search, world.passages, MixingConfig(**PLAIN), **SIZES)
    trajs = [builder.world(q) for q in questions[:2]]
    model, tok = load_llm()
    trainer = SFTTrainer(model=model, processing_class=tok, train_dataset=sft_dataset(tok, trajs, 2048),
                         args=SFTConfig(output_dir="/tmp/kunlunlab-collator-test", completion_only_loss=True,
                                        report_to=[], use_cpu=True, per_device_train_batch_size=2))
    batch = next(iter(trainer.get_train_dataloader()))
    assert batch["input_ids"].shape[0] == 2
    for t in trajs:
        want = tokenize_trajectory(tok, t)
        n = len(want["input_ids"])
        row = [r for r in range(2) if batch["input_ids"][r, :n].tolist() == want["input_ids"]]
        assert len(row) == 1, "every trajectory is in the batch, unchanged"
        labels = batch["labels"][row[0]].tolist()
        assert labels[:n] == [i if m else -100 for i, m in zip(want["input_ids"], want["completion_mask"])]
        assert all(v == -100 for v in labels[n:])  # padding


def test_rl_prompts_from_the_search_r1_layout(tmp_path, data_dir):
    examples = load_rl_prompts(data_dir / "musique/test.jsonl", limit=3)
    assert len(examples) == 3 and all(ex.question and ex.answers for ex in examples)
    import datasets

    rows = [json.loads(line) for line in (data_dir / "bamboogle/test.jsonl").read_text().splitlines()[:4]]
    path = tmp_path / "zerosearch.parquet"
    datasets.Dataset.from_list(rows).to_parquet(str(path))
    parquet = load_rl_prompts(path)
    assert [ex.answers for ex in parquet] == [ex.answers for ex in load_rl_prompts(data_dir / "bamboogle/test.jsonl",
                                                                                   limit=4)]


def test_rl_prompts_reject_a_wrong_parquet_layout(tmp_path):
    import datasets

    from kunlunlab.data.types import DataFormatError

    path = tmp_path / "bad.parquet"
    datasets.Dataset.from_list([{"q": "x"}]).to_parquet(str(path))
    with pytest.raises(DataFormatError, match="veRL layout"):
        load_rl_prompts(path)
    with pytest.raises(FileNotFoundError):
        load_rl_prompts(tmp_path / "missing.parquet")


def test_whole_agent_trajectories_carry_rdra_background_plans_and_stie_rounds(world, questions, bm25, tokenizer):
    """The SFT data runs the agent as `kunlun` is evaluated: RDRA's background block in the prompt, plan
    samples for eq. 2, and STIE feedback rounds appended as environment (masked) tokens."""
    from kunlunlab.agent.protocol import RESULT_TEMPLATE
    from kunlunlab.agent.rdra import RDRAConfig

    rdra = RDRAConfig(background_k=2, plan_k=1, max_docs=3, max_doc_chars=200)
    cfg = MixingConfig(rdra_background=True)
    builder = TrajectoryBuilder(bm25.search, world.passages, cfg, rdra, **ONE)
    ex = next(q for q in questions if q.type == "compositional")
    t = builder.world(ex)
    assert t.background.startswith("Plan:\n" + ex.chain[0].question) and "Documents:\n(1)" in t.background
    assert t.background.count("\n(") == 2  # three numbered passages: (1) on the first line, (2) and (3)

    plan = builder.plan_sample(ex)
    row = tokenize_trajectory(tokenizer, plan)
    trained = [i for i, m in zip(row["input_ids"], row["completion_mask"]) if m]
    assert tokenizer.decode(trained[:-1]) == ex.chain[0].question and trained[-1] == tokenizer.eos_token_id
    assert "Search plan:" in tokenizer.decode(row["input_ids"])

    for wrong_first in (False, True):
        t = builder.add_stie_round(builder.world(ex), ex, wrong_first, random.Random(3))
        feedback = [s for s in t.segments if s.get("feedback")]
        assert len(feedback) == 1 and feedback[0]["train"] is False
        assert feedback[0]["text"].startswith(RESULT_TEMPLATE.split("{")[0]) and "Answer memory:" in feedback[0]["text"]
        answers = re.findall(r"\\boxed\{(.*?)\}", t.text)
        assert answers[-1] == ex.answers[0] and t.stie_rounds == 1
        assert (answers[0] != ex.answers[0]) == wrong_first
        before_feedback = t.segments[t.segments.index(feedback[0]) - 1]
        assert before_feedback["train"] is (not wrong_first)  # a wrong first answer stays out of the loss
        row = tokenize_trajectory(tokenizer, t)
        fb_ids = tokenizer(feedback[0]["text"], add_special_tokens=False)["input_ids"]
        ids, mask = row["input_ids"], row["completion_mask"]
        start = next(i for i in range(len(ids)) if ids[i:i + len(fb_ids)] == fb_ids)
        assert set(mask[start:start + len(fb_ids)]) == {0}
        record = parse_completion(t.text)
        assert record.answer == ex.answers[0] and record.n_searches == t.searches


def test_mix_adds_plan_samples_and_feedback_rounds(world, questions, bm25):
    cfg = MixingConfig(epochs=2, turning_epoch=1, samples_per_epoch=8, rdra_background=True,
                       plan_samples=2, stie_feedback_share=0.5)
    out = mix(TrajectoryBuilder(bm25.search, world.passages, cfg, **ONE), questions, cfg, seed=0)
    rows = data_stats(out)
    assert sum(r["kind"] == "plan" for r in rows) == 4
    assert 0 < sum(r["stie_rounds"] > 0 for r in rows) < 16
    assert all(t.background for t in out if t.kind == "trajectory")


def test_real_sources_take_their_share_of_each_epoch_as_high_quality_samples(world, questions, bm25):
    from kunlunlab.data import Passage, QAExample
    from kunlunlab.training.mixing import RealSource

    corpus = [Passage("a", "Mila Dross", "Mila Dross (born 1950) was a singer."),
              Passage("b", "Pell Varn", "Pell Varn (born 1941) was a painter.")]
    real = QAExample("r1", "Who was born first, Mila Dross or Pell Varn?", ["Pell Varn"], "2wikimultihopqa",
                     type="comparison", supporting_titles=["Mila Dross", "Pell Varn"], supporting_ids=["a", "b"])

    def search(queries, k):
        from kunlunlab.retrieval.retriever import Hit
        return [[Hit(p.id, p.contents, 1.0, p.title) for p in corpus if p.title in q][:k] for q in queries]

    cfg = MixingConfig(epochs=2, turning_epoch=1, samples_per_epoch=10, **PLAIN)
    source = RealSource("2wikimultihopqa", TrajectoryBuilder(search, corpus, cfg, **SIZES), [real], share=0.2)
    trajs = mix(TrajectoryBuilder(bm25.search, world.passages, cfg, **SIZES), questions, cfg, [source], seed=3)
    for e in (0, 1):
        epoch = [t for t in trajs if t.epoch == e]
        assert len(epoch) == 10
        wiki = [t for t in epoch if t.source == "2wikimultihopqa"]
        assert len(wiki) == 1 and wiki[0].quality == "hq"  # share 0.2 of 10, capped by the one question
    t = wiki[0]
    assert "Mila Dross (born 1950)" in t.text and "Pell Varn (born 1941)" in t.text
    assert t.text.endswith("<short_answer>\\boxed{Pell Varn}</short_answer>")


def test_background_facts_reads_a_hop_the_background_shows_instead_of_searching_it(world, questions, tokenizer):
    """With ``background_facts`` a hop whose passage is in RDRA's background is stated from it and not
    searched; the hops it does not show are searched as before. Without the option every hop is searched."""
    from kunlunlab.agent.rdra import RDRAConfig
    from kunlunlab.retrieval.retriever import Hit

    ex = next(q for q in questions if q.type == "compositional" and len(q.chain) == 2)
    by_id = {p.id: p for p in world.passages}
    first, second = (by_id[h.passage_id] for h in ex.chain)

    def search(queries, k):  # the background (question and plan queries) finds hop 1's page only
        return [[Hit(p.id, p.contents, 1.0, p.title)] for p in
                (second if q == ex.chain[1].question else first for q in queries)]

    rdra = RDRAConfig(background_k=1, plan_k=1, max_docs=2)
    plain = TrajectoryBuilder(search, world.passages, MixingConfig(rdra_background=True), rdra, **ONE).world(ex)
    reading = TrajectoryBuilder(search, world.passages,
                                MixingConfig(rdra_background=True, background_facts=True), rdra, **ONE).world(ex)
    assert plain.background == reading.background and first.title in reading.background
    assert second.title not in reading.background
    assert plain.searches == 2 and reading.searches == 1
    q1, a1, q2 = ex.chain[0].question, ex.chain[0].answer, ex.chain[1].question
    assert reading.segments[0]["text"].startswith(f"From the background: {q1} {a1}. Next: {q2}</think>")
    assert re.findall(r"<query>(.*?)</query>", reading.text) == [q2]
    assert re.findall(r"\\boxed\{(.*?)\}", reading.text) == [ex.answers[0]]
    record = parse_completion(reading.text)
    assert record.answer == ex.answers[0] and record.n_searches == 1 and format_compliant(record)

    def everything(queries, k):  # a background that shows both hops: the answer comes without a search
        return [[Hit(p.id, p.contents, 1.0, p.title) for p in (first, second)] for _ in queries]

    direct = TrajectoryBuilder(everything, world.passages,
                               MixingConfig(rdra_background=True, background_facts=True),
                               RDRAConfig(background_k=2, plan_k=2, max_docs=2), **ONE).world(ex)
    assert direct.searches == 0 and len(direct.segments) == 1
    assert direct.text.startswith(f"<think>From the background: {q1} {a1}. From the background: {q2}")
    row = tokenize_trajectory(tokenizer, direct)
    assert sum(row["completion_mask"]) > 0 and parse_completion(direct.text).answer == ex.answers[0]


def test_background_facts_as_a_share_reads_the_background_for_that_share_of_questions(world, questions):
    """A share applies the option to about that share of the questions, the same ones every time, and
    draws nothing from the mixing's random stream (a share of 0 gives the default data exactly)."""
    from kunlunlab.agent.rdra import RDRAConfig
    from kunlunlab.retrieval.retriever import Hit

    by_id = {p.id: p for p in world.passages}

    chains = [q for q in questions if q.type in ("compositional", "inference", "bridge")][:40]
    shows = {q.question: [h.passage_id for h in q.chain] for q in chains}  # a question's background: its chain
    shows |= {h.question: [h.passage_id] for q in chains for h in q.chain}  # a hop's search: its own page

    def everything(queries, k):
        return [[Hit(i, by_id[i].contents, 1.0, by_id[i].title) for i in shows[q]] for q in queries]

    rdra = RDRAConfig(background_k=4, plan_k=1, max_docs=4, use_plan=False)

    def searches(share, rng_seed=0):
        b = TrajectoryBuilder(everything, world.passages,
                              MixingConfig(rdra_background=True, background_facts=share), rdra, **ONE)
        return [b.world(q, rho=0.0, rng=random.Random(rng_seed)).searches for q in chains]

    none, half, full = searches(0.0), searches(0.5), searches(True)
    assert all(n > 0 for n in none) and sum(full) == 0  # True reads as share 1
    read = [h == 0 for h in half]
    assert 0.25 * len(chains) <= sum(read) <= 0.75 * len(chains)
    assert [h == n for h, n, r in zip(half, none, read) if not r] == [True] * (len(chains) - sum(read))
    assert searches(0.5, rng_seed=7) == half  # the same questions, whatever the random stream
    with pytest.raises(ValueError, match="background_facts must lie in"):
        MixingConfig(background_facts=1.5)


def test_background_facts_on_a_real_bridge_question_searches_only_the_page_the_background_lacks():
    from kunlunlab.agent.rdra import RDRAConfig
    from kunlunlab.data import Passage, QAExample
    from kunlunlab.retrieval.retriever import Hit

    corpus = [Passage("a", "Orla Fenn", "Orla Fenn (born 1950) was a singer. She was born in Tarrow."),
              Passage("b", "Tarrow", "Tarrow is a town whose mayor is Ivo Brent."),
              Passage("c", "Mill Lane", "Mill Lane is a street.")]
    real = QAExample("r2", "Who is the mayor of the town where Orla Fenn was born?", ["Ivo Brent"], "hotpotqa",
                     type="bridge", supporting_titles=["Orla Fenn", "Tarrow"], supporting_ids=["a", "b"])

    def search(queries, k):  # the background finds Orla Fenn's page; only a search for "Tarrow" finds its page
        return [[Hit(p.id, p.contents, 1.0, p.title) for p in corpus
                 if p.title == q or (q != "Tarrow" and p.id in "ac")][:k] for q in queries]

    rdra = RDRAConfig(background_k=2, plan_k=1, max_docs=2, background_share=1.0)
    cfg = MixingConfig(rdra_background=True)
    plain = TrajectoryBuilder(search, corpus, cfg, rdra, **ONE).hotpot(real)
    cfg = MixingConfig(rdra_background=True, background_facts=True)
    reading = TrajectoryBuilder(search, corpus, cfg, rdra, **ONE).hotpot(real)
    assert "Orla Fenn (born 1950)" in reading.background and "mayor" not in reading.background
    assert re.findall(r"<query>(.*?)</query>", plain.text) == ["Orla Fenn", "Tarrow"]
    assert re.findall(r"<query>(.*?)</query>", reading.text) == ["Tarrow"]
    assert reading.segments[0]["text"].startswith("From the background: Orla Fenn. Next: Tarrow</think>")
    assert reading.text.endswith("the answer is Ivo Brent.</think>\n<short_answer>\\boxed{Ivo Brent}</short_answer>")


def test_plan_free_rdra_trajectories_carry_the_first_stage_only_and_no_plan_samples(world, questions, bm25):
    """With RDRAConfig(use_plan=False) the SFT prompts show what plan-free inference shows (D_1 without a plan
    line) and no planning samples are written, since that form never runs eq. 2."""
    from kunlunlab.agent.rdra import RDRAConfig

    rdra = RDRAConfig(background_k=2, max_docs=5, max_doc_chars=200, use_plan=False)
    cfg = MixingConfig(epochs=2, turning_epoch=1, samples_per_epoch=8, rdra_background=True,
                       plan_samples=2, stie_feedback_share=0.5)
    builder = TrajectoryBuilder(bm25.search, world.passages, cfg, rdra, **ONE)
    ex = next(q for q in questions if q.type == "compositional")
    t = builder.world(ex)
    first = [h.contents[:40] for h in bm25.search([ex.question], 2)[0]]
    assert t.background.startswith("Documents:\n(1) " + first[0]) and "Plan:" not in t.background
    assert re.findall(r"^\((\d)\) ", t.background, re.M) == ["1", "2"]  # the two first-stage passages only
    out = mix(builder, questions, cfg, seed=0)
    assert not any(r["kind"] == "plan" for r in data_stats(out)) and len(out) == 16
    assert all(t.background.startswith("Documents:") for t in out)


def test_the_default_mixing_writes_the_kunlun_recipe(world, questions, bm25):
    """The defaults write the data of the whole agent that TrainConfig's default method runs: RDRA's background
    (with the paper's plan, RDRAConfig's default) in every trajectory, 12 planning samples per epoch and STIE
    feedback rounds on a share of the trajectories."""
    cfg = MixingConfig(epochs=1, turning_epoch=1, samples_per_epoch=8)
    out = mix(TrajectoryBuilder(bm25.search, world.passages, cfg, **ONE), questions, cfg, seed=0)
    rows = data_stats(out)
    assert sum(r["kind"] == "plan" for r in rows) == 12 and len(out) == 8 + 12
    assert all(t.background.startswith("Plan:\n") for t in out if t.kind == "trajectory")
    assert 0 < sum(r["stie_rounds"] > 0 for r in rows) < 8


def test_summary_questions_are_answered_in_the_long_mode_and_factoid_ones_in_the_short(world, questions, bm25):
    """The long-answer mode (§2.3) is in the SFT data: a summary-oriented question's last turn is a
    ``<long_answer>`` stating the chain's facts, closed by the boxed link, scored as a perfect long answer;
    its STIE round answers in the long form again and never starts with a wrong answer."""
    from kunlunlab.data.questions import summary_questions

    builder = TrajectoryBuilder(bm25.search, world.passages, MixingConfig(**PLAIN), **SIZES)
    for ex in summary_questions(world, 6, seed=4):
        t = builder.world(ex)
        record = parse_completion(t.text)
        assert record.mode == "long" and record.answer == ex.answers[0] and format_compliant(record)
        assert all(fact.rstrip(".") in record.answer_body for fact in ex.facts)
        stie = builder.add_stie_round(builder.world(ex), ex, wrong_first=True, rng=random.Random(0))
        answers = [parse_turn(s["text"]) for s in stie.segments if s["role"] == "model" and "_answer>" in s["text"]]
        assert [(a.answer_mode, a.answer) for a in answers] == [("long", ex.answers[0])] * 2
        assert "stie_correction" not in stie.noise
    assert parse_completion(builder.world(questions[0]).text).mode == "short"
