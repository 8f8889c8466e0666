"""Every relative link of the documentation resolves: README.md, docs/*.md, testbed/README.md
and bench/performance-notes.md. A link names an existing file (or folder); a `#fragment` names
a heading of that file, by GitHub's anchors (lower case, punctuation dropped, spaces to
hyphens, `-1`, `-2` for repeated headings). Links inside fenced code blocks and code spans
are not links; web addresses (`http:`, `https:`, `mailto:`) are not checked."""

from __future__ import annotations

import re
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = sorted([ROOT / "README.md", ROOT / "testbed" / "README.md",
                ROOT / "bench" / "performance-notes.md", *(ROOT / "docs").glob("*.md")])
LINK = re.compile(r"!?\[(?:[^\]\\]|\\.)*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^ {0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^ {0,3}(```|~~~)")


def prose_lines(text: str) -> list[str]:
    """TEXT's lines outside fenced code blocks, code spans blanked."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "``", line))
    return out


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link keeps its text
    text = re.sub(r"[`*]", "", text).strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def links(path: Path) -> list[str]:
    return [m.group(1) for line in prose_lines(path.read_text()) for m in LINK.finditer(line)]


def shown(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def broken(path: Path) -> list[str]:
    out = []
    for target in links(path):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue  # a web address
        file_part, _, fragment = target.partition("#")
        dest = (path.parent / unquote(file_part)).resolve() if file_part else path
        if not dest.exists():
            out.append(f"{target}: no file {shown(dest)}")
        elif fragment and dest.is_file() and unquote(fragment) not in anchors(dest):
            out.append(f"{target}: no heading #{fragment} in {shown(dest)}")
    return out


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page):
    assert page.is_file()
    assert broken(page) == [], f"{page.relative_to(ROOT)}: broken links"


def test_the_checker_sees_links_and_anchors(tmp_path):
    (tmp_path / "a.md").write_text(
        "# Title\n\n## What a deploy does (deploy.py)\n\n## Reading a log: `explain-log`\n\n"
        "## Title\n\n```\n# not a heading\n[x](nowhere.md)\n```\n\n"
        "[ok](a.md#what-a-deploy-does-deploypy) [ok](#reading-a-log-explain-log) [ok](#title-1)\n"
        "[bad](b.md) [bad](a.md#not-a-heading) `[code](nowhere.md)` [web](https://example.com/x)\n")
    assert sorted(anchors(tmp_path / "a.md")) == [
        "reading-a-log-explain-log", "title", "title-1", "what-a-deploy-does-deploypy"]
    assert broken(tmp_path / "a.md") == [
        "b.md: no file " + str((tmp_path / "b.md").resolve()),
        "a.md#not-a-heading: no heading #not-a-heading in " + str((tmp_path / "a.md").resolve()),
    ]


def test_the_readme_is_a_front_page():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 200
    text = "\n".join(lines)
    assert "    bash scripts/demo.sh" in text and "    bash scripts/test.sh" in text


#: a section named in prose: `README's "Heading"`, `(README, "Heading")`
PROSE_SECTION = re.compile(r"README(?:'s|,) \"([^\"]+)\"")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_readme_section_named_in_prose_is_one_of_its_headings(page):
    headings = {HEADING.match(line).group(2).lower()
                for line in (ROOT / "README.md").read_text().splitlines() if HEADING.match(line)}
    named = [m.group(1) for line in prose_lines(page.read_text())
             for m in PROSE_SECTION.finditer(line)]
    missing = [n for n in named if not any(h.startswith(n.lower()) for h in headings)]
    assert not missing, f"{page.name} names README sections that are not there: {missing}"
