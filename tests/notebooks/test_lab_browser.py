"""Notebook 03 in JupyterLab (``make lab``) in a real browser, and saving from JupyterLab keeping the
jupytext pair in step.

One ``jupyter lab`` (headless, a token, a free port, ``--allow-root`` as root) serves a temporary folder
holding two copies of ``notebooks/`` (the ``.py``/``.ipynb`` pairs and ``jupytext.toml``): ``browser/``,
whose notebook 03 gets smoke parameters (``run_dir`` in the test's tmp folder, so nothing lands in
``experiments/runs``), and ``save/``, which the save test writes to. The Jupyter configuration is the
one ``make lab`` gets (the virtual environment's ``etc/jupyter``, where jupytext enables its server
extension), with the user's own (``~/.jupyter``) and lab settings kept out.

* :func:`test_reward_explorer_in_jupyterlab`: open ``03_reward_design.ipynb`` in headless system
  Chromium, Run -> Run All Cells from the menu bar, wait for the kernel to go idle with every cell run,
  check the plotly figure (``svg.main-svg``) and the explorer, type a weight into a slider's read-out
  and check the total against a value worked out here. Screenshots are saved in the test's tmp folder
  (paths printed: ``pytest -s``).
* :func:`test_saving_in_jupyterlab_keeps_the_pair_in_step`: save a notebook with one more markdown cell
  through the contents API (what JupyterLab's save does); jupytext's contents manager must write the
  paired ``.py`` too, so :func:`kunlunlab.runner.pairing_problems` finds nothing.

The browser test skips without system Chromium/chromedriver or selenium (see ``tests/browser.py``).
"""
from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from browser import chromium, free_port, require_browser, screenshot, serve, set_slider, text_of, wait_for

pytest.importorskip("jupyterlab", reason="the JupyterLab tests need jupyterlab (pip install -e .)")
pytest.importorskip("jupytext", reason="the JupyterLab tests need jupytext (pip install -e .)")

NOTEBOOKS = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOK = "03_reward_design"
START_TIMEOUT = 90    # seconds for jupyter lab to answer
OPEN_TIMEOUT = 60     # seconds for JupyterLab to load and show the notebook with an idle kernel
RUN_TIMEOUT = 120     # seconds for Run All Cells (kernel start, imports, the figure) on 2 busy cores
CHANGE_TIMEOUT = 30   # seconds for a changed control to reach the read-out

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.timeout(600)]


def copy_notebooks(dest: Path) -> Path:
    """The notebook pairs and ``jupytext.toml`` of ``notebooks/``, copied into ``dest``."""
    dest.mkdir(parents=True)
    for path in [*sorted(NOTEBOOKS.glob("[0-9][0-9]_*.py")), *sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")),
                 NOTEBOOKS / "jupytext.toml"]:
        shutil.copy2(path, dest / path.name)
    return dest


def set_parameters(folder: Path, stem: str, values: dict) -> None:
    """Rewrites ``name = …`` lines of the parameters cell in both files of a pair, the ``.ipynb`` first,
    so the ``.py`` is not older (jupytext takes the inputs from the newer side)."""
    import nbformat

    def edit(source: str) -> str:
        lines = source.splitlines()
        for name, value in values.items():
            at = [i for i, line in enumerate(lines) if line.split("#")[0].split("=")[0].strip() == name]
            assert len(at) == 1, f"{stem}: no single `{name} = …` line in the parameters"
            lines[at[0]] = f"{name} = {value!r}"
        return "\n".join(lines) + ("\n" if source.endswith("\n") else "")

    ipynb, py = folder / f"{stem}.ipynb", folder / f"{stem}.py"
    nb = nbformat.read(ipynb, as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    cell.source = edit(cell.source)
    nbformat.write(nb, ipynb)
    text = py.read_text()
    head, sep, rest = text.partition('# %% tags=["parameters"]\n')
    assert sep, f"{py.name}: no parameters cell"
    body, sep2, tail = rest.partition("\n# %%")
    py.write_text(head + sep + edit(body) + sep2 + tail)
    os.utime(py, (ipynb.stat().st_mtime + 1, ipynb.stat().st_mtime + 1))


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """``jupyter lab`` on a free port with a token over ``root/browser`` and ``root/save`` (two copies of
    ``notebooks/``); yields ``(url, token, root)`` and stops the server afterwards."""
    from kunlunlab.runner import pairing_problems

    tmp = tmp_path_factory.mktemp("lab")
    root = tmp / "root"
    browser_copy = copy_notebooks(root / "browser")
    set_parameters(browser_copy, NOTEBOOK, {"run_dir": str(tmp / "run"), "smoke": True})
    copy_notebooks(root / "save")
    assert pairing_problems(browser_copy) == [] and pairing_problems(root / "save") == []
    # the config folder is the test's own: keep the news prompt out of the screenshots
    labconfig = tmp / "config" / "labconfig"
    labconfig.mkdir(parents=True)
    (labconfig / "page_config.json").write_text(json.dumps(
        {"disabledExtensions": {"@jupyterlab/apputils-extension:announcements": True}}))
    port, token = free_port(), secrets.token_hex(16)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
           # the user's Jupyter config, lab settings and workspaces stay out; the environment's stay in
           "JUPYTER_CONFIG_DIR": str(tmp / "config"), "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"),
           "JUPYTERLAB_SETTINGS_DIR": str(tmp / "settings"), "JUPYTERLAB_WORKSPACES_DIR": str(tmp / "workspaces")}
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.ip=127.0.0.1",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
           "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:  # as `make lab` does: Jupyter refuses to start as root without it
        cmd.append("--allow-root")
    url = f"http://127.0.0.1:{port}"
    with serve(cmd, f"{url}/api/status?token={token}", tmp / "lab.log", env=env, cwd=root, timeout=START_TIMEOUT,
               name="jupyter lab"):
        yield url, token, root


def api(url: str, token: str, path: str, method: str = "GET", body: dict | None = None) -> dict:
    request = urllib.request.Request(f"{url}/api/{path}", method=method,
                                      data=None if body is None else json.dumps(body).encode(),
                                      headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read() or b"{}")


# --- saving keeps the pair in step (no browser) --------------------------------------------------------

def test_saving_in_jupyterlab_keeps_the_pair_in_step(lab):
    from kunlunlab.runner import pairing_problems

    url, token, root = lab
    folder, path = root / "save", f"save/{NOTEBOOK}.ipynb"
    model = api(url, token, f"contents/{path}?type=notebook&content=1")
    nb = model["content"]
    added = "## Added in JupyterLab\n\nA markdown cell saved through the contents API."
    nb["cells"].append({"cell_type": "markdown", "metadata": {}, "source": added, "id": "added-in-lab"})
    saved = api(url, token, f"contents/{path}", "PUT", {"type": "notebook", "format": "json", "content": nb})
    assert saved["path"] == path
    text = (folder / f"{NOTEBOOK}.py").read_text()
    assert "# ## Added in JupyterLab\n#\n# A markdown cell saved through the contents API." in text, \
        f"saving {NOTEBOOK}.ipynb did not update its paired .py (is jupytext's server extension enabled? " \
        "`jupyter server extension list`)"
    assert pairing_problems(folder) == []
    # and the other way round: the server reads the .py's new cell back into the notebook
    again = api(url, token, f"contents/{path}?type=notebook&content=1")["content"]
    assert again["cells"][-1]["source"] == added


# --- notebook 03 in the browser ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    require_browser()  # skips this test (not the save test) without Chromium, chromedriver or selenium
    with chromium(tmp_path_factory.mktemp("chromium"), size="1400,1400") as driver:
        yield driver


PANEL = ".jp-NotebookPanel:not(.lm-mod-hidden)"  # the notebook shown (its tab is the current one)
EXPLORER = f"{PANEL} .kl-reward-explorer"


def kernel_status(driver) -> str:
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, f"{PANEL} .jp-Notebook-ExecutionIndicator")
    try:
        return (found[0].get_attribute("data-status") or "") if found else ""
    except Exception:
        return ""


def prompts(driver) -> list[str]:
    """The input prompts of the notebook's code cells (``[ ]:``, ``[*]:``, ``[3]:``)."""
    return driver.execute_script("return Array.from(document.querySelectorAll(arguments[0]))"
                                 ".map(e => e.textContent.trim())", f"{PANEL} .jp-CodeCell .jp-InputPrompt")


def all_cells_ran(driver) -> bool:
    shown = prompts(driver)
    return bool(shown) and all(p not in ("[ ]:", "[*]:", "") for p in shown) and kernel_status(driver) == "idle"


def explorer_total(driver) -> str:
    """The explorer's total (the read-out table's last column), scrolled into view first (JupyterLab
    skips rendering cells out of view)."""
    from selenium.webdriver.common.by import By

    found = driver.find_elements(By.CSS_SELECTOR, f"{EXPLORER} .kl-readout table tr:nth-child(2) td:last-child")
    if not found:
        return ""
    try:
        driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", found[0])
        return " ".join((found[0].text or found[0].get_attribute("textContent") or "").split())
    except Exception:  # re-rendered between find and read
        return ""


def click_menu(driver, menu: str, label: str) -> None:
    """Opens ``menu`` in JupyterLab's menu bar and clicks its item ``label``, as a user does."""
    from selenium.webdriver.common.by import By

    def find(css: str, text: str):
        return lambda d: next((e for e in d.find_elements(By.CSS_SELECTOR, css) if e.text.strip() == text), None)

    wait_for(driver, find(".lm-MenuBar-item", menu), 10, f"no {menu!r} menu").click()
    wait_for(driver, find(".lm-Menu-content > .lm-Menu-item .lm-Menu-itemLabel", label), 10,
             f"no {label!r} item in the {menu!r} menu").click()


def test_reward_explorer_in_jupyterlab(lab, browser, tmp_path):
    from dataclasses import replace

    from selenium.webdriver.common.by import By

    from kunlunlab.studies.reward_cases import REWARD_CASES, case_rows
    from kunlunlab.training.rewards import RewardConfig

    url, token, _ = lab
    started = time.monotonic()
    browser.get(f"{url}/lab/tree/browser/{NOTEBOOK}.ipynb?token={token}")
    wait_for(browser, lambda d: len(prompts(d)) >= 5 and kernel_status(d) == "idle", OPEN_TIMEOUT,
             "JupyterLab did not open the notebook with an idle kernel")
    assert "Reward design" in text_of(browser, f"{PANEL} .jp-MarkdownCell")
    screenshot(browser, tmp_path, "lab-1-opened")
    opened = time.monotonic()

    click_menu(browser, "Run", "Run All Cells")
    wait_for(browser, all_cells_ran, RUN_TIMEOUT, "Run All Cells did not finish with an idle kernel")
    # an error output (IPython's "…Error  Traceback (most recent call last)") would be a failed cell
    stderr = [e.get_attribute("textContent") or "" for e in browser.find_elements(
        By.CSS_SELECTOR, f"{PANEL} [data-mime-type='application/vnd.jupyter.stderr']")]
    tracebacks = [text for text in stderr if "Traceback" in text]
    assert not tracebacks, f"a cell failed: {tracebacks[0][-1500:]}"
    ran = time.monotonic()

    # the components chart (plotly, rendered by the jupyterlab-plotly extension)
    figure = wait_for(browser, lambda d: d.find_elements(By.CSS_SELECTOR, f"{PANEL} svg.main-svg"), CHANGE_TIMEOUT,
                      "no plotly figure (svg.main-svg) in the notebook")
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", figure[0])
    screenshot(browser, tmp_path, "lab-2-ran-figure")

    # the explorer, on the first case ("correct": format, length and accuracy all 1) at the notebook's
    # default weights: 0.2 * 1 + 0.1 * 1 + 1.0 * 1 = 1.30
    wait_for(browser, lambda d: explorer_total(d) == "1.30", CHANGE_TIMEOUT, "the reward explorer did not render")
    screenshot(browser, tmp_path, "lab-3-explorer")
    assert REWARD_CASES[0]["name"] == "correct"
    # w_accuracy 0.5: 0.2 + 0.1 + 0.5 = 0.80, and what the package scores outside the browser agrees
    expected = f"{0.2 * 1 + 0.1 * 1 + 0.5 * 1:.2f}"
    package = case_rows(REWARD_CASES[:1], replace(RewardConfig(), w_accuracy=0.5))[0]["total"]
    assert expected == "0.80" == f"{package:.2f}"
    set_slider(browser, "w_accuracy", "0.5", scope=EXPLORER)
    wait_for(browser, lambda d: explorer_total(d) == expected, CHANGE_TIMEOUT, "w_accuracy = 0.5 did not re-score")
    # and w_format 1.5 on top: 1.5 + 0.1 + 0.5 = 2.10
    set_slider(browser, "w_format", "1.5", scope=EXPLORER)
    wait_for(browser, lambda d: explorer_total(d) == "2.10", CHANGE_TIMEOUT, "w_format = 1.5 did not re-score")
    screenshot(browser, tmp_path, "lab-4-weights-changed")
    print(f"JupyterLab: opened in {opened - started:.1f} s, Run All Cells {ran - opened:.1f} s, "
          f"explorer checks {time.monotonic() - ran:.1f} s")
