"""The docs stay true: the README is a front door whose test command is CI's, every link between
the Markdown pages reaches a file and a heading, the life of a page names functions that exist
where it says, and the guarantees name tests and benchmarks that exist.

Read from the files, as a newcomer reads them: nothing is rendered or served.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tools.processes import REPO

README = REPO / "README.md"
PAGES = [README, REPO / "CHANGELOG.md", REPO / "podserver" / "README.md", REPO / "bench" / "README.md",
         *sorted((REPO / "docs").glob("*.md"))]  # fmt: skip
README_MAX_LINES = 250
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE_BLOCK = re.compile(r"^```.*?^```", re.M | re.S)


def _section(text: str, heading: str) -> str:
    return text.split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = CODE_BLOCK.sub("", path.read_text())
    return {_slug(line.lstrip("#")) for line in text.splitlines() if line.startswith("#")}


def test_the_readme_is_a_front_door_with_the_two_commands():
    text = README.read_text()
    assert text.count("\n") <= README_MAX_LINES
    commands = _section(text, "The two commands")
    assert "make run" in commands
    assert re.search(r"^make test\b", commands, re.M), "the README's test command is `make test`"


def test_ci_runs_the_readmes_test_command():
    steps = [line.strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    # Both runs (SQLite, then PostgreSQL + Redis: side by side, each under a deadline) are the
    # README's command, and nothing else runs pytest.
    runs = [step for step in steps if not step.startswith("#") and re.search(r"\bmake test\b", step)]
    assert len(runs) == 2, runs
    assert not any("pytest" in step for step in steps if not step.startswith("#"))
    assert re.search(r"^test:", (REPO / "Makefile").read_text(), re.M)


def test_every_link_between_the_pages_reaches_a_file_and_a_heading():
    broken = []
    for page in PAGES:
        for target in LINK.findall(CODE_BLOCK.sub("", page.read_text())):
            if re.match(r"[a-z]+:", target):
                continue  # http(s), mailto: not checked here
            name, _, anchor = target.partition("#")
            path = (page.parent / name).resolve() if name else page
            if not path.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif anchor and path.suffix == ".md" and anchor not in _anchors(path):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such heading)")
    assert broken == []


def test_the_link_check_finds_a_broken_link(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("# Title\n\n## A heading's words\n\n[ok](#a-headings-words) [gone](#nowhere)\n")
    assert _slug("A heading's words") == "a-headings-words"
    assert "a-headings-words" in _anchors(page)
    assert "nowhere" not in _anchors(page)


def _defined(path: Path) -> set[str]:
    """Names a module defines: functions and classes, and the methods of its classes."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
    return names


def test_the_life_of_a_page_names_functions_where_they_are():
    """Each step names a module and a function beside it (`ocrjobs/services/pages.py`
    `pages_claim`; a bare file name is in the directory of the module named before it): the
    function (or class, or method) is defined in that module."""
    life = _section(README.read_text(), "The life of a page")
    steps = re.findall(r"^\d+\. .*$", life, re.M)
    assert len(steps) >= 8
    missing, pairs = [], 0
    for step in steps:
        directory = REPO
        for word, name in re.findall(r"`([\w/]+\.py)` `([A-Za-z_][\w.]*)`", step):
            path = REPO / word if "/" in word else directory / word
            directory = path.parent
            pairs += 1
            if not path.exists():
                missing.append(f"{word}: no such file")
            elif name.rpartition(".")[2] not in _defined(path):
                missing.append(f"{word}: no {name}")
    assert missing == []
    assert pairs >= 15


def test_the_map_names_packages_that_exist():
    block = CODE_BLOCK.search(_section(README.read_text(), "The map")).group(0)
    missing, parent = [], REPO
    for line in block.splitlines():
        if match := re.match(r"(\w+/[\w/]*)", line):
            parent = REPO / match.group(1).split("/")[0]
            path = REPO / match.group(1)
        elif match := re.match(r"  (\w+/[\w/]*)", line):
            path = parent / match.group(1)
        else:
            continue
        if not path.is_dir():
            missing.append(str(path.relative_to(REPO)))
    assert missing == []


def test_the_guarantees_name_tests_and_benchmarks_that_exist():
    text = (REPO / "docs" / "guarantees.md").read_text()
    named = re.findall(r"`((?:tests|bench|tools)/[\w/]+\.py)(?:::(\w+))?`", text)
    assert len(named) > 40
    missing = []
    for path, test in named:
        if not (REPO / path).exists():
            missing.append(path)
        elif test and test not in _defined(REPO / path):
            missing.append(f"{path}::{test}")
    assert missing == []
    numbered = {int(n) for n in re.findall(r"^## Invariant (\d+)$", text, re.M)}
    # Each invariant architecture.md lists (numbered as in DESIGN.md, which has gaps) has its section.
    listed = {
        int(n)
        for n in re.findall(r"^(\d+)\. ", _section((REPO / "docs" / "architecture.md").read_text(), "Invariants"), re.M)
    }
    assert set(range(1, 19)) <= listed
    assert numbered == listed
