"""BENCHMARKS.md is a short reference of today's figures, and what points into it holds: every
reference to it from the code names a section it has, every link from it into the log
(docs/benchmarks-log/) lands on a heading there, and the page stays short enough to read."""

import re
from pathlib import Path

import pytest

from conftest import ROOT

PAGE = ROOT / "BENCHMARKS.md"
LOG = ROOT / "docs" / "benchmarks-log"
MAX_LINES = 400
CODE_PLACES = ("src", "tests", "bench", "rules", "scripts", "workflow", "profiles")
CODE_SUFFIXES = {".py", ".sh", ".smk", ".yaml", ".yml"}
# a reference: BENCHMARKS.md, then (across a line break, a comment's '#', a comma or a colon)
# a section's title in double quotes
REFERENCE = re.compile(r'BENCHMARKS\.md(?:[\s#,:]|section)*"(?P<title>[^"\n]+)"')


def headings(text: str) -> list[str]:
    return [line.lstrip("#").strip() for line in text.splitlines() if re.match(r"#{2,3} ", line)]


def slug(title: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def references(text: str) -> list[tuple[int, str | None]]:
    """(line, the section named or None) of every mention of BENCHMARKS.md in ``text``."""
    named = {m.start(): m.group("title") for m in REFERENCE.finditer(text)}
    return [
        (text.count("\n", 0, m.start()) + 1, named.get(m.start()))
        for m in re.finditer(r"BENCHMARKS\.md", text)
    ]


def code_files() -> list[Path]:
    files = [ROOT / "Snakefile", ROOT / "Makefile"]
    for place in CODE_PLACES:
        files += [
            f
            for f in (ROOT / place).rglob("*")
            if f.suffix in CODE_SUFFIXES and "__pycache__" not in f.parts
        ]
    return [f for f in files if f.is_file() and f != Path(__file__)]


def test_the_page_is_a_short_reference():
    text = PAGE.read_text()
    assert len(text.splitlines()) <= MAX_LINES, f"BENCHMARKS.md is over {MAX_LINES} lines"
    assert list(LOG.glob("*.md")), "the chronological log is in docs/benchmarks-log/"


def test_every_reference_from_the_code_names_a_section_of_the_page():
    sections = set(headings(PAGE.read_text()))
    wrong = []
    for f in code_files():
        for line, title in references(f.read_text(errors="replace")):
            if title is None:
                wrong.append(f"{f.relative_to(ROOT)}:{line}: names no section")
            elif title not in sections:
                wrong.append(f"{f.relative_to(ROOT)}:{line}: no section {title!r}")
    assert not wrong, "BENCHMARKS.md references to fix:\n" + "\n".join(wrong)


def test_every_section_a_document_names_is_on_the_page():
    sections = set(headings(PAGE.read_text()))
    wrong = [
        f"{f.relative_to(ROOT)}:{line}: no section {title!r}"
        for f in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
        for line, title in references(f.read_text())
        if title is not None and title not in sections
    ]
    assert not wrong, "\n".join(wrong)


def test_every_link_into_the_log_lands_on_a_heading():
    anchors = {f.name: {slug(h) for h in headings(f.read_text())} for f in LOG.glob("*.md")}
    links = re.findall(r"\(docs/benchmarks-log/([\w.-]+\.md)(?:#([\w-]+))?\)", PAGE.read_text())
    assert links
    broken = [
        f"{page}#{anchor}"
        for page, anchor in links
        if page not in anchors or (anchor and anchor not in anchors[page])
    ]
    assert not broken, "links into the log that land nowhere: " + ", ".join(broken)


@pytest.mark.parametrize(
    "text, expected",
    [
        ('see BENCHMARKS.md "Probe precision".', [(1, "Probe precision")]),
        ('(BENCHMARKS.md\n    "Memory")', [(1, "Memory")]),
        ('# BENCHMARKS.md\n# "On a GPU"', [(1, "On a GPU")]),
        ("figures in BENCHMARKS.md.", [(1, None)]),
    ],
)
def test_a_reference_and_the_section_it_names_are_read(text, expected):
    assert references(text) == expected
