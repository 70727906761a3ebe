"""environment.yml and pyproject.toml must name the same packages."""
import re
import tomllib

from kunlunlab.paths import PROJECT_ROOT

CONDA_TO_PIP = {"pytorch": "torch", "faiss-gpu": "faiss-cpu"}


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0].lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(d) for d in project["dependencies"]} | {_name(d) for d in project["optional-dependencies"]["dev"]}
    names, in_pip = set(), False
    for line in (PROJECT_ROOT / "environment.yml").read_text().splitlines():
        stripped = line.split("#", 1)[0].strip()
        if not stripped.startswith("- "):
            continue
        item = stripped[2:].strip()
        if item == "pip:":
            in_pip = True
            continue
        if item in ("pip", "-e .") or item.startswith("python="):
            continue
        names.add(CONDA_TO_PIP.get(_name(item), _name(item)))
    assert names == wanted, f"only in environment.yml: {names - wanted}; only in pyproject: {wanted - names}"
