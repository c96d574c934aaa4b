"""The local teacher server's answers to malformed requests, without a model loaded (fast)."""

import threading

import httpx
import pytest

from composer_pipeline.teachers.server import TeacherHTTPServer


@pytest.fixture
def no_models_server():
    srv = TeacherHTTPServer({}, "127.0.0.1", 0)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    t.start()
    yield srv.url
    srv.shutdown()
    srv.server_close()
    t.join(timeout=5)


@pytest.mark.parametrize("model", [["tiny"], {"name": "tiny"}, 3, None])
def test_a_model_that_is_not_a_name_is_not_served(no_models_server, model):
    """A ``model`` that is no string (a list is no dict key) used to end the handler with a TypeError: the
    client got a dropped connection instead of the 404 every other unknown model gets."""
    msgs = [{"role": "user", "content": "hi"}]
    r = httpx.post(no_models_server + "/chat/completions", json={"model": model, "messages": msgs}, timeout=30)
    assert r.status_code == 404
    assert r.json()["error"]["message"] == f"model {model!r} not served; serving []"
