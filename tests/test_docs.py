"""The docs have a way in and no dead ends: docs/index.md links every page, every root cause of
``neuraldbg.vocab.ROOTS`` has its page with a section per state, and every relative link of the
README and the docs points at a file that exists (and, into a markdown page, at a heading it has)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from neuraldbg.vocab import ROOTS

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CAUSES = DOCS / "causes"

#: ``[text](target)`` and ``![alt](target)``; the target ends at the first space or ``)``
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.S | re.M)
CODE_SPAN = re.compile(r"`[^`\n]*`")


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted(DOCS.glob("*.md")), *sorted(CAUSES.glob("*.md"))]


def prose(path: Path) -> str:
    """The page without its code: fenced blocks and inline code spans hold no links."""
    return CODE_SPAN.sub("", FENCE.sub("", path.read_text(encoding="utf-8")))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    headings = re.findall(r"^#{1,6}\s+(.*?)\s*#*\s*$", FENCE.sub("", path.read_text(encoding="utf-8")), flags=re.M)
    return {slug(h) for h in headings}


def relative_links(path: Path) -> list[str]:
    return [t for t in LINK.findall(prose(path)) if not re.match(r"^[a-z][a-z0-9+.-]*:", t, flags=re.I)]


def headings(path: Path, level: int = 2) -> list[str]:
    marks = "#" * level
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    return [h.strip().strip("`") for h in re.findall(rf"^{marks}\s+(.*?)\s*$", text, flags=re.M)]


@pytest.mark.parametrize("cause", sorted(ROOTS))
def test_every_root_cause_has_its_page_with_a_section_per_state(cause):
    page = CAUSES / f"{cause}.md"
    assert page.is_file(), f"docs/causes/{cause}.md is missing"
    assert f"`{cause}`" in page.read_text(encoding="utf-8").splitlines()[0], "the title names the variable"
    sections = headings(page)
    missing = [s for s in ROOTS[cause] if s not in sections]
    assert not missing, f"docs/causes/{cause}.md has no section for {missing} (its sections: {sections})"


def test_the_cause_pages_are_the_root_causes_and_nothing_else():
    assert sorted(p.stem for p in CAUSES.glob("*.md")) == sorted(ROOTS)


def test_the_index_links_every_page():
    linked = {(DOCS / t.split("#", 1)[0]).resolve() for t in relative_links(DOCS / "index.md") if t.split("#", 1)[0]}
    wanted = {p.resolve() for p in [*DOCS.glob("*.md"), *CAUSES.glob("*.md")] if p.name != "index.md"}
    missing = sorted(str(p.relative_to(ROOT)) for p in wanted - linked)
    assert not missing, f"docs/index.md does not link: {missing}"


def test_the_index_starts_with_getting_started():
    first = relative_links(DOCS / "index.md")[0]
    assert first == "getting-started.md"


def test_the_readme_links_the_docs_index_and_getting_started():
    targets = {t.split("#", 1)[0] for t in relative_links(ROOT / "README.md")}
    assert {"docs/index.md", "docs/getting-started.md"} <= targets


@pytest.mark.parametrize("page", pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_at_a_file_that_exists(page):
    broken = []
    for target in relative_links(page):
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.is_file():
            broken.append(f"{target} (no file {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target} (no heading with anchor #{anchor} in {dest.relative_to(ROOT)})")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_the_link_check_is_not_vacuous(tmp_path):
    """The checks above read real links: a page with a dead link and a dead anchor fails them."""
    (tmp_path / "there.md").write_text("# Here\n\n## A section: with `code`\n")
    page = tmp_path / "page.md"
    page.write_text("[ok](there.md#a-section-with-code) [gone](missing.md) ![img](there.md#nope)\n"
                    "```\n[in code](ignored.md)\n```\n[web](https://example.org)\n")
    assert relative_links(page) == ["there.md#a-section-with-code", "missing.md", "there.md#nope"]
    assert "a-section-with-code" in anchors(tmp_path / "there.md")
