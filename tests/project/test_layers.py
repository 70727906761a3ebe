"""Import layers: `kunlunlab.data` is the bottom layer and imports nothing from the layers above it."""
import ast
from pathlib import Path

import kunlunlab

ABOVE_DATA = ("kunlunlab.retrieval", "kunlunlab.agent", "kunlunlab.training", "kunlunlab.eval", "kunlunlab.viz",
              "kunlunlab.cli", "kunlunlab.studies", "kunlunlab.bench", "kunlunlab.runner")


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):  # module level and inside functions alike
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
        elif isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
    return names


def test_data_imports_nothing_from_higher_layers():
    data = Path(kunlunlab.__file__).parent / "data"
    offending = {f"{p.name}: {m}" for p in data.glob("*.py") for m in imported_modules(p) if m.startswith(ABOVE_DATA)}
    assert not offending, sorted(offending)


# The layers of the package, bottom up: a module imports only from its own layer or the ones below
# (training and eval share a layer; training may evaluate, eval never trains).
LAYERS = {"kunlunlab.paths": 0, "kunlunlab.models": 0, "kunlunlab.configs": 0, "kunlunlab.data": 1, "kunlunlab.retrieval": 2,
          "kunlunlab.agent": 3, "kunlunlab.eval": 4, "kunlunlab.training": 4, "kunlunlab.studies": 5,
          "kunlunlab.viz": 6, "kunlunlab.bench": 7, "kunlunlab.runner": 7, "kunlunlab.cli": 8,
          "kunlunlab.cli_parsers": 8}


def layer_of(module: str) -> tuple[str, int] | None:
    for prefix, rank in sorted(LAYERS.items(), key=lambda kv: -len(kv[0])):
        if module == prefix or module.startswith(prefix + "."):
            return prefix, rank
    return None


def _modules() -> list[tuple[str, Path]]:
    root = Path(kunlunlab.__file__).parent
    return [("kunlunlab." + ".".join(p.relative_to(root).with_suffix("").parts).replace(".__init__", ""), p)
            for p in root.rglob("*.py") if p != root / "__init__.py"]


def test_every_module_has_a_layer():
    unplaced = sorted(module for module, _ in _modules() if layer_of(module) is None)
    assert not unplaced, f"add these to LAYERS (and docs/contributing.md): {unplaced}"


def test_no_module_imports_from_a_higher_layer():
    root = Path(kunlunlab.__file__).parent
    offending = []
    for path in root.rglob("*.py"):
        module = "kunlunlab." + ".".join(path.relative_to(root).with_suffix("").parts).replace(".__init__", "")
        own = layer_of(module)
        if own is None:
            continue
        for name in imported_modules(path):
            other = layer_of(name)
            if other and other[1] > own[1]:
                offending.append(f"{module} imports {name}")
            if own[0] == "kunlunlab.eval" and other and other[0] == "kunlunlab.training":
                offending.append(f"{module} imports {name} (eval must not depend on training)")
    assert not offending, sorted(offending)


def test_notebooks_and_apps_do_not_import_the_cli():
    sources = [*Path(kunlunlab.__file__).parent.parent.glob("notebooks/*.py"),
               *Path(kunlunlab.__file__).parent.parent.glob("apps/*.py")]
    assert sources
    offending = [f"{p.name}: {m}" for p in sources for m in imported_modules(p) if m.startswith("kunlunlab.cli")]
    assert not offending, offending


def test_the_agent_training_and_evaluation_import_no_web_framework():
    """They reach the retrieval service as clients (kunlunlab.retrieval.client): a GPU image without FastAPI, or with
    a FastAPI whose own imports fail there, runs them all (issue 42: fastapi imported opentelemetry, absent on the
    image, and the GPU check's rollout parts died with ModuleNotFoundError)."""
    import subprocess
    import sys

    code = ("import sys\nimport kunlunlab.training.pipeline, kunlunlab.eval.harness, kunlunlab.studies.suite, "
            "kunlunlab.agent.methods, kunlunlab.retrieval\n"
            "print(sorted(m for m in ('fastapi', 'starlette', 'pydantic', 'uvicorn') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"
