"""`composer-pipeline teachers serve` on the offline tiny model: the OpenAI-compatible surface, real
tokenizer usage, and a replay of ingested sessions through it over a real socket."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from ledger_helpers import spend_by_run

from composer_pipeline.ledger import Ledger
from composer_pipeline.models import resolve_model
from composer_pipeline.replay.run import ReplayRun
from composer_pipeline.teachers.cache import ResponseCache
from composer_pipeline.teachers.config import parse_teachers

# starts a local teacher server (a model load)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_server(tiny_model_dir):
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "teachers",
            "serve",
            "--model",
            f"tiny={tiny_model_dir}",
            "--model",
            f"tiny-b={tiny_model_dir}",
            "--port",
            "0",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    # "serving [...] at http://127.0.0.1:PORT/v1 (...)"
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        pytest.fail(f"server did not start: {proc.stderr.read()[-2000:]}")
    url = line.split(" at ", 1)[1].split()[0]
    yield url
    proc.terminate()
    # a loaded 2-core machine can take more than a few seconds to let it finish its shutdown
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


def test_openai_surface(tiny_server, tiny_model_dir):
    from transformers import AutoTokenizer

    base = tiny_server.rsplit("/v1", 1)[0]
    assert httpx.get(base + "/health").json()["status"] == "ok"
    assert {m["id"] for m in httpx.get(tiny_server + "/models").json()["data"]} == {"tiny", "tiny-b"}
    msgs = [{"role": "system", "content": "You are a coding agent."}, {"role": "user", "content": "Run the tests."}]
    r = httpx.post(
        tiny_server + "/chat/completions",
        json={"model": "tiny", "messages": msgs, "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    assert r.status_code == 200
    data = r.json()
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    expected = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert data["usage"]["prompt_tokens"] == len(expected)
    assert 1 <= data["usage"]["completion_tokens"] <= 8
    assert data["choices"][0]["message"]["role"] == "assistant"
    again = httpx.post(
        tiny_server + "/chat/completions",
        json={"model": "tiny", "messages": msgs, "max_tokens": 8, "temperature": 0},
        timeout=60,
    )
    assert again.json()["choices"][0]["message"]["content"] == data["choices"][0]["message"]["content"]  # greedy
    bad = httpx.post(tiny_server + "/chat/completions", json={"model": "nope", "messages": msgs}, timeout=30)
    assert bad.status_code == 404 and "not served" in bad.json()["error"]["message"]
    junk = httpx.post(tiny_server + "/chat/completions", content=b"{not json", timeout=30)
    assert junk.status_code == 400


def test_replay_through_local_server(tiny_server, samples_tables, tmp_path):
    from composer_pipeline.render import RenderOptions

    states, messages = samples_tables
    states = states.slice(0, 6)
    teachers = [
        dict(
            name=n,
            base_url=tiny_server,
            model=m,
            api_key_env=None,
            input_usd_per_mtok=0.2,
            output_usd_per_mtok=0.8,
            budget_usd=1.0,
            max_concurrency=2,
            max_tokens=12,
            temperature=0.0,
            timeout_s=60,
        )
        for n, m in (("a", "tiny"), ("b", "tiny-b"))
    ]
    cfg = parse_teachers({"ceiling_usd": 1.0, "teachers": teachers})
    cache, ledger = ResponseCache(tmp_path / "c"), Ledger(tmp_path / "l.sqlite")
    run = ReplayRun.prepare(states, messages, cfg, RenderOptions())
    plan = run.plan(cache, ledger)
    assert plan.fits and plan.table.num_rows == 12 and not any(plan.table.column("cached").to_pylist())
    t0 = time.perf_counter()
    res = run.replay({}, cache=cache, ledger=ledger, run_id="local")
    rows = res.table.to_pylist()
    assert len(rows) == 12 and {r["status"] for r in rows} == {"answered"}
    assert all(r["prompt_tokens"] > 0 and 1 <= r["completion_tokens"] <= 12 and r["cost_usd"] > 0 for r in rows)
    assert res.summary["spend_usd"] == pytest.approx(sum(spend_by_run(ledger, "local").values()))
    assert time.perf_counter() - t0 < 120
    plan2 = ReplayRun.prepare(states, messages, cfg, RenderOptions()).plan(cache, ledger)
    assert all(plan2.table.column("cached").to_pylist()) and plan2.worst_case_by_teacher == {"a": 0.0, "b": 0.0}


def test_resolve_model(tiny_model_dir, tmp_path):
    assert resolve_model(tiny_model_dir) == tiny_model_dir
    with pytest.raises(ValueError, match="unknown model"):
        resolve_model("no-such-model")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no config.json"):
        resolve_model(tmp_path / "empty")


def test_converted_gguf_copy_loses_its_quantization_marker(tmp_path):
    import json

    from composer_pipeline.models import _strip_gguf_marker

    cfg = {"model_type": "llama", "quantization_config": {"quant_method": "gguf", "gguf_file": "x.gguf"}}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    _strip_gguf_marker(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text()) == {"model_type": "llama"}
    _strip_gguf_marker(tmp_path)  # idempotent
    assert json.loads((tmp_path / "config.json").read_text()) == {"model_type": "llama"}


def test_n_choices_and_plain_refusals(tiny_server):
    """Issue 34: ``n`` is honoured (greedy: the same answer n times, its completion tokens billed n times), and
    what the server does not implement is a 400 that names it, never silently ignored."""
    msgs = [{"role": "user", "content": "Run the tests."}]
    url = tiny_server + "/chat/completions"
    one = httpx.post(url, json={"model": "tiny", "messages": msgs, "max_tokens": 6, "temperature": 0}, timeout=60)
    three = httpx.post(
        url, json={"model": "tiny", "messages": msgs, "max_tokens": 6, "temperature": 0, "n": 3}, timeout=60
    )
    assert one.status_code == three.status_code == 200
    choices = three.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2]
    assert {c["message"]["content"] for c in choices} == {one.json()["choices"][0]["message"]["content"]}
    assert three.json()["usage"]["completion_tokens"] == 3 * one.json()["usage"]["completion_tokens"]
    assert three.json()["usage"]["prompt_tokens"] == one.json()["usage"]["prompt_tokens"]
    for extra, named in (
        ({"logprobs": True}, "logprobs"),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"stream": True}, "stream"),
    ):
        r = httpx.post(url, json={"model": "tiny", "messages": msgs, "max_tokens": 4, **extra}, timeout=30)
        assert r.status_code == 400 and named in r.json()["error"]["message"], extra
    for n in (0, 9, "2"):
        r = httpx.post(url, json={"model": "tiny", "messages": msgs, "max_tokens": 4, "n": n}, timeout=30)
        assert r.status_code == 400 and "n must be" in r.json()["error"]["message"], n
