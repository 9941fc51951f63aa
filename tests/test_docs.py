"""The README stays a short page for users, and no document points at a file that is not there.

The docs site itself is checked by ``mkdocs build --strict`` in the full test run (broken
links and anchors between pages fail it); these checks need no mkdocs and no network, so
they run in the quick tier: the README's length, its links, the repository paths that the
README, CONTRIBUTING and the docs pages name, and that the API reference covers every
public name.
"""

from __future__ import annotations

import re
from pathlib import Path
from types import ModuleType

import pytest

import idist
import idist.checkpoint
import idist.launch
import idist.testing
import idist.training

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MAX_README_LINES = 200

#: [text](target) and ![alt](target); the target ends at whitespace or ")"
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
#: an inline code span (fenced blocks are removed first)
CODE = re.compile(r"`([^`\n]+)`")
#: a file name ending in .md anywhere in the text, e.g. a document named in prose
MD_NAME = re.compile(r"(?<![\w/.-])([\w./-]*[\w-]\.md)\b")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
#: top-level entries a path written in backticks may start with
TOP_LEVEL = ("benchmarks", "docs", "examples", "properties", "scripts", "src", "stubs", "tests", ".ci")
PACKAGE = ROOT / "src" / "idist"

if not (ROOT / "mkdocs.yml").is_file() or not (ROOT / "scripts").is_dir():
    # an sdist carries the tests but not the docs or the scripts these documents name
    pytest.skip("needs a checkout of the repository (docs/, scripts/)", allow_module_level=True)


def _prose(path: Path) -> str:
    """The file without its fenced code blocks (commands and output there are examples)."""
    return FENCE.sub("", path.read_text(encoding="utf-8"))


def _link_targets(path: Path) -> list[str]:
    return [t for t in LINK.findall(_prose(path)) if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


def _resolves(base: Path, target: str) -> bool:
    target = target.split("#", 1)[0]
    return not target or (base / target).exists()


def test_readme_is_at_most_200_lines() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_README_LINES, (
        f"README.md has {len(lines)} lines (limit {MAX_README_LINES}): move the detail to a page in docs/ and link it"
    )


def test_readme_links_point_at_files_in_the_repository() -> None:
    missing = [t for t in _link_targets(README) if not _resolves(ROOT, t)]
    assert not missing, f"README.md links to files the repository lacks: {missing}"


def test_readme_names_no_missing_document() -> None:
    named = set(MD_NAME.findall(README.read_text(encoding="utf-8")))
    missing = sorted(n for n in named if not (ROOT / n).exists())
    assert not missing, f"README.md names documents the repository lacks: {missing}"


def _named_paths(path: Path) -> list[str]:
    """Repository paths written in backticks: `scripts/test.sh`, `tests/horovod/`, or paths
    inside the package as the design page writes them (`launch/_procs.py`)."""
    out = []
    for span in CODE.findall(_prose(path)):
        if " " in span or "*" in span or "<" in span or "/" not in span:
            continue
        first = span.split("/", 1)[0]
        if first in TOP_LEVEL or (PACKAGE / first).exists():
            out.append(span)
    return out


DOCUMENTS = sorted([README, ROOT / "CONTRIBUTING.md", *(ROOT / "docs").rglob("*.md")])


@pytest.mark.parametrize("doc", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_paths_named_in_documents_exist(doc: Path) -> None:
    spans = _named_paths(doc)
    missing = [s for s in spans if not ((ROOT / s).exists() or (PACKAGE / s).exists())]
    assert not missing, f"{doc.relative_to(ROOT)} names paths the repository lacks: {missing}"


def _reference_members(page: str) -> set[str] | None:
    """The explicit ``members: [...]`` of the first ``::: module`` block on a reference page,
    or None when the block renders every public name."""
    text = (ROOT / "docs" / "reference" / page).read_text(encoding="utf-8")
    block = re.search(r"^:::[ \t]+\S+\n((?:[ \t]+\S.*\n)*)", text, re.M)
    assert block is not None, f"docs/reference/{page} has no ::: block"
    found = re.search(r"^[ \t]+members:\s*\[([^\]]*)\]", block.group(1), re.M)
    return None if found is None else {m.strip() for m in found.group(1).split(",") if m.strip()}


@pytest.mark.parametrize(
    ("module", "page"),
    [
        (idist, "idist.md"),
        (idist.launch, "launch.md"),
        (idist.training, "training.md"),
        (idist.testing, "testing.md"),
        (idist.checkpoint, "checkpoint.md"),
    ],
    ids=lambda v: v if isinstance(v, str) else v.__name__,
)
def test_the_api_reference_covers_every_public_name(module: ModuleType, page: str) -> None:
    members = _reference_members(page)
    if members is None:
        return  # the whole __all__ is rendered
    # names re-exported from idist are documented on the idist page
    wanted = set(module.__all__) - (set(idist.__all__) if module is not idist else set())
    assert wanted <= members, f"docs/reference/{page} leaves out {sorted(wanted - members)}"
    extra = sorted(members - set(module.__all__))
    assert not extra, f"docs/reference/{page} lists names {module.__name__} does not export: {extra}"
