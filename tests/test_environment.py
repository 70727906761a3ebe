"""environment.yml and pyproject.toml must name the same packages."""
import re
import tomllib

import yaml

from kunlunlab.paths import PROJECT_ROOT

CONDA_TO_PIP = {"pytorch": "torch", "faiss-gpu": "faiss-cpu"}


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0].lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    wanted = {_name(d) for d in project["dependencies"]} | {_name(d) for d in project["optional-dependencies"]["dev"]}
    env = yaml.safe_load((PROJECT_ROOT / "environment.yml").read_text())
    names = set()
    for item in env["dependencies"]:
        specs = item["pip"] if isinstance(item, dict) else [item]
        for spec in specs:
            name = _name(spec)
            if name in ("python", "pip", "-e"):
                continue
            names.add(CONDA_TO_PIP.get(name, name))
    assert names == wanted, f"only in environment.yml: {names - wanted}; only in pyproject: {wanted - names}"
