"""The local teacher server's greedy memo over real HTTP on loopback: one model directory served under
two names (as recipes/demo_teachers.yaml does with SmolLM2) generates an identical greedy request once;
the second name gets the same content and the same real token usage, marked as a memo hit."""

from __future__ import annotations

import threading

import httpx
import pytest

from composer_pipeline.teachers.server import load_models, start_server_thread

MSGS = [
    {"role": "system", "content": "You are a coding agent."},
    {"role": "user", "content": "Run the tests in calc/."},
]
TOOLS = [
    {
        "type": "function",
        "function": {"name": "Bash", "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}},
    }
]


@pytest.fixture(scope="module")
def twin_server(tiny_model_dir):
    url, stop = start_server_thread({"a": str(tiny_model_dir), "b": str(tiny_model_dir)})
    yield url
    stop()


def _post(url: str, **body) -> httpx.Response:
    r = httpx.post(url + "/chat/completions", json={"messages": MSGS, "tools": TOOLS, **body}, timeout=60)
    assert r.status_code == 200, r.text
    return r


def _memo(url: str) -> dict[str, int]:
    return httpx.get(url.rsplit("/v1", 1)[0] + "/health", timeout=10).json()["greedy_memo"]


def test_two_names_one_greedy_generation(twin_server):
    before = _memo(twin_server)
    first = _post(twin_server, model="a", max_tokens=9, temperature=0)
    second = _post(twin_server, model="b", max_tokens=9, temperature=0)
    assert first.headers["X-Composer-Memo"] == "miss" and second.headers["X-Composer-Memo"] == "hit"
    a, b = first.json(), second.json()
    assert a["choices"][0]["message"]["content"] == b["choices"][0]["message"]["content"]
    assert a["usage"] == b["usage"] and a["usage"]["prompt_tokens"] > 0 and 1 <= a["usage"]["completion_tokens"] <= 9
    assert (a["model"], b["model"]) == ("a", "b") and a["id"] != b["id"]  # two answers, one generation
    after = _memo(twin_server)
    assert after["hits"] - before["hits"] == 1 and after["misses"] - before["misses"] == 1
    assert after["entries"] - before["entries"] == 1


def test_memo_key_and_sampling(twin_server):
    _post(twin_server, model="a", max_tokens=5, temperature=0)
    assert (
        _post(twin_server, model="a", max_tokens=6, temperature=0).headers["X-Composer-Memo"] == "miss"
    )  # max_tokens in key
    assert _post(twin_server, model="b", max_tokens=5, temperature=0, stop=["\n"]).headers["X-Composer-Memo"] == "miss"
    assert _post(twin_server, model="a", max_tokens=5, temperature=0).headers["X-Composer-Memo"] == "hit"
    before = _memo(twin_server)
    sampled = _post(twin_server, model="a", max_tokens=5, temperature=1.0, seed=3)
    assert sampled.headers["X-Composer-Memo"] == "off" and _memo(twin_server) == before  # sampling never memoized


def test_concurrent_identical_requests_generate_once(twin_server):
    before = _memo(twin_server)
    results: dict[str, httpx.Response] = {}

    def go(name: str) -> None:
        results[name] = _post(
            twin_server,
            model=name,
            max_tokens=7,
            temperature=0,
            messages=[{"role": "user", "content": "concurrent twin request"}],
        )

    threads = [threading.Thread(target=go, args=(n,)) for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(r.headers["X-Composer-Memo"] for r in results.values()) == ["hit", "miss"]
    assert results["a"].json()["usage"] == results["b"].json()["usage"]
    after = _memo(twin_server)
    assert (after["hits"] - before["hits"], after["misses"] - before["misses"]) == (1, 1)


def test_names_of_one_directory_share_weights_and_memo_can_be_off(tiny_model_dir):
    models = load_models({"a": str(tiny_model_dir), "b": str(tiny_model_dir)})
    assert models["a"].model is models["b"].model and models["a"].lock is models["b"].lock
    assert models["a"].memo is models["b"].memo is not None
    off = load_models({"a": str(tiny_model_dir)}, memo_size=0)["a"]
    body = {"messages": MSGS, "max_tokens": 4, "temperature": 0}
    assert off.memo is None and off.complete_with_memo(body)[1] == "off"


def test_prompt_cache_reuses_the_prefill_and_changes_no_answer(tiny_model_dir):
    """Samples of one model share the prompt: the second reuses its prefill, answers are unchanged."""
    cached = load_models({"m": str(tiny_model_dir)}, memo_size=0)["m"]
    plain = load_models({"m": str(tiny_model_dir)}, memo_size=0, prompt_cache_size=0)["m"]
    assert plain.prompt_cache is None and cached.prompt_cache is not None
    for params in ({"temperature": 0}, {"temperature": 1.0, "seed": 3}, {"temperature": 1.0, "seed": 4}):
        body = {"model": "m", "messages": MSGS, "tools": TOOLS, "max_tokens": 8, **params}
        want = plain.complete(body)["choices"][0]["message"]["content"]
        assert cached.complete(body)["choices"][0]["message"]["content"] == want
    # one prefill, then two reuses of it (the same prompt each time)
    assert cached.prompt_cache.stats() == {"hits": 2, "misses": 1, "entries": 1}
