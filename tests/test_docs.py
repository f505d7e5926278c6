"""The README and docs/: every relative link resolves, to a file and to a heading, and
the docs speak of the product as it is, not of the project's own history."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
# Words of a project diary, which a reader of the docs cannot resolve.
HISTORY = re.compile(r"\b(this session|earlier in this|issue \d+|before the fix)\b", re.IGNORECASE)


def slug(heading: str) -> str:
    """A heading's anchor as GitHub makes it: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]


def test_the_slug_matches_githubs():
    assert slug("The CLI: validate, plan and render offline") == "the-cli-validate-plan-and-render-offline"
    assert slug("Running it outside the cluster") == "running-it-outside-the-cluster"


def test_the_readme_is_a_front_page():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 160


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_resolves(page):
    broken = []
    for target in relative_links(page):
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor")
    assert not broken, f"{page.relative_to(ROOT)}: " + "; ".join(broken)


def test_every_doc_is_linked_from_the_readme():
    linked = {(ROOT / t.partition("#")[0]).resolve() for t in relative_links(ROOT / "README.md")}
    assert {p for p in PAGES[1:]} <= linked


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_the_docs_do_not_tell_the_projects_history(page):
    found = [m.group(0) for m in HISTORY.finditer(page.read_text())]
    assert not found, f"{page.relative_to(ROOT)}: {found}"
