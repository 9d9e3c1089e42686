"""docs/security.md cannot rot: every test it names exists, every guarantee names one, and its list of
statuses covers every status the error map gives."""

import ast
import re
from functools import cache
from pathlib import Path

from gateway.http.errors import RULES

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "security.md"
NAMED = re.compile(r"`(tests/test_[a-z0-9_]+\.py)::(test_[A-Za-z0-9_]+)`")
GUARANTEES = 8  # the classes of issue 16


@cache  # the page names some 200 tests in a few long modules: each is parsed once
def _tests_in(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)}


def _sections() -> list[str]:
    text = DOC.read_text()
    return re.split(r"\n### [0-9]+\. ", text.split("\n## The guarantees of issue 16\n", 1)[1].split("\n## ", 1)[0])[1:]


def test_every_test_the_security_page_names_exists() -> None:
    named = NAMED.findall(DOC.read_text())
    assert len(named) > 30
    missing = [f"{file}::{name}" for file, name in named if name not in _tests_in(ROOT / file)]
    assert not missing, missing


def test_every_guarantee_has_a_mechanism_and_tests() -> None:
    sections = _sections()
    assert len(sections) == GUARANTEES
    for section in sections:
        assert NAMED.search(section), section[:200]
        assert re.search(r"`gateway[a-z_/]*\.py`|`gateway_storage/`|`deploy/[a-z/._-]+`", section), section[:200]


def test_the_documented_statuses_cover_the_error_map() -> None:
    listed = DOC.read_text().split("\n## Statuses\n", 1)[1]
    documented = {int(code) for code in re.findall(r"`([1-5][0-9][0-9])`", listed)}
    sent = {rule.status for rule in RULES.values()} - {499}  # 499 is logged for a client that left, never sent
    assert sent <= documented, sent - documented


def test_the_readme_and_the_architecture_link_to_the_security_page() -> None:
    assert "docs/security.md" in (ROOT / "README.md").read_text()
    assert "security.md" in (ROOT / "docs" / "architecture.md").read_text()
