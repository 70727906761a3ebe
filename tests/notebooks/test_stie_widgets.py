"""Notebook 05's widget: every slider (``CONTROLS``) must change what the read-out shows, and the
tuning helpers (``tune``, ``split_halves``, ``validate``) must do what the notebook says they do.

Each knob has its own hand-built case. Words are short (no 5-character truncation), so W is the set of
words: O("red blue", "red blue green") = 2/3, D = 1/3; O("red blue", "red green") = 1/3, D = 2/3;
O("red blue", "green pink") = 0. Defaults: δ = (0.6, 0.5, 0.4), K = 3, margin 0, overlap_stop 0.2,
confidence_ceiling 0.9, min_new_info 0.1, max_rounds 5. Every expected value below is worked out by hand.
"""
from dataclasses import fields, replace

import pytest

from kunlunlab.agent.stie import RoundInput as R
from kunlunlab.agent.stie import STIEConfig
from kunlunlab.studies.stie_tuning import CONTROLS, STOP_REASONS, readout, split_halves, tune, validate

# knob -> (case, value moved to, expected read-out at the default, expected read-out after the move).
# Read-outs list only the fields that differ from the "quiet" ones: rounds end with the cache, nothing
# redundant, replaced or blocked.
FIXTURE = {
    # δ1: "red blue green" right after "red blue" has D = 1/3 < 0.6: redundant (lag 1) and replaced by the
    # memory's "red blue"; with δ1 = 0.3 it is valid (D >= 0.3), a new answer, and the gold one.
    "delta1": ((["red blue green"], [R("red blue", 0.5, ["a"]), R("red blue green", 0.4, ["b"])]), 0.3,
               dict(em=0.0, rounds=2.0, redundant=1, replaced=1), dict(em=1.0, rounds=2.0)),
    # δ2: the same pair two rounds apart (the round between has no answer, so lag 1 is skipped):
    # D = 1/3 < δ2 = 0.5 is redundant; δ2 = 0.3 lets it through.
    "delta2": ((["red blue green"], [R("red blue", 0.5, ["a"]), R(None, 0.2, ["b"]),
                                     R("red blue green", 0.4, ["c"])]), 0.3,
               dict(em=0.0, rounds=3.0, redundant=1, replaced=1), dict(em=1.0, rounds=3.0)),
    # δ3: three rounds apart: D = 1/3 < δ3 = 0.4 is redundant; δ3 = 0.3 lets it through. The mean overlap
    # after the move is 2/3 (only "red blue" answered among the last three), so no early stop.
    "delta3": ((["red blue green"], [R("red blue", 0.5, ["a"]), R(None, 0.2, ["b"]), R(None, 0.2, ["c"]),
                                     R("red blue green", 0.4, ["d"])]), 0.3,
               dict(em=0.0, rounds=4.0, redundant=1, replaced=1), dict(em=1.0, rounds=4.0)),
    # K: "red green" (valid after "red blue": D = 2/3, mean overlap 1/3 >= 0.2) then repeated twice
    # (redundant twice). Round 3 keeps it (0.7 > 0.4); at round 4 n = 3 = K shields it and "red blue"
    # replaces it (a blocklist from then on). With K = 4, n = 3 < 4: nothing is shielded or replaced.
    "repeat_k": ((["red blue"], [R("red blue", 0.4, ["a"]), R("red green", 0.7, ["b"]), R("red green", 0.7, ["c"]),
                                 R("red green", 0.7, ["d"])]), 4,
                 dict(em=1.0, rounds=4.0, redundant=2, replaced=1, blocked=1),
                 dict(em=0.0, rounds=4.0, redundant=2)),
    # margin: round 3 repeats "red green" (best 0.5); the rival "red blue" has 0.8 > 0.5 + 0, so it replaces
    # it; with margin 0.4, 0.8 <= 0.5 + 0.4 and the round keeps its own answer.
    "margin": ((["red green"], [R("red blue", 0.8, ["a"]), R("red green", 0.5, ["b"]), R("red green", 0.3, ["c"])]),
               0.4, dict(em=0.0, rounds=3.0, redundant=1, replaced=1), dict(em=1.0, rounds=3.0, redundant=1)),
    # overlap_stop: "green pink" after "red blue" is valid with mean overlap 0 < 0.2: stop ("new_answer").
    # At 0 the loop goes on; round 3 "red blue" is redundant with round 1 (lag 2, D = 0) and, tied at 0.5
    # with "green pink", the earlier answer (its own) is kept: the final answer is no longer the gold one.
    "overlap_stop": ((["green pink"], [R("red blue", 0.5, ["a"]), R("green pink", 0.5, ["b"]),
                                       R("red blue", 0.5, ["c"])]), 0.0,
                     dict(em=1.0, rounds=2.0, stop="new_answer"), dict(em=0.0, rounds=3.0, redundant=1)),
    # confidence_ceiling: the first answer's 0.85 is below 0.9, so the valid "red green" (mean overlap 1/3)
    # takes over; at 0.8 the first round stops as "confident" with the gold answer.
    "confidence_ceiling": ((["red blue"], [R("red blue", 0.85, ["a"]), R("red green", 0.7, ["b"])]), 0.8,
                           dict(em=0.0, rounds=2.0), dict(em=1.0, rounds=1.0, stop="confident")),
    # min_new_info: round 2 retrieves {a, c} after {a, b}: a new share of 1/2 >= 0.1 goes on (the answer
    # repeats: redundant, not replaced: same surface form); 1/2 < 0.6 stops there ("no_new_info").
    "min_new_info": ((["red blue"], [R("red blue", 0.5, ["a", "b"]), R("red blue", 0.5, ["a", "c"]),
                                     R(None, 0.2, ["d"])]), 0.6,
                     dict(em=1.0, rounds=3.0, redundant=1), dict(em=1.0, rounds=2.0, redundant=1, stop="no_new_info")),
    # max_rounds: three cached rounds, nothing stops early (valid "red green" has mean overlap 1/3); a budget
    # of 2 ends at round 2.
    "max_rounds": ((["red green"], [R("red blue", 0.5, ["a"]), R("red green", 0.5, ["b"]), R(None, 0.2, ["c"])]), 2,
                   dict(em=1.0, rounds=3.0), dict(em=1.0, rounds=2.0, stop="max_rounds")),
}


def expected(em: float, rounds: float, stop: str = "end_of_cache", redundant: int = 0, replaced: int = 0,
             blocked: int = 0, all_blocked: int = 0) -> dict:
    """A one-case read-out, spelled out."""
    stops = dict.fromkeys(STOP_REASONS, 0)
    stops[stop] = 1
    return {"em": em, "rounds": rounds, "n": 1, "stops": stops, "redundant": redundant, "replaced": replaced,
            "blocked": blocked, "all_blocked": all_blocked}


def test_every_control_is_a_config_knob_with_its_default_in_range_and_a_fixture():
    defaults = STIEConfig()
    assert set(CONTROLS) <= {f.name for f in fields(STIEConfig)}
    assert set(CONTROLS) == set(FIXTURE), "each slider needs a case that shows its effect"
    for name, (low, high, step) in CONTROLS.items():
        moved = FIXTURE[name][1]
        assert low <= getattr(defaults, name) <= high and low <= moved <= high and step > 0
        assert moved != getattr(defaults, name)
        assert abs((moved - low) / step - round((moved - low) / step)) < 1e-9, "the moved value must be on the slider"


@pytest.mark.parametrize("name", list(FIXTURE))
def test_moving_each_control_changes_the_readout(name):
    case, moved, before, after = FIXTURE[name]
    default = STIEConfig()
    assert readout([case], default) == expected(**before)
    assert readout([case], replace(default, **{name: moved})) == expected(**after)


@pytest.mark.parametrize("name", list(FIXTURE))
def test_each_control_also_changes_the_readout_on_the_whole_fixture(name):
    cases = [case for case, *_ in FIXTURE.values()]
    assert readout(cases, STIEConfig()) != readout(cases, replace(STIEConfig(), **{name: FIXTURE[name][1]}))


def test_readout_counts_all_blocked_rounds_and_empty_input():
    # K = 1: "red blue" is shielded at once and is the only candidate: all blocked (rounds 1 and 2: the
    # repeat is redundant, shielded, and still the only answer).
    case = (["red blue"], [R("red blue", 0.5, ["a"]), R("red blue", 0.5, ["b"])])
    r = readout([case], STIEConfig(repeat_k=1))
    assert r["all_blocked"] == 2 and r["blocked"] == 2 and r["redundant"] == 1 and r["em"] == 1.0
    assert readout([], STIEConfig())["n"] == 0


def test_split_halves_alternates():
    assert split_halves(list("abcde")) == (["a", "c", "e"], ["b", "d"])


def test_tune_keeps_the_first_improvement_and_stops_when_a_pass_changes_nothing():
    case = FIXTURE["repeat_k"][0]
    # From K = 4 (EM 0): K = 2 shields "red green" at round 3 and ends on "red blue" (EM 1, 4 rounds);
    # K = 3 also gives EM 1 in 4 rounds: not strictly better, so K = 2 stays. Pass 2 changes nothing.
    # Evaluations: the base, pass 1 (K = 2, 3, 4: once at K = 2, 4 is no longer the current value),
    # pass 2 (K = 3, 4; 2 is current) = 1 + 3 + 2 = 6.
    result = tune([case], STIEConfig(repeat_k=4), {"repeat_k": (2, 3, 4)})
    assert result["chosen"] == {"repeat_k": 2} and result["passes"] == 2 and result["evaluations"] == 6
    assert result["score"] == {"em": 1.0, "rounds": 4.0, "n": 1}


def test_tune_breaks_em_ties_by_fewer_rounds_and_keeps_the_deltas_ordered():
    case = FIXTURE["min_new_info"][0]  # EM 1 either way: 3 rounds at 0.1, 2 at 0.6
    assert tune([case], STIEConfig(), {"min_new_info": (0.1, 0.6)})["chosen"] == {"min_new_info": 0.6}
    # δ2 = 0.7 > δ1 = 0.6 breaks δ1 >= δ2 >= δ3: never tried (only the base is scored).
    result = tune([FIXTURE["delta2"][0]], STIEConfig(), {"delta2": (0.7,)})
    assert result["chosen"] == {"delta2": 0.5} and result["evaluations"] == 1


def test_validate_tunes_on_even_indices_and_reports_the_odd_ones():
    fewer, ceiling = FIXTURE["min_new_info"][0], FIXTURE["confidence_ceiling"][0]
    # Tuning half (indices 0, 2): two min_new_info cases, 0.6 saves a round. Held-out half (1, 3): the
    # confidence case, whose round 2 brings only new documents: 0.6 changes nothing there (EM 0, 2 rounds).
    result = validate([fewer, ceiling, fewer, ceiling], STIEConfig(), {"min_new_info": (0.1, 0.6)})
    assert result["chosen"] == {"min_new_info": 0.6} and result["n_tune"] == 2 and result["n_heldout"] == 2
    assert result["tuning_half"] == {"default": {"em": 1.0, "rounds": 3.0, "n": 2},
                                     "tuned": {"em": 1.0, "rounds": 2.0, "n": 2}}
    assert result["heldout_half"] == {"default": {"em": 0.0, "rounds": 2.0, "n": 2},
                                      "tuned": {"em": 0.0, "rounds": 2.0, "n": 2}}
    assert "alternating" in result["split"]


@pytest.mark.parametrize("name", list(FIXTURE))
def test_the_tuner_widget_slider_of_each_control_changes_its_readout(name):
    """Notebook 05's widget (``kunlunlab.viz.apps.stie_tuner``): setting the slider itself re-scores."""
    from kunlunlab.studies.stie_tuning import format_readout
    from kunlunlab.viz.apps import stie_tuner

    case, moved, before, after = FIXTURE[name]
    tuner = stie_tuner({"case": [case]})
    assert set(tuner.sliders) == set(CONTROLS)
    assert tuner.readouts() == {"case": expected(**before)}
    tuner.sliders[name].value = moved
    assert tuner.sliders[name].value == moved and getattr(tuner.config, name) == moved
    assert tuner.readouts() == {"case": expected(**after)}
    assert f"case: {format_readout(expected(**after))}" in tuner.readout.value.replace("&#x27;", "'")
