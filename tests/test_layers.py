"""Import layers: `kunlunlab.data` is the bottom layer and imports nothing from the layers above it."""
import ast
from pathlib import Path

import kunlunlab

ABOVE_DATA = ("kunlunlab.retrieval", "kunlunlab.agent", "kunlunlab.training", "kunlunlab.eval", "kunlunlab.viz",
              "kunlunlab.cli", "kunlunlab.suite", "kunlunlab.runner")


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
