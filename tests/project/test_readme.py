"""The README is a front door that stays honest: short, the two commands first, a package layout equal to the
tree, and no relative link in it or in docs/ that points nowhere. Everything is read from the files at run time."""
import re
from pathlib import Path
from urllib.parse import unquote

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


def relative_links(path: Path) -> list[tuple[int, str]]:
    """(line number, target) of every link that names a file relative to ``path``."""
    links = []
    for number, line in prose_lines(path.read_text(encoding="utf-8")):
        line = re.sub(r"`[^`]*`", "", line)  # inline code is not a link either
        for bracketed, bare in LINK.findall(line):
            target = bracketed or bare
            if re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith(("#", "//")):
                continue  # http(s):, mailto: and the like; a same-page anchor
            links.append((number, target))
    return links


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


def test_relative_links_point_to_existing_files():
    pages = [README, *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages:
        for number, target in relative_links(page):
            file_part = unquote(target.split("#", 1)[0].split("?", 1)[0])
            if not file_part:
                continue
            resolved = (page.parent / file_part).resolve()
            if not resolved.exists():
                broken.append(f"{page.relative_to(ROOT)}:{number}: {target}")
    assert not broken, "relative links to files that do not exist:\n" + "\n".join(broken)


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
