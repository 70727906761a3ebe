"""A deterministic, seeded synthetic multi-hop world: the embedded default corpus.

Entities (countries, cities, people, films, companies) get attributes and relations, a
Wikipedia-style paragraph each, and multi-hop questions of the 2WikiMultihopQA types
(comparison, inference, compositional, bridge_comparison) plus the HotpotQA ``bridge`` type,
each with gold answers, supporting passage ids and a gold chain of sub-questions.

The names are invented, so a model cannot answer from memory: it has to retrieve. Retrieval is
made non-trivial on purpose: people share full names (disambiguated only by an occupation in the
title), film titles come in near-identical pairs, and "namesake" distractor paragraphs repeat the
surface forms of real entities around different facts.

``World.generate(n_passages, seed)`` scales from 1k to 1M+ passages in pure Python.
"""
from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

from kunlunlab.data.types import Passage

_ONSETS = ["b", "br", "c", "d", "dr", "f", "g", "gr", "h", "k", "kr", "l", "m", "n", "p", "r", "s", "st",
           "t", "tr", "v", "vr", "z", "th", "sh", "ch", "w", "j", "qu", "sk"]
_VOWELS = ["a", "e", "i", "o", "u", "ae", "ai", "ei", "ou", "ia", "y"]
_CODAS = ["", "", "", "n", "r", "l", "s", "th", "m", "nd", "rk", "st", "x", "v", "lt"]
_MALE = ["Aldric", "Bram", "Cassian", "Dorian", "Emeric", "Falk", "Gideon", "Halvar", "Ivo", "Joren", "Kasimir",
         "Lorcan", "Matthias", "Niko", "Osric", "Pavel", "Quentin", "Rurik", "Silas", "Tobias", "Ulric", "Viktor",
         "Wendel", "Yorick", "Zeno", "Anselm", "Benedikt", "Corin", "Damek", "Edvin", "Florian", "Gustav",
         "Henrik", "Isidor", "Jasper", "Konrad", "Leopold", "Marek", "Nestor", "Oskar"]
_FEMALE = ["Adela", "Brigida", "Celine", "Dagny", "Elin", "Freya", "Greta", "Hedda", "Ilse", "Jolanta", "Katja",
           "Liesel", "Mara", "Nadia", "Odile", "Petra", "Ragna", "Signe", "Tamsin", "Ursula", "Vesna", "Wilma",
           "Yara", "Zora", "Astrid", "Beata", "Clio", "Dora", "Eira", "Fenna", "Gisela", "Hilde", "Ida",
           "Juna", "Kaja", "Lene", "Milla", "Nora", "Orla", "Pia"]
_ADJ = ["Silent", "Crimson", "Hollow", "Golden", "Last", "Broken", "Distant", "Frozen", "Hidden", "Burning",
        "Quiet", "Iron", "Pale", "Restless", "Wandering", "Forgotten", "Bitter", "Velvet", "Northern", "Empty"]
_NOUN = ["River", "Harbor", "Garden", "Mirror", "Season", "Crown", "Letter", "Bridge", "Winter", "Orchard",
         "Lantern", "Tide", "Station", "Kingdom", "Promise", "Shadow", "Voyage", "Meadow", "Signal", "Tower"]
_COMPANY_SUFFIX = ["Industries", "Pictures", "Works", "Holdings", "Studios", "Group", "Motors", "Records"]
_OCCUPATIONS = ["director", "actor", "painter", "novelist", "composer", "architect", "physicist", "footballer",
                "politician", "photographer"]
_CONTINENTS = ["Aurelia", "Borealis", "Castora", "Dravenna"]


@dataclass
class Country:
    name: str
    capital: int = -1  # city index
    currency: str = ""
    continent: str = ""


@dataclass
class City:
    name: str
    country: int
    founded: int
    population: int


@dataclass
class Person:
    name: str
    title: str
    male: bool
    born: int
    died: int | None
    birthplace: int  # city index
    occupation: str
    father: int | None = None
    mother: int | None = None
    spouse: int | None = None


@dataclass
class Film:
    title: str
    page_title: str
    year: int
    director: int
    company: int
    country: int


@dataclass
class Company:
    name: str
    founded: int
    founder: int
    headquarters: int  # city index


@dataclass
class World:
    """All entities plus their passages; questions are drawn by :mod:`kunlunlab.data.questions`."""

    seed: int
    countries: list[Country] = field(default_factory=list)
    cities: list[City] = field(default_factory=list)
    people: list[Person] = field(default_factory=list)
    films: list[Film] = field(default_factory=list)
    companies: list[Company] = field(default_factory=list)
    passages: list[Passage] = field(default_factory=list)
    passage_of: dict[tuple[str, int], str] = field(default_factory=dict)  # (kind, index) -> passage id

    # ------------------------------------------------------------------ generation
    @classmethod
    def generate(cls, n_passages: int = 2000, seed: int = 0) -> "World":
        if n_passages < 200:
            raise ValueError(f"n_passages must be at least 200 for a connected world, got {n_passages}")
        world = cls(seed=seed)
        rng = random.Random(seed)
        names = _NameFactory(rng)
        n_countries = max(8, min(400, n_passages // 400))
        n_cities = max(30, int(n_passages * 0.06))
        n_people = int(n_passages * 0.48)
        n_films = int(n_passages * 0.22)
        n_companies = int(n_passages * 0.08)

        for _ in range(n_countries):
            world.countries.append(Country(names.place(), currency=names.word().capitalize() + " mark",
                                           continent=rng.choice(_CONTINENTS)))
        for i in range(n_cities):
            country = i if i < n_countries else rng.randrange(n_countries)  # every country gets a city
            prefix = rng.choice(["", "", "", "Port ", "New ", "San ", "Upper "])
            world.cities.append(City(prefix + names.place(), country, rng.randint(800, 1900),
                                     rng.randint(5, 3000) * 1000))
        for c, country in enumerate(world.countries):
            country.capital = c  # city c was created in country c
        world._make_people(rng, names, n_people, n_cities)
        world._make_companies(rng, names, n_companies)
        world._make_films(rng, n_films)
        world._write_passages(rng, n_passages)
        return world

    def _make_people(self, rng: random.Random, names: "_NameFactory", n_people: int, n_cities: int) -> None:
        # Births in increasing order so parents are always older than children.
        births = sorted(rng.randint(1800, 1990) for _ in range(n_people))
        shared_names: dict[bool, list[str]] = {True: [], False: []}
        for born in births:
            male = rng.random() < 0.5
            if shared_names[male] and rng.random() < 0.12:  # namesakes: same full name, different person
                full = rng.choice(shared_names[male])
            else:
                full = f"{rng.choice(_MALE if male else _FEMALE)} {names.surname()}"
                if rng.random() < 0.2:
                    shared_names[male].append(full)
            lifespan = rng.randint(35, 95)
            died = born + lifespan if born + lifespan < 2024 and (born < 1930 or rng.random() < 0.5) else None
            self.people.append(Person(full, full, male, born, died,
                                      rng.randrange(n_cities), rng.choice(_OCCUPATIONS)))
        self._disambiguate_titles()
        # Parents are drawn among people of the right sex born 18-50 years earlier; births are sorted, so
        # a bisect over each sex's birth years finds that window at any world size.
        older: dict[bool, tuple[list[int], list[int]]] = {True: ([], []), False: ([], [])}  # (births, indexes)
        for i, person in enumerate(self.people):
            for is_male, attr in ((True, "father"), (False, "mother")):
                years, indexes = older[is_male]
                lo = bisect.bisect_left(years, person.born - 50)
                hi = bisect.bisect_right(years, person.born - 18)
                if hi > lo and rng.random() < 0.75:
                    setattr(person, attr, indexes[rng.randrange(lo, hi)])
            older[person.male][0].append(person.born)
            older[person.male][1].append(i)
        singles: dict[bool, list[int]] = {True: [], False: []}
        for i, person in enumerate(self.people):
            partners = singles[not person.male]
            if partners and rng.random() < 0.5 and abs(self.people[partners[-1]].born - person.born) < 15:
                j = partners.pop()
                person.spouse, self.people[j].spouse = j, i
            else:
                singles[person.male].append(i)
                del singles[person.male][:-50]

    def _disambiguate_titles(self) -> None:
        counts: dict[str, int] = {}
        for person in self.people:
            counts[person.name] = counts.get(person.name, 0) + 1
        seen: dict[str, int] = {}
        for person in self.people:
            if counts[person.name] > 1:
                base = f"{person.name} ({person.occupation})"
                n = seen.get(base, 0) + 1
                seen[base] = n
                person.title = base if n == 1 else f"{person.name} ({person.occupation}, born {person.born})"

    def _make_companies(self, rng: random.Random, names: "_NameFactory", n_companies: int) -> None:
        for _ in range(n_companies):
            founder = rng.randrange(len(self.people))
            founded = min(2023, self.people[founder].born + rng.randint(22, 60))
            self.companies.append(Company(f"{names.word().capitalize()} {rng.choice(_COMPANY_SUFFIX)}", founded,
                                          founder, rng.randrange(len(self.cities))))

    def _make_films(self, rng: random.Random, n_films: int) -> None:
        directors = [i for i, p in enumerate(self.people) if p.occupation == "director"] or [0]
        used: dict[str, int] = {}
        for _ in range(n_films):
            title = f"The {rng.choice(_ADJ)} {rng.choice(_NOUN)}"
            if rng.random() < 0.5:
                title = f"{title} of {self.cities[rng.randrange(len(self.cities))].name}"
            director = rng.choice(directors)
            year = min(2023, self.people[director].born + rng.randint(20, 60))
            used[title] = used.get(title, 0) + 1
            page = title if used[title] == 1 else f"{title} ({year} film)"
            if used[title] > 1 and any(f.page_title == page for f in self.films[-50:]):
                page = f"{title} ({year} film, {len(self.films)})"
            self.films.append(Film(title, page, year, director, rng.randrange(len(self.companies)),
                                   rng.randrange(len(self.countries))))

    # ------------------------------------------------------------------ passages
    def _add(self, kind: str, index: int | None, title: str, text: str) -> None:
        pid = f"w{len(self.passages):07d}"
        self.passages.append(Passage(pid, title, text))
        if index is not None:
            self.passage_of[(kind, index)] = pid

    def _write_passages(self, rng: random.Random, n_passages: int) -> None:
        for i, c in enumerate(self.countries):
            self._add("country", i, c.name, self.country_text(c))
        for i, c in enumerate(self.cities):
            self._add("city", i, c.name, self.city_text(c))
        for i, p in enumerate(self.people):
            self._add("person", i, p.title, self.person_text(p, rng))
        for i, c in enumerate(self.companies):
            self._add("company", i, c.name, self.company_text(c))
        for i, f in enumerate(self.films):
            self._add("film", i, f.page_title, self.film_text(f, rng))
        # Namesake distractors: same surface forms, different (irrelevant) facts.
        while len(self.passages) < n_passages:
            p = self.people[rng.randrange(len(self.people))]
            f = self.films[rng.randrange(len(self.films))]
            city = self.cities[rng.randrange(len(self.cities))]
            text = rng.choice([
                f"{p.name} is also the name of a character in the film {f.title}, set in {city.name}. "
                f"The character was invented for the script and is unrelated to any real {p.occupation}.",
                f"A street in {city.name} is named after {p.name}. Local records about the street date "
                f"from {rng.randint(1850, 2000)}; it appears briefly in {f.title}.",
                f"{f.title} is also the title of a {rng.choice(['novel', 'song', 'play'])} written in "
                f"{rng.randint(1900, 2020)} by an author from {city.name}, not to be confused with the film.",
            ])
            self._add("namesake", None, f"{p.name} (disambiguation)" if "character" in text else f.title, text)

    def country_text(self, c: Country) -> str:
        return (f"{c.name} is a country on the continent of {c.continent}. Its capital is "
                f"{self.cities[c.capital].name} and its currency is the {c.currency}.")

    def city_text(self, c: City) -> str:
        return (f"{c.name} is a city in {self.countries[c.country].name}. It was founded in {c.founded} and "
                f"has a population of about {c.population:,}.")

    def person_text(self, p: Person, rng: random.Random) -> str:
        he, his = ("He", "his") if p.male else ("She", "her")
        city = self.cities[p.birthplace]
        life = f"born {p.born}" if p.died is None else f"{p.born} - {p.died}"
        parts = [rng.choice([
            f"{p.name} ({life}) was a {p.occupation} from {self.countries[city.country].name}, born in {city.name}.",
            f"{p.name} ({life}) was a {self.countries[city.country].name} {p.occupation}. {he} was born in {city.name}.",
        ])]
        if p.died is not None:
            parts.append(f"{he} died in {p.died}.")
        if p.father is not None:
            parts.append(f"{his.capitalize()} father was {self.people[p.father].name}.")
        if p.mother is not None:
            parts.append(f"{his.capitalize()} mother was {self.people[p.mother].name}.")
        if p.spouse is not None:
            parts.append(f"{he} was married to {self.people[p.spouse].name}.")
        return " ".join(parts)

    def company_text(self, c: Company) -> str:
        hq = self.cities[c.headquarters]
        return (f"{c.name} is a company founded in {c.founded} by {self.people[c.founder].name}. It is "
                f"headquartered in {hq.name}, {self.countries[hq.country].name}.")

    def film_text(self, f: Film, rng: random.Random) -> str:
        director = self.people[f.director]
        return rng.choice([
            f"{f.title} is a {f.year} film directed by {director.name}. It was produced by "
            f"{self.companies[f.company].name} and shot in {self.countries[f.country].name}.",
            f"{f.title} is a film released in {f.year}. It was directed by {director.name} and produced by "
            f"{self.companies[f.company].name}; filming took place in {self.countries[f.country].name}.",
        ])

    def passage(self, kind: str, index: int) -> str:
        return self.passage_of[(kind, index)]


class _NameFactory:
    """Pronounceable invented names from syllables; unique where uniqueness matters."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self._used_places: set[str] = set()

    def word(self, syllables: int | None = None) -> str:
        n = syllables or self.rng.choice([2, 2, 2, 3])
        return "".join(self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
                       for _ in range(n))

    def surname(self) -> str:
        return self.word().capitalize()

    def place(self) -> str:
        while True:
            name = self.word().capitalize() + self.rng.choice(["", "", "", "ia", "burg", "ora", "heim"])
            if name not in self._used_places:
                self._used_places.add(name)
                return name
