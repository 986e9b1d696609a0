"""Comments, docstrings and test names say what the code does and why, not which tracker entry asked for it:
no source file in the code trees (.py, .c, .h, .sh) names an issue by number. Markdown may, where it records
history."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
TREES = ("service", "api", "sink", "tests", "bench", "tools")
SUFFIXES = {".py", ".c", ".h", ".sh"}
TRACKER_REF = re.compile(r"[Ii]ssue[ _-]?\d+")
SELF = Path(__file__).resolve()


def _sources() -> list[Path]:
    out = []
    for tree in TREES:
        base = ROOT / tree
        for path in base.rglob("*"):
            if path.suffix in SUFFIXES and path.is_file() and path.resolve() != SELF:
                out.append(path)
    return sorted(out)


def test_the_code_trees_have_sources() -> None:
    files = _sources()
    names = {p.relative_to(ROOT).parts[0] for p in files}
    assert {"service", "api", "tests", "bench", "tools"} <= names
    assert ROOT / "service" / "protocol" / "_crecords.c" in files


def test_no_source_names_a_tracker_issue() -> None:
    hits = []
    for path in _sources():
        text = path.read_text(encoding="utf-8", errors="replace")
        for lineno, line in enumerate(text.splitlines(), 1):
            if TRACKER_REF.search(line):
                hits.append(f"{path.relative_to(ROOT)}:{lineno}: {line.strip()}")
    assert not hits, "say what and why instead of naming the tracker:\n" + "\n".join(hits)


def test_the_pattern_catches_the_forms_it_must() -> None:
    for text in ("issue 24", "Issue 21 item 3", "test_issue_21_x", "issue-7", "issue24"):
        assert TRACKER_REF.search(text), text
    for text in ("issues", "an issue with the broker", "issue: 5 records"):
        assert not TRACKER_REF.search(text), text
