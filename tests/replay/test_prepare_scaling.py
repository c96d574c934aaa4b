"""Preparing requests is linear in a session's length (issue 30, item 13), and the shared, incremental
preparation gives exactly what rendering, fitting and hashing each state alone gives.

The cost is counted, not timed: the bytes serialized while preparing (every ``orjson.dumps`` of the
renderer, the fitter, the pricing and the call ids). Before, each state serialized its whole prefix again
(700 Edit calls: 44 s and 1.18 GB); the timing side by side is ``bench/bench_prepare.py``."""

from __future__ import annotations

import types

import orjson
import pytest

from composer_pipeline.ingest.pipeline import ingest_paths
from composer_pipeline.render import Conversation, RenderOptions, StreamRenderer, render_state
from composer_pipeline.replay.requests import build_requests, make_request
from composer_pipeline.teachers.cache import call_id, legacy_call_id
from composer_pipeline.teachers.config import parse_teachers
from composer_pipeline.teachers.pricing import worst_case_usd
from tests.support.long_sessions import write_edit_session, write_long_sessions


def _config(window: int | None = None):
    teachers = []
    for name in ("a", "b"):
        t = dict(name=name, base_url=f"http://127.0.0.1:1/{name}", model=f"m-{name}", api_key_env=None,
                 input_usd_per_mtok=1.0, output_usd_per_mtok=2.0, budget_usd=100.0, max_concurrency=1,
                 max_tokens=64)  # fmt: skip
        if window:
            t.update(context_window=window, fit_elide_step=4)
        teachers.append(t)
    return parse_teachers({"ceiling_usd": 100.0, "teachers": teachers}, "t")


def _tables(root, n_edits: int):
    write_edit_session(root, n_edits, file_chars=40_000, snippet_chars=1_000)
    (res,) = list(ingest_paths([root]))
    return res.states, res.messages


def _bytes_serialized(monkeypatch, states, messages, cfg) -> int:
    import composer_pipeline.render as render
    import composer_pipeline.replay.plan as plan
    import composer_pipeline.teachers.cache as cache
    import composer_pipeline.teachers.pricing as pricing

    total = [0]

    def dumps(obj, *a, **kw):
        out = orjson.dumps(obj, *a, **kw)
        total[0] += len(out)
        return out

    counting = types.SimpleNamespace(**{k: getattr(orjson, k) for k in dir(orjson) if not k.startswith("__")})
    counting.dumps = dumps
    # every module of request building that serializes
    for module in (render, cache, pricing, plan):
        monkeypatch.setattr(module, "orjson", counting)
    reqs, failed = build_requests(states, messages, cfg, RenderOptions())
    assert not failed and len(reqs) == 2 * states.num_rows
    return total[0]


@pytest.mark.parametrize("window", [None, 6_000])
def test_bytes_serialized_per_state_do_not_grow_with_the_session(tmp_path, monkeypatch, window):
    cfg = _config(window)
    small, large = _tables(tmp_path / "small", 40), _tables(tmp_path / "large", 160)
    per_state = [
        _bytes_serialized(monkeypatch, states, messages, cfg) / states.num_rows for states, messages in (small, large)
    ]
    # quadratic preparation serializes each state's whole prefix: ~4x more per state for 4x the edits
    assert per_state[1] < 1.3 * per_state[0], per_state


def _one_by_one(states, messages, cfg):
    """Each state rendered from its root and each request fitted, priced and hashed alone (the reference)."""
    conv = Conversation.from_table(messages)
    out = []
    for row in states.to_pylist():
        rs = render_state(conv, row, RenderOptions())
        for t in cfg.teachers:
            out.append(make_request(row["state_id"], row.get("session_key"), t, rs.messages, rs.tools,
                                    stream_id=row.get("stream_id"), order=int(row.get("n_prefix_messages") or 0)))  # fmt: skip
    return out


@pytest.mark.parametrize("window", [None, 3_000])
def test_the_shared_preparation_equals_each_state_prepared_alone(tmp_path, corpus, window):
    cfg = _config(window)
    write_long_sessions(tmp_path / "long", n_sessions=2, turns=25)
    write_edit_session(tmp_path / "long", 30, file_chars=20_000, snippet_chars=800)
    for root in (corpus.root, tmp_path / "long"):
        results = list(ingest_paths([root]))
        for res in results:
            incremental = StreamRenderer(Conversation.from_table(res.messages), RenderOptions())
            reference = Conversation.from_table(res.messages)
            by_stream = sorted(res.states.to_pylist(), key=lambda r: (r["stream_id"], r["n_prefix_messages"]))
            for row in by_stream:
                assert incremental.render(row) == render_state(reference, row, RenderOptions())
            if res.states.num_rows == 0:
                continue
            shared, failed = build_requests(res.states, res.messages, cfg, RenderOptions())
            reference = _one_by_one(res.states, res.messages, cfg)
            assert not failed and len(shared) == len(reference)
            for a, b in zip(shared, reference):
                assert (a.state_id, a.teacher.name, a.body) == (b.state_id, b.teacher.name, b.body)
                assert a.call_id == b.call_id == call_id(a.teacher.name, a.teacher.model, a.body, a.teacher.base_url)
                assert a.legacy_id == legacy_call_id(a.teacher.name, a.teacher.model, a.body)
                assert (a.est_prompt_tokens, a.worst_case_usd) == (b.est_prompt_tokens, b.worst_case_usd)
                assert (a.est_prompt_tokens, a.worst_case_usd) == worst_case_usd(a.body, a.teacher)
                assert (a.elided_messages, a.cut_messages, a.skip_reason) == (
                    b.elided_messages,
                    b.cut_messages,
                    b.skip_reason,
                )
