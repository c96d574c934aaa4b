"""`show`'s bytes pinned: the terminal view (`composer-pipeline show`, shortened and --full), `--json` and the
Markdown the assets render, on the shipped samples and on the replayed + paired store, compared with files
under ``golden/`` written by the code before `show` became a package (regenerate on purpose only:
``COMPOSER_UPDATE_GOLDEN=1 pytest tests/show/test_golden.py``).

The replayed store's run-dependent values (latency, creation time, the loopback server's port in the call
ids) are set to fixed values in a copy first; everything else is what the fixtures stored."""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pyarrow as pa
import pytest

from composer_pipeline.show import gather, render_markdown
from composer_pipeline.store import Store

from .conftest import cli

GOLDEN = Path(__file__).parent / "golden"
UPDATE = bool(os.environ.get("COMPOSER_UPDATE_GOLDEN"))


def _same_as_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.is_file(), f"{path} missing: generate it with COMPOSER_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} differs from the golden output"


def _show(*argv) -> str:
    rc, out, err = cli("show", *argv)
    assert rc == 0, err
    return out


def _markdown(views) -> str:
    return "\n\n<!-- next -->\n\n".join(
        render_markdown(v) + render_markdown(v, full=True) + render_markdown(v, max_messages=3) for v in views
    )


def test_samples_terminal_json_and_markdown_unchanged(samples_store):
    _same_as_golden("samples.txt", _show("--all", "--store", samples_store, "--width", "120"))
    _same_as_golden("samples_full.txt", _show("--all", "--store", samples_store, "--width", "90", "--full"))
    _same_as_golden("samples.jsonl", _show("--all", "--store", samples_store, "--json"))
    _same_as_golden("samples.md", _markdown(gather(str(samples_store), all_states=True)))


@pytest.fixture(scope="module")
def fixed_replays(replayed, tmp_path_factory) -> dict:
    """The replayed store with latency, creation time and call ids made run-independent."""
    src = Store(replayed["root"])
    dst = Store(str(tmp_path_factory.mktemp("golden-replayed")))
    calls: dict[str, str] = {}
    for name in src.table_names():
        t = src.read_table(name)
        if name == "teacher_replays":
            ids = t.column("call_id").to_pylist()
            calls = {
                c: f"{s}:{teacher}"
                for c, s, teacher in zip(ids, t.column("state_id").to_pylist(), t.column("teacher").to_pylist())
            }
            assert len(set(calls.values())) == len(ids)  # one row per state and teacher here
            t = t.set_column(
                t.schema.get_field_index("call_id"), "call_id", pa.array([calls[c] for c in ids], pa.string())
            )
            t = t.set_column(
                t.schema.get_field_index("latency_s"), "latency_s", pa.array([0.25] * t.num_rows, pa.float64())
            )
            t = t.set_column(
                t.schema.get_field_index("created_at"),
                "created_at",
                pa.array(["2026-01-01T00:00:00+00:00"] * t.num_rows, pa.string()),
            )
        elif "replay_call_ids" in t.column_names:
            fixed = [[calls.get(c, c) for c in cs or []] for cs in t.column("replay_call_ids").to_pylist()]
            t = t.set_column(
                t.schema.get_field_index("replay_call_ids"), "replay_call_ids", pa.array(fixed, pa.list_(pa.string()))
            )
        dst.write_table(name, t)
    pair_ids = sorted(
        {
            p
            for name in ("dpo_pairs", "normalized_dpo_pairs", "agreement_positives", "dropped_pairs")
            if dst.exists(name)
            for p in dst.read_table(name).column("pair_id").to_pylist()
        }
    )
    assert "teacher_replays" in src.table_names() and pair_ids
    return {"root": dst.root, "state_ids": replayed["state_ids"], "pair_ids": pair_ids}


def test_replayed_states_and_pairs_unchanged(fixed_replays):
    root, ids = fixed_replays["root"], fixed_replays["state_ids"] + fixed_replays["pair_ids"]
    _same_as_golden("replayed.txt", _show(*ids, "--store", root, "--width", "140"))
    _same_as_golden("replayed_full.txt", _show(*ids, "--store", root, "--width", "100", "--full"))
    lines = [orjson.loads(line) for line in _show(*ids, "--store", root, "--json").splitlines()]
    _same_as_golden(
        "replayed.jsonl", "".join(orjson.dumps(d, option=orjson.OPT_SORT_KEYS).decode() + "\n" for d in lines)
    )
    _same_as_golden("replayed.md", _markdown(gather(root, ids)))
