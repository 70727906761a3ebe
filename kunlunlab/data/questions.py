"""Multi-hop questions over a :class:`~kunlunlab.data.world.World`, with gold chains.

Types follow 2WikiMultihopQA (comparison, inference, compositional, bridge_comparison) and
HotpotQA (bridge). Every hop names the passage that states its answer, so a chain is both the
retrieval ground truth and a ready-made training trajectory (see the progressive-training issue).

Summary-oriented questions (``summary``, not among the factoid ``QUESTION_TYPES``) ask for the long-answer mode
of the paper's dual-mode answers (§2.3, eq. 18): "Describe how X is connected to Y." over a two-hop chain
X → M → Y. Their gold is the chain's facts (``QAExample.facts``, one sentence per hop) and the link M, which goes
into the box; :func:`summary_questions` draws them.
"""
from __future__ import annotations

import random
from typing import Callable

from kunlunlab.data.types import Hop, QAExample
from kunlunlab.data.world import World

QUESTION_TYPES = ("compositional", "inference", "comparison", "bridge_comparison", "bridge")


SUMMARY_TYPE = "summary"


def _example(world: World, qtype: str, question: str, answers: list[str], chain: list[Hop],
             facts: list[str] | None = None) -> QAExample:
    ids = list(dict.fromkeys(h.passage_id for h in chain if h.passage_id))
    titles = [world.passages[int(pid[1:])].title for pid in ids]
    return QAExample(id="", question=question, answers=list(dict.fromkeys(answers)), source="synthetic",
                     type=qtype, supporting_titles=titles, supporting_ids=ids, chain=chain, facts=list(facts or []))


def _compositional(world: World, rng: random.Random) -> QAExample | None:
    variant = rng.randrange(3)
    if variant < 2:
        f_idx = rng.randrange(len(world.films))
        film = world.films[f_idx]
        d = world.people[film.director]
        first = Hop(f"Who directed {film.page_title}?", d.name, world.passage("film", f_idx))
        if variant == 0:
            relation, target = rng.choice([("mother", d.mother), ("father", d.father)])
            if target is None:
                return None
            answer = world.people[target].name
            return _example(world, "compositional", f"Who is the {relation} of the director of film {film.page_title}?",
                            [answer], [first, Hop(f"Who is the {relation} of {d.name}?", answer,
                                                  world.passage("person", film.director))])
        city = world.cities[d.birthplace].name
        return _example(world, "compositional", f"Where was the director of film {film.page_title} born?", [city],
                        [first, Hop(f"Where was {d.name} born?", city, world.passage("person", film.director))])
    c_idx = rng.randrange(len(world.companies))
    company = world.companies[c_idx]
    founder = world.people[company.founder]
    country = world.countries[world.cities[founder.birthplace].country].name
    return _example(world, "compositional", f"In which country was the founder of {company.name} born?", [country], [
        Hop(f"Who founded {company.name}?", founder.name, world.passage("company", c_idx)),
        Hop(f"Which country is {founder.name} from?", country, world.passage("person", company.founder)),
    ])


def _inference(world: World, rng: random.Random) -> QAExample | None:
    p_idx = rng.randrange(len(world.people))
    person = world.people[p_idx]
    relation, first_rel, second_rel = rng.choice([
        ("paternal grandfather", "father", "father"), ("maternal grandmother", "mother", "mother"),
        ("paternal grandmother", "father", "mother"), ("father-in-law", "spouse", "father"),
        ("mother-in-law", "spouse", "mother"),
    ])
    middle = getattr(person, first_rel)
    if middle is None or getattr(world.people[middle], second_rel) is None:
        return None
    mid, end = world.people[middle], world.people[getattr(world.people[middle], second_rel)]
    word = "spouse" if first_rel == "spouse" else first_rel
    return _example(world, "inference", f"Who is the {relation} of {person.title}?", [end.name], [
        Hop(f"Who is the {word} of {person.title}?", mid.name, world.passage("person", p_idx)),
        Hop(f"Who is the {second_rel} of {mid.name}?", end.name, world.passage("person", middle)),
    ])


def _comparison(world: World, rng: random.Random) -> QAExample | None:
    variant = rng.randrange(3)
    if variant == 0:
        a, b = rng.sample(range(len(world.films)), 2)
        fa, fb = world.films[a], world.films[b]
        if fa.year == fb.year or fa.title == fb.title:
            return None
        win = fa if fa.year < fb.year else fb
        return _example(world, "comparison", f"Which film came out first, {fa.page_title} or {fb.page_title}?",
                        [win.page_title, win.title], [
                            Hop(f"When was {fa.page_title} released?", str(fa.year), world.passage("film", a)),
                            Hop(f"When was {fb.page_title} released?", str(fb.year), world.passage("film", b))])
    a, b = rng.sample(range(len(world.people)), 2)
    pa, pb = world.people[a], world.people[b]
    if variant == 1:
        if pa.born == pb.born or pa.name == pb.name:
            return None
        win = pa if pa.born < pb.born else pb
        return _example(world, "comparison", f"Who was born first, {pa.title} or {pb.title}?", [win.title, win.name], [
            Hop(f"When was {pa.title} born?", str(pa.born), world.passage("person", a)),
            Hop(f"When was {pb.title} born?", str(pb.born), world.passage("person", b))])
    ca = world.countries[world.cities[pa.birthplace].country].name
    cb = world.countries[world.cities[pb.birthplace].country].name
    return _example(world, "comparison", f"Are {pa.title} and {pb.title} from the same country?",
                    ["yes" if ca == cb else "no"], [
                        Hop(f"Which country is {pa.title} from?", ca, world.passage("person", a)),
                        Hop(f"Which country is {pb.title} from?", cb, world.passage("person", b))])


def _bridge_comparison(world: World, rng: random.Random) -> QAExample | None:
    a, b = rng.sample(range(len(world.films)), 2)
    fa, fb = world.films[a], world.films[b]
    da, db = world.people[fa.director], world.people[fb.director]
    if fa.director == fb.director or fa.title == fb.title:
        return None
    if rng.random() < 0.5 or da.died is None or db.died is None:
        if da.born == db.born:
            return None
        win = fa if da.born < db.born else fb
        question, attr = f"Which film has the director born earlier, {fa.page_title} or {fb.page_title}?", "born"
    else:
        if da.died == db.died:
            return None
        win = fa if da.died < db.died else fb
        question, attr = f"Which film has the director who died first, {fa.page_title} or {fb.page_title}?", "died"
    when = "When was {} born?" if attr == "born" else "When did {} die?"
    return _example(world, "bridge_comparison", question, [win.page_title, win.title], [
        Hop(f"Who directed {fa.page_title}?", da.name, world.passage("film", a)),
        Hop(f"Who directed {fb.page_title}?", db.name, world.passage("film", b)),
        Hop(when.format(da.name), str(getattr(da, attr)), world.passage("person", fa.director)),
        Hop(when.format(db.name), str(getattr(db, attr)), world.passage("person", fb.director)),
    ])


def _bridge(world: World, rng: random.Random) -> QAExample | None:
    if rng.random() < 0.5:
        p_idx = rng.randrange(len(world.people))
        person = world.people[p_idx]
        c_idx = world.cities[person.birthplace].country
        country = world.countries[c_idx]
        capital = world.cities[country.capital].name
        return _example(world, "bridge", f"What is the capital of the country where {person.title} was born?",
                        [capital], [
                            Hop(f"Which country is {person.title} from?", country.name, world.passage("person", p_idx)),
                            Hop(f"What is the capital of {country.name}?", capital, world.passage("country", c_idx))])
    f_idx = rng.randrange(len(world.films))
    film = world.films[f_idx]
    company = world.companies[film.company]
    city = world.cities[company.headquarters].name
    return _example(world, "bridge", f"The company that produced {film.page_title} is headquartered in which city?",
                    [city], [
                        Hop(f"Which company produced {film.page_title}?", company.name, world.passage("film", f_idx)),
                        Hop(f"Where is {company.name} headquartered?", city, world.passage("company", film.company))])


def _summary(world: World, rng: random.Random) -> QAExample | None:
    """"Describe how X is connected to Y." over a two-hop chain X → M → Y: a film's producer and its
    headquarters, a film's director and his or her birthplace, a company's founder and his or her country, or a
    person's parent and grandparent. The box holds M; the facts are the two hops as sentences."""
    variant = rng.randrange(4)
    if variant < 2:  # a film, then its producer's headquarters or its director's birthplace
        f_idx = rng.randrange(len(world.films))
        film = world.films[f_idx]
        start = film.page_title
        if variant == 0:
            company = world.companies[film.company]
            link, end, second = company.name, world.cities[company.headquarters].name, ("company", film.company)
            steps = [(f"Which company produced {start}?", f"{start} was produced by {link}."),
                     (f"Where is {link} headquartered?", f"{link} is headquartered in {end}.")]
        else:
            director = world.people[film.director]
            link, end, second = director.name, world.cities[director.birthplace].name, ("person", film.director)
            steps = [(f"Who directed {start}?", f"{start} was directed by {link}."),
                     (f"Where was {link} born?", f"{link} was born in {end}.")]
        chain = [Hop(steps[0][0], link, world.passage("film", f_idx)), Hop(steps[1][0], end, world.passage(*second))]
        facts = [fact for _, fact in steps]
    elif variant == 2:
        c_idx = rng.randrange(len(world.companies))
        company = world.companies[c_idx]
        founder = world.people[company.founder]
        country = world.countries[world.cities[founder.birthplace].country].name
        start, link, end = company.name, founder.name, country
        chain = [Hop(f"Who founded {company.name}?", founder.name, world.passage("company", c_idx)),
                 Hop(f"Which country is {founder.name} from?", country, world.passage("person", company.founder))]
        facts = [f"{company.name} was founded by {founder.name}.", f"{founder.name} is from {country}."]
    else:
        p_idx = rng.randrange(len(world.people))
        person = world.people[p_idx]
        relation = rng.choice(["father", "mother"])
        middle = getattr(person, relation)
        if middle is None or getattr(world.people[middle], relation) is None:
            return None
        mid = world.people[middle]
        top = world.people[getattr(mid, relation)]
        start, link, end = person.title, mid.name, top.name
        chain = [Hop(f"Who is the {relation} of {person.title}?", mid.name, world.passage("person", p_idx)),
                 Hop(f"Who is the {relation} of {mid.name}?", top.name, world.passage("person", middle))]
        facts = [f"The {relation} of {person.title} is {mid.name}.", f"The {relation} of {mid.name} is {top.name}."]
    if start == end or link in (start, end):
        return None
    return _example(world, SUMMARY_TYPE, f"Describe how {start} is connected to {end}.", [link], chain, facts)


_BUILDERS: dict[str, Callable[[World, random.Random], QAExample | None]] = {
    "compositional": _compositional, "inference": _inference, "comparison": _comparison,
    "bridge_comparison": _bridge_comparison, "bridge": _bridge, SUMMARY_TYPE: _summary,
}


def make_questions(world: World, n: int, seed: int = 0, types: tuple[str, ...] = QUESTION_TYPES,
                   id_prefix: str = "syn") -> list[QAExample]:
    """``n`` distinct questions, cycling through ``types`` so every type is equally represented."""
    unknown = set(types) - set(_BUILDERS)
    if unknown:
        raise ValueError(f"unknown question types {sorted(unknown)}; choose from {QUESTION_TYPES + (SUMMARY_TYPE,)}")
    rng = random.Random(f"{world.seed}/{seed}")
    out: list[QAExample] = []
    seen: set[str] = set()
    attempts = 0
    while len(out) < n:
        attempts += 1
        if attempts > 200 * max(n, 10):
            raise RuntimeError(f"could only draw {len(out)} of {n} questions from this world; make it larger")
        example = _BUILDERS[types[len(out) % len(types)]](world, rng)
        if example is None or example.question in seen:
            continue
        seen.add(example.question)
        example.id = f"{id_prefix}-{seed}-{len(out):06d}"
        out.append(example)
    return out


def summary_questions(world: World, n: int, seed: int = 0, id_prefix: str = "summary") -> list[QAExample]:
    """``n`` distinct summary-oriented questions (:data:`SUMMARY_TYPE`); their own draw, so adding them to a
    question set leaves its factoid questions as they were."""
    return make_questions(world, n, seed=seed, types=(SUMMARY_TYPE,), id_prefix=id_prefix)


def make_world_and_questions(n_passages: int = 2000, n_questions: int = 200, seed: int = 0):
    """Convenience for notebooks: the world and a question set drawn from it."""
    world = World.generate(n_passages=n_passages, seed=seed)
    return world, make_questions(world, n_questions, seed=seed)
