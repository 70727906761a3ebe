"""The README is a front door that stays honest: short, the two commands first, a package layout equal to the
tree, every command listed, and no relative link in it, in docs/ or in a notebook's markdown that points nowhere:
neither to a missing file nor to a missing section (``#anchor``). Everything is read from the files at run time."""
import argparse
import json
import re
from pathlib import Path
from urllib.parse import unquote

from kunlunlab.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
PACKAGE = ROOT / "kunlunlab"
MAX_LINES = 250
COMMANDS_WITHIN = 30
LAYOUT_HEADING = "## Package layout"
# one module per line: "- `kunlunlab/path/module.py`: what it does" (any list marker, the path in backticks)
LAYOUT_LINE = re.compile(r"^\s*[-*]\s+`(kunlunlab/[^`]+\.py)`")
# [text](target) and ![alt](target): the target in <angle brackets>, or up to whitespace or ")"; a "title" may follow
LINK = re.compile(r"!?\[[^\]]*\]\(\s*(?:<([^>]+)>|([^)\s]+))(?:\s+\"[^\"]*\")?\s*\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")
# the README's list of commands: "`kunlunlab build-index | serve-retriever | ... | run-notebooks`"
COMMAND_LIST = re.compile(r"`kunlunlab ([a-z-]+(?:\s*\|\s*[a-z-]+)+)`")


def readme_lines() -> list[str]:
    return README.read_text(encoding="utf-8").splitlines()


def module_files() -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in PACKAGE.rglob("*.py")
            if p.name != "__init__.py" and "__pycache__" not in p.parts}


def layout_section(lines: list[str]) -> list[str]:
    starts = [i for i, line in enumerate(lines) if line.strip() == LAYOUT_HEADING]
    assert len(starts) == 1, f"README.md needs exactly one '{LAYOUT_HEADING}' heading, found {len(starts)}"
    section = []
    for line in lines[starts[0] + 1:]:
        if re.match(r"^#{1,2}\s", line):  # the next section of the same or a higher level ends it
            break
        section.append(line)
    return section


def listed_modules(section: list[str]) -> list[str]:
    return [m.group(1) for line in section if (m := LAYOUT_LINE.match(line))]


def prose_lines(text: str) -> list[tuple[int, str]]:
    """(line number, line) outside fenced code blocks (a code block's brackets are code, not links)."""
    out, fenced = [], False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append((number, line))
    return out


def markdown_links(text: str, same_page: bool = False) -> list[tuple[int, str]]:
    """(line number, target) of every link in markdown ``text`` that names a file (relative to the page) or, with
    ``same_page``, a section of the page itself (``#anchor``); URLs (http:, mailto:) are left out."""
    links = []
    for number, line in prose_lines(text):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link either
        for bracketed, bare in LINK.findall(line):
            target = bracketed or bare
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("//"):
                continue  # http(s):, mailto: and the like
            if target.startswith("#") and not same_page:
                continue
            links.append((number, target))
    return links


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link that names a file relative to ``path``."""
    return markdown_links(path.read_text(encoding="utf-8"))


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text (a link's text, no backticks) lower-cased, punctuation dropped,
    spaces as hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(text: str) -> set[str]:
    """The anchors a markdown page defines: one per heading (a repeated one gets -1, -2, ... as on GitHub) and
    every ``<a name=...>`` / ``<a id=...>``."""
    found, seen = set(), {}
    for _, line in prose_lines(text):
        if (m := HEADING.match(line)):
            base = slug(m.group(1))
            found.add(base if base not in seen else f"{base}-{seen[base]}")
            seen[base] = seen.get(base, 0) + 1
        found.update(HTML_ANCHOR.findall(line))
    return found


def notebook_markdown(path: Path) -> str:
    """The markdown cells of a notebook, one after the other: a jupytext py:percent source's ``# %% [markdown]``
    cells (each line's leading "# " removed) or an ``.ipynb``'s markdown cells. Line numbers are the cells' own."""
    if path.suffix == ".ipynb":
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        return "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    cells, current = [], None
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# %%"):
            current = [] if "[markdown]" in line else None
            if current is not None:
                cells.append(current)
        elif current is not None:
            current.append(re.sub(r"^# ?", "", line))
    return "\n".join("\n".join(cell) for cell in cells)


def broken_links(page: Path, text: str, root: Path = ROOT) -> list[str]:
    """``page``'s links (in ``text``) to a file that does not exist, or to a section its markdown target lacks."""
    broken = []
    for number, target in markdown_links(text, same_page=True):
        file_part, _, anchor = unquote(target).partition("#")
        file_part = file_part.split("?", 1)[0]
        resolved = (page.parent / file_part).resolve() if file_part else page
        where = f"{page.relative_to(root)}:{number}: {target}"
        if not resolved.exists():
            broken.append(f"{where} (no such file)")
        elif anchor and resolved.suffix == ".md":
            target_text = text if resolved == page else resolved.read_text(encoding="utf-8")
            if anchor not in anchors(target_text):
                broken.append(f"{where} (no section #{anchor} in {resolved.relative_to(root)})")
    return broken


def test_readme_is_short_and_starts_with_the_two_commands():
    lines = readme_lines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; the front door keeps to {MAX_LINES}"
    head = "\n".join(lines[:COMMANDS_WITHIN])
    missing = [c for c in ("make run", "make test") if c not in head]
    assert not missing, f"{missing} not in the first {COMMANDS_WITHIN} lines of README.md"


def test_package_layout_lists_exactly_the_module_files():
    listed = listed_modules(layout_section(readme_lines()))
    assert listed, f"no module lines (- `kunlunlab/....py`: ...) under '{LAYOUT_HEADING}' in README.md"
    repeated = sorted({m for m in listed if listed.count(m) > 1})
    existing = module_files()
    missing = sorted(existing - set(listed))
    stale = sorted(set(listed) - existing)
    assert not (missing or stale or repeated), (
        f"README.md '{LAYOUT_HEADING}' disagrees with kunlunlab/: missing (in the tree, not listed) {missing}; "
        f"stale (listed, not in the tree) {stale}; listed twice {repeated}")


def test_relative_links_point_to_existing_files_and_sections():
    broken = []
    for page in [README, *sorted((ROOT / "docs").glob("*.md"))]:
        broken += broken_links(page, page.read_text(encoding="utf-8"))
    assert not broken, "links to files or sections that do not exist:\n" + "\n".join(broken)


def test_notebook_markdown_links_point_to_existing_files_and_sections():
    notebooks = sorted((ROOT / "notebooks").glob("[0-9]*.py")) + sorted((ROOT / "notebooks").glob("[0-9]*.ipynb"))
    assert notebooks
    broken = []
    for notebook in notebooks:
        broken += broken_links(notebook, notebook_markdown(notebook))
    assert not broken, "notebook links to files or sections that do not exist:\n" + "\n".join(broken)


def test_the_readme_lists_every_command():
    subcommands = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)).choices
    text = " ".join(readme_lines())
    listed = [name.strip() for m in COMMAND_LIST.finditer(text) for name in m.group(1).split("|")]
    assert listed, "no command list (`kunlunlab build-index | serve-retriever | ...`) in README.md"
    assert sorted(set(listed)) == sorted(subcommands), (f"README.md lists {sorted(set(listed))}, "
                                                        f"the CLI has {sorted(subcommands)}")


def test_the_layout_parser_reads_one_module_per_line():
    section = ["", "One line per module.", "", "- `kunlunlab/a.py`: one", "* `kunlunlab/sub/b.py` two",
               "- kunlunlab/c.py: no backticks, not a module line", "", "### a subsection stays inside",
               "- `kunlunlab/d.py`: three"]
    lines = ["# title", LAYOUT_HEADING, *section, "## Next", "- `kunlunlab/e.py`: after the section"]
    assert listed_modules(layout_section(lines)) == ["kunlunlab/a.py", "kunlunlab/sub/b.py", "kunlunlab/d.py"]


def test_the_link_finder_skips_urls_anchors_and_code(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("[a](docs/x.md#part) ![fig](img.png \"title\") [web](https://example.org) [here](#top)\n"
                    "`[not](a-link.md)`\n```\n[in](code.md)\n```\n[b](<with space.md>)\n", encoding="utf-8")
    assert relative_links(page) == [(1, "docs/x.md#part"), (1, "img.png"), (6, "with space.md")]


def test_anchors_follow_githubs_headings_and_a_missing_one_is_reported(tmp_path):
    assert slug("How long `make run` takes") == "how-long-make-run-takes"
    assert slug("1M vectors against FAISS's strongest configurations") == \
        "1m-vectors-against-faisss-strongest-configurations"
    assert slug("G192: the fair pair — with [background](x.md) reading") == "g192-the-fair-pair--with-background-reading"
    text = "# Title\n## Part\n## Part\n```\n# not a heading\n```\n<a name=\"kept\"></a>\n"
    assert anchors(text) == {"title", "part", "part-1", "kept"}
    (tmp_path / "other.md").write_text("## There\n", encoding="utf-8")
    page = tmp_path / "page.md"
    text = "[ok](other.md#there) [gone](other.md#nowhere) [self](#here) [missing](#absent) [no](none.md)\n## Here\n"
    page.write_text(text, encoding="utf-8")
    assert broken_links(page, text, root=tmp_path) == ["page.md:1: other.md#nowhere (no section #nowhere in other.md)",
                                                       "page.md:1: #absent (no section #absent in page.md)",
                                                       "page.md:1: none.md (no such file)"]


def test_a_notebooks_markdown_cells_are_read_from_both_forms(tmp_path):
    source = tmp_path / "01_x.py"
    source.write_text("# %% [markdown]\n# See [the docs](../docs/a.md#b).\n\n# %%\nx = '[code](c.md)'\n"
                      "# %% [markdown]\n# and [more](d.md)\n", encoding="utf-8")
    assert markdown_links(notebook_markdown(source)) == [(1, "../docs/a.md#b"), (3, "d.md")]
    executed = tmp_path / "01_x.ipynb"
    executed.write_text(json.dumps({"cells": [{"cell_type": "markdown", "source": ["See [the docs](e.md)"]},
                                              {"cell_type": "code", "source": ["'[code](c.md)'"]}]}), encoding="utf-8")
    assert markdown_links(notebook_markdown(executed)) == [(1, "e.md")]
