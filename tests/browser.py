"""Shared helpers of the browser tests (``tests/notebooks/test_apps_browser.py``: the Voilà apps,
``tests/notebooks/test_lab_browser.py``: notebook 03 in JupyterLab): finding system Chromium, skipping when it or
selenium is missing, starting a Jupyter server on a free port and stopping it, driving headless Chromium.

Selenium is pointed at the system binaries (``/usr/bin/chromium``, ``/usr/bin/chromedriver``, else
``chromium`` / ``chromedriver`` on PATH; ``$KUNLUNLAB_CHROMIUM`` / ``$KUNLUNLAB_CHROMEDRIVER`` override
both; Debian/Ubuntu: ``apt-get install chromium chromium-driver``, which ``.ci/run`` does as root) and
never downloads a browser or a driver. Selenium is imported inside the functions, so this module imports
without it and :func:`require_browser` can skip with a reason.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from kunlunlab.http.client import free_port  # the browser tests' servers take a port from here too


def _binary(variable: str, default: str, *names: str) -> Path:
    """``$variable`` when set; else ``default`` when it is a file, else the first of ``names`` on PATH
    (``default`` if none is)."""
    if os.environ.get(variable):
        return Path(os.environ[variable])
    if Path(default).is_file():
        return Path(default)
    found = next((shutil.which(n) for n in names if shutil.which(n)), None)
    return Path(found) if found else Path(default)


CHROMIUM = _binary("KUNLUNLAB_CHROMIUM", "/usr/bin/chromium", "chromium", "chromium-browser")
CHROMEDRIVER = _binary("KUNLUNLAB_CHROMEDRIVER", "/usr/bin/chromedriver", "chromedriver")
INSTALL_HINT = "apt-get install chromium chromium-driver; .ci/run does it when run as root"


def require_browser(*modules: str) -> None:
    """Skips the calling test module (call it at module level, before importing selenium) when system
    Chromium, its driver, selenium or one of ``modules`` (e.g. ``"voila"``) is missing."""
    if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
        pytest.skip(f"browser tests need system Chromium and chromedriver ({CHROMIUM}, {CHROMEDRIVER}: "
                    f"{INSTALL_HINT})", allow_module_level=True)
    pytest.importorskip("selenium", reason="browser tests need selenium (pip install -e '.[dev]')")
    for module in modules:
        pytest.importorskip(module, reason=f"browser tests need {module} (pip install -e .)")


def log_tail(log: Path, n: int = 3000) -> str:
    return log.read_text(errors="replace")[-n:] if log.is_file() else "(no log)"


@contextlib.contextmanager
def serve(cmd: list[str], ready_url: str, log: Path, *, env: dict, cwd: Path, timeout: float, name: str):
    """Runs ``cmd`` (a server) with its output in ``log`` until ``ready_url`` answers 200; yields the
    process and stops it afterwards (terminate, then kill). Fails with the log's tail if the server exits
    or does not answer within ``timeout`` seconds."""
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if proc.poll() is not None:
                    pytest.fail(f"{name} exited with {proc.returncode}:\n{log_tail(log)}")
                try:
                    with urllib.request.urlopen(ready_url, timeout=5) as response:
                        if response.status == 200:
                            break
                except OSError:
                    pass
                if time.monotonic() > deadline:
                    pytest.fail(f"{name} did not answer on {ready_url} in {timeout} s:\n{log_tail(log)}")
                time.sleep(0.5)
            yield proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=15)


@contextlib.contextmanager
def chromium(profile: Path, size: str = "1400,2400"):
    """Headless system Chromium (``--no-sandbox``: the tests may run as root, in a container) with its
    profile in ``profile``. A browser that cannot start (a broken install) skips the test with the error."""
    from selenium import webdriver
    from selenium.common.exceptions import WebDriverException
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={size}", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    try:
        driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    except WebDriverException as err:
        pytest.skip(f"system Chromium ({CHROMIUM}, {CHROMEDRIVER}) did not start: {err.msg or err}")
    try:
        yield driver
    finally:
        driver.quit()


def page_text(driver, n: int = 2000) -> str:
    from selenium.webdriver.common.by import By

    try:
        return driver.find_element(By.TAG_NAME, "body").text[-n:]
    except Exception:
        return "(page text unavailable)"


def wait_for(driver, what, timeout, message):
    """Polls ``what(driver)`` until it is truthy; the last page text is in the failure message."""
    from selenium.webdriver.support.ui import WebDriverWait

    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.25).until(lambda d: what(d))
    except Exception as err:
        raise AssertionError(f"{message} (page text: {page_text(driver)!r})") from err


def text_of(driver, css: str) -> str:
    """The rendered text of the first element matching ``css``, whitespace collapsed ("" while absent)."""
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, css)
    try:
        return " ".join(found[0].text.split()) if found else ""
    except Exception:  # re-rendered between find and read
        return ""


def set_slider(driver, name: str, value: str, scope: str = "") -> None:
    """Types ``value`` into the ``kl-<name>`` slider's editable read-out and presses Enter, as a user can
    (``scope``: a CSS selector the slider lies in)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    readout = driver.find_element(By.CSS_SELECTOR, f"{scope} .kl-{name} .widget-readout".strip())
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", readout)
    readout.click()
    readout.send_keys(Keys.CONTROL, "a")
    readout.send_keys(value, Keys.ENTER)


def screenshot(driver, folder: Path, name: str) -> Path:
    """Saves the page as ``folder/<name>.png`` and prints the path (shown with ``pytest -s`` or on failure)."""
    path = Path(folder) / f"{name}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path
