"""Import layers: `kunlunlab.data` is the bottom layer and imports nothing from the layers above it."""
import ast
from pathlib import Path

import kunlunlab

ABOVE_DATA = ("kunlunlab.http", "kunlunlab.retrieval", "kunlunlab.agent", "kunlunlab.training", "kunlunlab.eval", "kunlunlab.viz",
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
# (training and eval share a layer; training may evaluate, eval never trains). kunlunlab.http, the HTTP plumbing
# every client and both servers share, sits below the retrieval and the agent that use it.
LAYERS = {"kunlunlab.paths": 0, "kunlunlab.models": 0, "kunlunlab.configs": 0, "kunlunlab.data": 1, "kunlunlab.http": 2,
          "kunlunlab.retrieval": 3, "kunlunlab.agent": 4, "kunlunlab.eval": 5, "kunlunlab.training": 5,
          "kunlunlab.studies": 6, "kunlunlab.viz": 7, "kunlunlab.bench": 8, "kunlunlab.runner": 8, "kunlunlab.cli": 9,
          "kunlunlab.cli_parsers": 9}


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
            "kunlunlab.agent.methods, kunlunlab.retrieval, kunlunlab.http.client, kunlunlab.agent.openai_backend, "
            "kunlunlab.eval.judge, kunlunlab.training.path_judge\n"
            "print(sorted(m for m in ('fastapi', 'starlette', 'pydantic', 'uvicorn') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[]"


def _sources() -> list[Path]:
    root = Path(kunlunlab.__file__).parent.parent
    return [p for folder in ("kunlunlab", "tests", "apps", "notebooks", "experiments") for p in (root / folder).rglob("*.py")]


# names another module may define as a thin call into kunlunlab.http (the retrieval client's bearer_headers reads
# the retrieval service's key variable by default, for the load test)
DELEGATES = {"bearer_headers"}


def test_http_plumbing_lives_in_kunlunlab_http_alone():
    """The server shell and the client helper are kunlunlab.http's (issue 55: serve-llm imported its shell from the
    retrieval service, and each client carried its own retry loop): nothing imports them from the retrieval
    service, the LLM server imports nothing of the retrieval, and no other module defines them again."""
    import kunlunlab.http.client
    import kunlunlab.http.server

    plumbing = set(kunlunlab.http.server.__all__) | set(kunlunlab.http.client.__all__)
    assert {"RequestGuard", "make_server", "client_gone", "service_app", "ServiceClient", "RetryPolicy"} <= plumbing
    via_service, redefined = [], []
    for path in _sources():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "kunlunlab.retrieval.service":
                via_service += [f"{path.name}: {a.name}" for a in node.names if a.name in plumbing]
            if (isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name in plumbing - DELEGATES
                    and "http" not in path.relative_to(Path(kunlunlab.__file__).parent.parent).parts[1:2]):
                redefined.append(f"{path.name}: {node.name}")
    assert not via_service, via_service
    assert not redefined, redefined
    server = Path(kunlunlab.__file__).parent / "agent" / "server.py"
    assert not [m for m in imported_modules(server) if m.startswith("kunlunlab.retrieval")]
