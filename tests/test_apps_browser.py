"""The Voilà apps (``make app``) in a real browser: start ``voila apps/`` on a free port, open each app in
headless system Chromium through Selenium, wait for the widgets to render, change a control as a user
would (pick from the dropdown, type into a slider's read-out) and read what the page shows.

Needs ``/usr/bin/chromium`` and ``/usr/bin/chromedriver`` (Debian/Ubuntu: ``apt-get install chromium
chromium-driver``); without them, or without selenium / voila, every test here is skipped. Selenium is
pointed at those two binaries and never downloads a browser or a driver.

Expected values are worked out by hand: reward totals from eqs. 17-18 with the components each
hand-written case is built to get (see tests/test_apps.py), STIE read-outs from the case
tests/test_stie_widgets.py works through (its ``confidence_ceiling`` case).
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
    pytest.skip(f"browser tests need system Chromium at {CHROMIUM} and {CHROMEDRIVER} "
                "(apt-get install chromium chromium-driver)", allow_module_level=True)
pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e '.[dev]')")
pytest.importorskip("voila", reason="browser tests need voila (pip install -e .)")

from selenium import webdriver  # noqa: E402
from selenium.webdriver.chrome.options import Options  # noqa: E402
from selenium.webdriver.chrome.service import Service  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.common.keys import Keys  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

APPS = Path(__file__).resolve().parents[1] / "apps"
START_TIMEOUT = 90    # seconds for voila to answer
RENDER_TIMEOUT = 120  # seconds for a kernel to start and the widgets to render (2 slow cores)
CHANGE_TIMEOUT = 30   # seconds for a changed control to reach the read-out

# The cached rounds the STIE tuner app gets through KUNLUNLAB_ROUNDS: one question, two rounds.
CEILING_RECORD = {"golds": ["red blue"], "trajectory": {"rounds": [
    {"answer": "red blue", "confidence": 0.85, "doc_ids": ["a"]},
    {"answer": "red green", "confidence": 0.7, "doc_ids": ["b"]}]}}

pytestmark = pytest.mark.timeout(600)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def voila_url(tmp_path_factory):
    """``voila apps/`` on a free port (``KUNLUNLAB_ROUNDS`` set to a one-question run), stopped afterwards."""
    tmp = tmp_path_factory.mktemp("voila")
    rounds = tmp / "run" / "05_stie_tuning" / "rounds.jsonl"
    rounds.parent.mkdir(parents=True)
    rounds.write_text(json.dumps(CEILING_RECORD) + "\n")
    port = free_port()
    env = {**os.environ, "KUNLUNLAB_ROUNDS": str(tmp / "run"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    log = (tmp / "voila.log").open("w")
    proc = subprocess.Popen([sys.executable, "-m", "voila", str(APPS), "--no-browser", f"--port={port}",
                             "--Voila.ip=127.0.0.1", "--Voila.port_retries=0"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, cwd=APPS.parent)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            if proc.poll() is not None:
                pytest.fail(f"voila exited with {proc.returncode}:\n{(tmp / 'voila.log').read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(url + "/", timeout=5) as response:
                    if response.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"voila did not answer on {url} in {START_TIMEOUT} s:\n"
                            f"{(tmp / 'voila.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        log.close()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """Headless system Chromium (``--no-sandbox``: the tests may run as root, in a container)."""
    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1400,2400", f"--user-data-dir={tmp_path_factory.mktemp('chromium')}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def wait_for(driver, what, timeout, message):
    """Polls ``what(driver)`` until it is truthy; the last page text is in the failure message."""
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.25).until(lambda d: what(d))
    except Exception as err:
        body = driver.find_element(By.TAG_NAME, "body").text[-2000:]
        raise AssertionError(f"{message} (page text: {body!r})") from err


def text_of(driver, css: str) -> str:
    """The rendered text of the first element matching ``css``, whitespace collapsed ("" while absent)."""
    found = driver.find_elements(By.CSS_SELECTOR, css)
    try:
        return " ".join(found[0].text.split()) if found else ""
    except Exception:  # re-rendered between find and read
        return ""


def set_slider(driver, name: str, value: str) -> None:
    """Types ``value`` into the slider's editable read-out and presses Enter, as a user can."""
    readout = driver.find_element(By.CSS_SELECTOR, f".kl-{name} .widget-readout")
    readout.click()
    readout.send_keys(Keys.CONTROL, "a")
    readout.send_keys(value, Keys.ENTER)


def reward_total(driver) -> str:
    return text_of(driver, ".kl-readout table tr:nth-child(2) td:last-child")


def test_reward_explorer_in_the_browser(voila_url, browser):
    browser.get(voila_url + "/voila/render/reward_explorer.ipynb")
    # the first case, "correct", under the default weights: 0.2 * 1 + 0.1 * 1 + 1.0 * 1 = 1.30
    wait_for(browser, lambda d: reward_total(d) == "1.30", RENDER_TIMEOUT, "the reward explorer did not render")
    assert "Reward explorer" in browser.find_element(By.TAG_NAME, "body").text
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


def stie_line(driver, label: str) -> str:
    """The read-out's row for ``label`` (one row per line of the ``<pre>``), whitespace collapsed."""
    found = driver.find_elements(By.CSS_SELECTOR, ".kl-readout pre")
    try:
        lines = found[0].text.splitlines() if found else []
    except Exception:  # re-rendered between find and read
        return ""
    return next((" ".join(line.split()) for line in lines if line.startswith(label)), "")


def test_stie_tuner_in_the_browser(voila_url, browser):
    from dataclasses import replace

    from kunlunlab.agent.stie import STIEConfig
    from kunlunlab.agent.stie_tuning import format_readout, readout
    from kunlunlab.viz.apps import simulation_cases

    browser.get(voila_url + "/voila/render/stie_tuner.ipynb")
    # the cached question, capped at its 2 rounds: "red blue" (0.85) is below the ceiling 0.9, the valid
    # "red green" takes over, round 2 is the budget: wrong answer, 2 rounds, stopped by max_rounds
    before = "model : EM 0.000 · rounds 2.00 · n 1 | stops: max_rounds 1 | redundant rounds 0, replaced 0, " \
             "with a blocklist 0, all blocked 0"
    wait_for(browser, lambda d: stie_line(d, "model") == before, RENDER_TIMEOUT,
             "the STIE tuner did not render the cached rounds' read-out")
    assert "n 200" in stie_line(browser, "simulation")
    assert "cached rounds from" in text_of(browser, ".kl-header")
    # confidence_ceiling 0.8: round 1's 0.85 reaches it: stop "confident" with the gold answer after 1 round
    set_slider(browser, "confidence_ceiling", "0.8")
    after = "model : EM 1.000 · rounds 1.00 · n 1 | stops: confident 1 | redundant rounds 0, replaced 0, " \
            "with a blocklist 0, all blocked 0"
    wait_for(browser, lambda d: stie_line(d, "model") == after, CHANGE_TIMEOUT,
             "confidence_ceiling = 0.8 did not re-score the cached rounds")
    # the simulation row follows the same setting
    sim = readout(simulation_cases(), replace(STIEConfig(), confidence_ceiling=0.8))
    assert stie_line(browser, "simulation") == "simulation: " + " ".join(format_readout(sim).split())
