"""The Voilà apps (``make app``) in a real browser: start ``voila apps/`` on a free port, open each app in
headless system Chromium through Selenium, wait for the widgets to render, change a control as a user
would (pick from the dropdown, type into a slider's read-out) and read what the page shows. Screenshots
of each step are saved in the test's tmp folder (their paths are printed: ``pytest -s``).

Needs ``/usr/bin/chromium`` and ``/usr/bin/chromedriver`` (Debian/Ubuntu: ``apt-get install chromium
chromium-driver``); without them, or without selenium / voila, every test here is skipped. Selenium is
pointed at those two binaries and never downloads a browser or a driver (helpers: ``tests/browser.py``).

Expected values are worked out by hand: reward totals from eqs. 17-18 with the components each
hand-written case is built to get (see tests/notebooks/test_apps.py), STIE read-outs from the case
tests/notebooks/test_stie_widgets.py works through (its ``confidence_ceiling`` case).
"""
import functools
import json
import os
import sys
from pathlib import Path

import pytest
from browser import require_browser

require_browser("voila")

from browser import chromium, free_port, screenshot, serve, set_slider, text_of, wait_for  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

APPS = Path(__file__).resolve().parents[2] / "apps"
START_TIMEOUT = 90    # seconds for voila to answer
RENDER_TIMEOUT = 120  # seconds for a kernel to start and the widgets to render (2 slow cores)
CHANGE_TIMEOUT = 30   # seconds for a changed control to reach the read-out

# The cached rounds the STIE tuner app gets through KUNLUNLAB_ROUNDS: one question, two rounds.
CEILING_RECORD = {"golds": ["red blue"], "trajectory": {"rounds": [
    {"answer": "red blue", "confidence": 0.85, "doc_ids": ["a"]},
    {"answer": "red green", "confidence": 0.7, "doc_ids": ["b"]}]}}

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def voila_url(tmp_path_factory):
    """``voila apps/`` on a free port (``KUNLUNLAB_ROUNDS`` set to a one-question run), stopped afterwards."""
    tmp = tmp_path_factory.mktemp("voila")
    rounds = tmp / "run" / "05_stie_tuning" / "rounds.jsonl"
    rounds.parent.mkdir(parents=True)
    rounds.write_text(json.dumps(CEILING_RECORD) + "\n")
    port = free_port()
    env = {**os.environ, "KUNLUNLAB_ROUNDS": str(tmp / "run"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    url = f"http://127.0.0.1:{port}"
    with serve([sys.executable, "-m", "voila", str(APPS), "--no-browser", f"--port={port}",
                "--Voila.ip=127.0.0.1", "--Voila.port_retries=0"], url + "/", tmp / "voila.log",
               env=env, cwd=APPS.parent, timeout=START_TIMEOUT, name="voila"):
        yield url


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    with chromium(tmp_path_factory.mktemp("chromium")) as driver:
        yield driver


def reward_total(driver) -> str:
    return text_of(driver, ".kl-readout table tr:nth-child(2) td:last-child")


def test_reward_explorer_in_the_browser(voila_url, browser, tmp_path):
    browser.get(voila_url + "/voila/render/reward_explorer.ipynb")
    # the first case, "correct", under the default weights: 0.2 * 1 + 0.1 * 1 + 1.0 * 1 = 1.30
    wait_for(browser, lambda d: reward_total(d) == "1.30", RENDER_TIMEOUT, "the reward explorer did not render")
    assert "Reward explorer" in browser.find_element(By.TAG_NAME, "body").text
    screenshot(browser, tmp_path, "voila-reward-1-rendered")
    # pick "malformed" (unclosed <query> and <think>: format 0.5 - 0.1 = 0.4, length 1, accuracy 1):
    # 0.2 * 0.4 + 0.1 + 1.0 = 1.18
    Select(browser.find_element(By.CSS_SELECTOR, ".kl-case select")).select_by_visible_text("malformed")
    wait_for(browser, lambda d: reward_total(d) == "1.18", CHANGE_TIMEOUT, "picking 'malformed' did not re-score")
    assert "unclosed:query" in text_of(browser, ".kl-readout")
    assert "Who founded Draillam Motors?</search>" in browser.find_element(By.CSS_SELECTOR, ".kl-text textarea") \
        .get_attribute("value")
    # format-heavy: w_format 1.5: 1.5 * 0.4 + 0.1 + 1.0 = 1.70
    set_slider(browser, "w_format", "1.5")
    wait_for(browser, lambda d: reward_total(d) == "1.70", CHANGE_TIMEOUT, "w_format = 1.5 did not re-score")
    # and w_accuracy 0.5: 0.6 + 0.1 + 0.5 = 1.20
    set_slider(browser, "w_accuracy", "0.5")
    wait_for(browser, lambda d: reward_total(d) == "1.20", CHANGE_TIMEOUT, "w_accuracy = 0.5 did not re-score")
    screenshot(browser, tmp_path, "voila-reward-2-malformed-format-heavy")


def stie_line(driver, label: str) -> str:
    """The read-out's row for ``label`` (one row per line of the ``<pre>``), whitespace collapsed."""
    found = driver.find_elements(By.CSS_SELECTOR, ".kl-readout pre")
    try:
        lines = found[0].text.splitlines() if found else []
    except Exception:  # re-rendered between find and read
        return ""
    return next((" ".join(line.split()) for line in lines if line.startswith(label)), "")


@functools.cache
def simulated():
    from kunlunlab.viz.apps import simulation_cases

    return simulation_cases()


def sim_line(config) -> str:
    """The simulation row the tuner must show under ``config``, computed here (no browser, no widget)."""
    from kunlunlab.studies.stie_tuning import format_readout, readout

    return "simulation: " + " ".join(format_readout(readout(simulated(), config)).split())


def em_rounds(line: str) -> str:
    """The "EM … · rounds …" part of a read-out row."""
    return line.split(": ", 1)[-1].split(" · n ")[0]


def test_stie_tuner_in_the_browser(voila_url, browser, tmp_path):
    from dataclasses import replace

    from kunlunlab.agent.stie import RoundInput, STIEConfig
    from kunlunlab.studies.stie_tuning import format_readout, readout

    model_case = [(CEILING_RECORD["golds"], [RoundInput(r["answer"], r["confidence"], r["doc_ids"])
                                             for r in CEILING_RECORD["trajectory"]["rounds"]])]

    def model_line(config) -> str:  # the app caps the model's budget at the 2 rounds collected
        return "model : " + " ".join(format_readout(readout(model_case, replace(config, max_rounds=2))).split())

    browser.get(voila_url + "/voila/render/stie_tuner.ipynb")
    # the cached question, capped at its 2 rounds: "red blue" (0.85) is below the ceiling 0.9, the valid
    # "red green" takes over, round 2 is the budget: wrong answer, 2 rounds, stopped by max_rounds
    before = "model : EM 0.000 · rounds 2.00 · n 1 | stops: max_rounds 1 | redundant rounds 0, replaced 0, " \
             "with a blocklist 0, all blocked 0"
    wait_for(browser, lambda d: stie_line(d, "model") == before, RENDER_TIMEOUT,
             "the STIE tuner did not render the cached rounds' read-out")
    assert "n 200" in stie_line(browser, "simulation")
    assert stie_line(browser, "simulation") == sim_line(STIEConfig())
    assert "cached rounds from" in text_of(browser, ".kl-header")
    screenshot(browser, tmp_path, "voila-stie-1-rendered")

    # δ1 0.7: "red green" after "red blue" has D = 1 - 1/3 = 2/3 < 0.7: redundant with round 1 (eq. 9), and
    # the memory's "red blue" (0.85 > 0.7) replaces it (eqs. 10-11): the gold answer, still 2 rounds
    config = replace(STIEConfig(), delta1=0.7)
    set_slider(browser, "delta1", "0.7")
    after_delta1 = "model : EM 1.000 · rounds 2.00 · n 1 | stops: max_rounds 1 | redundant rounds 1, replaced 1, " \
                   "with a blocklist 0, all blocked 0"
    assert model_line(config) == after_delta1
    wait_for(browser, lambda d: stie_line(d, "model") == after_delta1, CHANGE_TIMEOUT,
             "delta1 = 0.7 did not re-score the cached rounds")
    wait_for(browser, lambda d: stie_line(d, "simulation") == sim_line(config), CHANGE_TIMEOUT,
             "delta1 = 0.7 did not re-score the simulation")
    assert em_rounds(sim_line(config)) != em_rounds(sim_line(STIEConfig())), "δ1 must move EM or rounds"

    # K 2: "red blue" answered twice (round 2's replacement) is shielded; the simulation's EM/rounds move
    previous, config = sim_line(config), replace(config, repeat_k=2)
    set_slider(browser, "repeat_k", "2")
    wait_for(browser, lambda d: stie_line(d, "simulation") == sim_line(config), CHANGE_TIMEOUT,
             "repeat_k = 2 did not re-score the simulation")
    assert em_rounds(sim_line(config)) != em_rounds(previous), "K must move EM or rounds"
    assert stie_line(browser, "model") == model_line(config)
    screenshot(browser, tmp_path, "voila-stie-2-delta1-K")

    # confidence_ceiling 0.8: round 1's 0.85 reaches it: stop "confident" with the gold answer after 1 round
    config = replace(config, confidence_ceiling=0.8)
    set_slider(browser, "confidence_ceiling", "0.8")
    after = "model : EM 1.000 · rounds 1.00 · n 1 | stops: confident 1 | redundant rounds 0, replaced 0, " \
            "with a blocklist 0, all blocked 0"
    wait_for(browser, lambda d: stie_line(d, "model") == after, CHANGE_TIMEOUT,
             "confidence_ceiling = 0.8 did not re-score the cached rounds")
    # the simulation row follows the same setting
    wait_for(browser, lambda d: stie_line(d, "simulation") == sim_line(config), CHANGE_TIMEOUT,
             "confidence_ceiling = 0.8 did not re-score the simulation")
    screenshot(browser, tmp_path, "voila-stie-3-ceiling")
