"""Ingest with both engines and require identical output (the native engine's contract).

Every ingest test goes through :func:`ingest_checked`, so each pitfall fixture, the real traces and
the samples also check that the compiled engine (native.py) reproduces the Python reference
exactly: all three tables, the per-file reports, the secret counts (in order) and the stats.
"""

from __future__ import annotations

from composer_pipeline.ingest import native
from composer_pipeline.ingest.config import IngestRecipe
from composer_pipeline.ingest.discover import SessionFiles
from composer_pipeline.ingest.pipeline import IngestResult, ingest_session


def assert_same(got: IngestResult, ref: IngestResult) -> None:
    key = got.session_key
    for name in ("states", "messages", "quarantine"):
        a, b = getattr(got, name), getattr(ref, name)
        # the native buffers are well-formed Arrow (offsets, UTF-8)
        a.validate(full=True)
        if not a.equals(b):
            rows_a, rows_b = a.to_pylist(), b.to_pylist()
            assert len(rows_a) == len(rows_b), f"{key} {name}: {len(rows_a)} rows vs {len(rows_b)}"
            for i, (x, y) in enumerate(zip(rows_a, rows_b)):
                assert x == y, f"{key} {name} row {i}: " + ", ".join(
                    f"{k}: {x[k]!r:.200} != {y[k]!r:.200}" for k in x if x[k] != y[k]
                )
            raise AssertionError(f"{key} {name}: tables differ in schema")  # rows equal: types differ
    assert got.file_reports == ref.file_reports, key
    assert list(got.secrets.items()) == list(ref.secrets.items()), key
    assert got.stats == ref.stats, key


def ingest_checked(sf: SessionFiles, recipe: IngestRecipe | None = None) -> IngestResult:
    """The native engine's result (the Python one where it is not built), checked against the reference."""
    ref = ingest_session(sf, recipe, engine="python")
    if not native.AVAILABLE:
        return ref
    got = ingest_session(sf, recipe, engine="native")
    assert_same(got, ref)
    return got
