"""docs/ARCHITECTURE.md's environment-variable table, checked against the code: every variable the
pipeline (composer_pipeline/, assets/, resources/) reads by a literal name is in the table with every
file that reads it, and nothing else is."""

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CODE = ("composer_pipeline", "assets", "resources")
NAME = r'"([A-Z][A-Z0-9_]*)"'
# os.environ.get("X"), os.getenv("X"), os.environ["X"] (not assigned), os.environ.setdefault("X"), "X" in os.environ
READS = [
    re.compile(rf"os\.environ\.get\({NAME}"),
    re.compile(rf"os\.getenv\({NAME}"),
    re.compile(rf"os\.environ\[{NAME}\](?!\s*=[^=])"),
    re.compile(rf"environ\.setdefault\({NAME}"),
    re.compile(rf"{NAME} (?:not )?in os\.environ"),
]


def code_reads() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for root in CODE:
        for p in sorted((REPO / root).rglob("*.py")):
            text = p.read_text()
            for rx in READS:
                for name in rx.findall(text):
                    out.setdefault(name, set()).add(str(p.relative_to(REPO)))
    return out


def doc_table() -> dict[str, set[str]]:
    text = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    section = text.split("## Environment variables", 1)[1].split("\n## ", 1)[0]
    out: dict[str, set[str]] = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        readers = set(re.findall(r"`([^`]+\.py)`", cells[1]))
        for name in re.findall(r"`([A-Z][A-Z0-9_]*)`", cells[0]):
            out[name] = readers
    return out


def test_the_scan_sees_the_reads_it_must():
    reads = code_reads()
    assert reads["COMPOSER_PIPELINE_HOME"] == {"composer_pipeline/home.py"}
    assert "composer_pipeline/store.py" in reads["COMPOSER_STORE"]
    # the demo assigns it; an assignment is not a read
    assert "DAGSTER_HOME" not in reads


def test_environment_table_matches_the_code():
    reads, doc = code_reads(), doc_table()
    assert sorted(set(reads) - set(doc)) == [], "read by the code, missing from docs/ARCHITECTURE.md's table"
    assert sorted(set(doc) - set(reads)) == [], "in docs/ARCHITECTURE.md's table, read by nothing"
    wrong = {n: {"doc": sorted(doc[n]), "code": sorted(reads[n])} for n in reads if doc[n] != reads[n]}
    assert wrong == {}, "the table names other readers than the code has"
