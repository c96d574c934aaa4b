from __future__ import annotations

from pathlib import Path

import pytest

from composer_pipeline.ingest.config import IngestRecipe
from composer_pipeline.ingest.discover import discover_sessions
from composer_pipeline.render import Conversation

from .engines import ingest_checked


class Ingested:
    """All sessions of a root ingested once; helpers to look states up by file."""

    def __init__(self, root: Path, recipe: IngestRecipe | None = None):
        self.root = root
        self.results = [ingest_checked(sf, recipe or IngestRecipe()) for sf in discover_sessions(root)]
        self.by_key = {r.session_key: r for r in self.results}

    def states(self, key: str) -> list[dict]:
        return self.by_key[key].states.to_pylist()

    def conv(self, key: str) -> Conversation:
        return Conversation.from_table(self.by_key[key].messages)

    def report(self, file: str) -> dict:
        return next(rep for r in self.results for rep in r.file_reports if rep["file"] == file)


@pytest.fixture(scope="session")
def real(real_traces) -> Ingested:
    return Ingested(real_traces)


@pytest.fixture(scope="session")
def ours(project_corpus) -> Ingested:
    """The project's own corpus (tests/support/traces.py) ingested by both engines."""
    return Ingested(project_corpus.root)


@pytest.fixture(scope="session")
def ingested(corpus) -> Ingested:
    """Each corpus in turn (see tests/conftest.py), ingested by both engines."""
    return Ingested(corpus.root)


@pytest.fixture(scope="session")
def samples(repo_root) -> Ingested:
    return Ingested(repo_root / "composer_pipeline" / "samples" / "projects")
