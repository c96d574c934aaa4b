"""A local OpenAI-compatible teacher server over small Hugging Face causal LMs (CPU is enough).

In:  ``models``: served name → model directory (see :func:`composer_pipeline.models.resolve_model`), host, port.
Out: ``POST /v1/chat/completions`` (the request's ``model`` picks the model; ``messages``, ``tools``,
     ``max_tokens``, ``temperature``, ``top_p``, ``seed``), ``GET /v1/models``, ``GET /health``.
     Responses carry real token usage (tokenizer counts of the prompt actually fed and of the
     generated tokens).

The prompt is the model's own chat template applied to the messages, with ``tools`` passed to the
template when it uses them; otherwise the tool list is described in the system turn, with the
``<tool_call>{"name", "arguments"}</tool_call>`` convention of :mod:`composer_pipeline.actions`.
Assistant ``tool_calls`` and ``tool`` messages are given to templates that cannot render them as
plain text. The rendering is :mod:`composer_pipeline.chat`'s, the trainer's too. Greedy decoding at ``temperature`` 0, sampling otherwise.

Served names that resolve to the same model directory share one loaded copy of the weights (and
its lock). Greedy memo: a ``temperature`` 0 generation is a pure function of (weights, prompt,
``tools``, ``max_tokens``, ``stop``), so the server keeps an in-memory LRU of greedy results keyed by
(resolved model directory, canonical JSON of ``messages`` + ``tools`` + ``max_tokens`` + ``stop``).
An identical greedy request — under the same or another served name of the same weights — is
answered from it without generating again. The response is the same answer with the same real
token usage (the usage of that one generation), a fresh ``id`` and the requested ``model`` name; the
client still gets, prices and bills every request as usual (the memo saves CPU, not accounting).
``X-Composer-Memo: hit|miss|off`` on each completion and ``greedy_memo`` {hits, misses, entries} on
``GET /health`` show it working. Sampled requests (``temperature`` > 0) never use it. The demo uses
it to serve SmolLM2 under two teacher names without paying for the identical generation twice.

Deliberately simplified: one generation at a time per model (a lock; CPU has no batching gain at
this size), the memo lives only as long as the process (``memo_size`` entries, LRU), prompts
longer than ``max_prompt_tokens`` lose their oldest non-system messages, then
their oldest tokens. Tool calls the model writes as ``<tool_call>`` blocks are answered in OpenAI's shape
(``message.tool_calls``, ``finish_reason: tool_calls``); ``n`` choices are n draws (greedy: one answer n
times); ``stop`` ends the text before the first stop string. A parameter it does not implement (``stream``, ``logprobs``, ``response_format``, a
``tool_choice`` other than ``auto``...) is a 400 naming it, never silently ignored.
"""

from __future__ import annotations

import copy
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import orjson

from composer_pipeline import chat
from composer_pipeline.actions import ActionParseError, parse_action_text
from composer_pipeline.models import resolve_model

MAX_NEW_TOKENS = 1024
# greedy results kept per server process (a few hundred bytes each)
MEMO_SIZE = 4096
# prefilled prompts kept per model (SmolLM2-135M at 1k tokens: ~90 MB each)
PROMPT_CACHE_SIZE = 4


MAX_N = 8  # choices per request (``n``)
# request parameters this server does not implement: one set to anything but its default is a 400 naming it
UNSUPPORTED_PARAMS: dict[str, Callable[[Any], bool]] = {
    "stream": lambda v: bool(v),
    "logprobs": lambda v: bool(v),
    "top_logprobs": lambda v: v is not None,
    "logit_bias": lambda v: bool(v),
    "presence_penalty": lambda v: bool(v),
    "frequency_penalty": lambda v: bool(v),
    "response_format": lambda v: v not in (None, {"type": "text"}),
    "tool_choice": lambda v: v not in (None, "auto"),
    "parallel_tool_calls": lambda v: v is False,
}


def stop_strings(body: dict[str, Any]) -> list[str]:
    """The request's ``stop`` (a string or up to 4 strings); ValueError (a 400) for anything else."""
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop if isinstance(stop, list) else [] if stop is None else None
    if stops is None or len(stops) > 4 or not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"stop must be a non-empty string or a list of up to 4, got {stop!r}")
    return stops


def unsupported_params(body: dict[str, Any]) -> list[str]:
    """The parameters of ``body`` this server would silently ignore (so it refuses them instead)."""
    return [k for k, is_set in UNSUPPORTED_PARAMS.items() if k in body and is_set(body[k])]


def chat_message(text: str, finish: str) -> tuple[dict[str, Any], str]:
    """A generated text as OpenAI's assistant message: its ``<tool_call>`` blocks as ``tool_calls`` (with
    ``finish_reason: tool_calls`` when the model stopped by itself); a text whose blocks do not parse stays
    content, for the client to judge."""
    try:
        action = parse_action_text(text)
    except ActionParseError:
        return {"role": "assistant", "content": text}, finish
    if not action.tool_calls:
        return {"role": "assistant", "content": text}, finish
    message = action.to_chat_message()
    for call in message["tool_calls"]:
        call["id"] = f"call_{uuid.uuid4().hex[:24]}"
    return message, "tool_calls" if finish == "stop" else finish


class GreedyMemo:
    """Thread-safe LRU of greedy generations: key -> (text, finish_reason, prompt_tokens, completion_tokens)."""

    def __init__(self, max_entries: int = MEMO_SIZE):
        self.max_entries = max_entries
        self._data: OrderedDict[bytes, tuple[str, str, int, int]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    @staticmethod
    def key(path: Path, body: dict[str, Any], max_new: int) -> bytes:
        canon = {
            "messages": body.get("messages"),
            "tools": body.get("tools") or None,
            "max_tokens": max_new,
            "stop": body.get("stop"),
        }
        return str(Path(path).resolve()).encode() + b"\0" + orjson.dumps(canon, option=orjson.OPT_SORT_KEYS)

    def get(self, key: bytes) -> tuple[str, str, int, int] | None:
        with self._lock:
            hit = self._data.get(key)
            if hit is None:
                self.misses += 1
                return None
            self._data.move_to_end(key)
            self.hits += 1
            return hit

    def put(self, key: bytes, value: tuple[str, str, int, int]) -> None:
        if self.max_entries <= 0:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "entries": len(self._data)}


class PromptCache:
    """LRU of prefilled prompts: prompt token ids -> the model's KV cache over all but the last token.

    Several samples of one model (the demo's ``smollm2-s1``/``-s2``, any self-consistency setup) send
    the same prompt with different seeds; on a CPU the prompt's prefill is most of a generation, so
    the second sample reuses it (``generate(past_key_values=<copy>)``, the reuse pattern of the
    transformers cache docs) and only decodes. The answer is the one a full generation gives: the
    same prompt, the same sampling stream (the seed is set just before decoding).
    """

    def __init__(self, max_entries: int = 4):
        self.max_entries = max_entries
        self._data: OrderedDict[bytes, Any] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get_or_fill(self, model: Any, ids: list[int], torch: Any) -> Any | None:
        """A private copy of the prefilled cache for ``ids`` (None when off or the prompt is one token).

        Called under the model's lock (the cache belongs to one set of weights)."""

        if self.max_entries <= 0 or len(ids) < 2:
            return None
        key = orjson.dumps(ids)
        kv = self._data.get(key)
        if kv is not None:
            self._data.move_to_end(key)
            self.hits += 1
        else:
            from transformers import DynamicCache

            self.misses += 1
            with torch.no_grad():
                prefix = torch.tensor([ids[:-1]], dtype=torch.long)
                kv = model(
                    input_ids=prefix,
                    attention_mask=torch.ones_like(prefix),
                    past_key_values=DynamicCache(),
                    use_cache=True,
                ).past_key_values
            self._data[key] = kv
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)
        return copy.deepcopy(kv)

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "entries": len(self._data)}


@dataclass
class LocalModel:
    name: str
    path: Path
    max_prompt_tokens: int = 1024
    tokenizer: Any = None
    model: Any = None
    lock: threading.Lock = field(default_factory=threading.Lock)
    # shared by every served name of the server
    memo: GreedyMemo | None = None
    # per weights (shared by the names of one directory)
    prompt_cache: PromptCache | None = None

    def load(self) -> LocalModel:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(self.path)
        self.model = AutoModelForCausalLM.from_pretrained(self.path, dtype=torch.float32).eval()
        ctx = int(getattr(self.model.config, "max_position_embeddings", 2048) or 2048)
        self.max_prompt_tokens = min(self.max_prompt_tokens, ctx)
        return self

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict] | None, max_new: int) -> list[int]:
        """The prompt's token ids within ``max_prompt_tokens - max_new`` (the one renderer: :mod:`composer_pipeline.chat`)."""
        return chat.prompt_ids(self.tokenizer, messages, tools, max(16, self.max_prompt_tokens - max_new))

    def complete(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.complete_with_memo(body)[0]

    def complete_with_memo(self, body: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """The completion (``n`` choices) and how the greedy memo served it: ``hit``, ``miss`` or ``off``
        (sampling / no memo); for ``n`` > 1 how the last choice was served."""
        import torch

        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise ValueError("messages must be a non-empty list")
        n = body.get("n", 1)
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
            raise ValueError(f"n must be an integer in [1, {MAX_N}], got {n!r}")
        # a malformed stop is a 400 before anything is generated
        stop_strings(body)
        max_new = int(body.get("max_tokens") or body.get("max_completion_tokens") or 256)
        max_new = max(1, min(max_new, MAX_NEW_TOKENS))
        asked_temperature = body.get("temperature")
        temperature = float(asked_temperature if asked_temperature is not None else 1.0)
        memo_key = self.memo.key(self.path, body, max_new) if self.memo is not None and temperature <= 0 else None
        choices, n_prompt, n_out, how = [], 0, 0, "off"
        # greedy: the same answer n times (the memo); sampled: n draws of one stream
        for i in range(n):
            (text, finish, n_prompt, n_new), how = self._one(body, messages, max_new, temperature, memo_key, torch)
            message, finish = chat_message(text, finish)
            choices.append({"index": i, "finish_reason": finish, "message": message})
            n_out += n_new
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.name,
            "choices": choices,
            "usage": {"prompt_tokens": n_prompt, "completion_tokens": n_out, "total_tokens": n_prompt + n_out},
        }, how

    def _one(
        self,
        body: dict[str, Any],
        messages: list[dict[str, Any]],
        max_new: int,
        temperature: float,
        memo_key: bytes | None,
        torch: Any,
    ) -> tuple[tuple[str, str, int, int], str]:
        # (a memo key is only made where there is a memo)
        memo = self.memo if memo_key is not None else None
        # shared by the served names of these weights: an identical request waits, then hits
        with self.lock:
            cached = memo.get(memo_key) if memo is not None and memo_key is not None else None
            if cached is not None:
                return cached, "hit"
            cached = self._generate(body, messages, max_new, temperature, torch)
            if memo is not None and memo_key is not None:
                memo.put(memo_key, cached)
            return cached, "off" if memo_key is None else "miss"

    def _generate(
        self, body: dict[str, Any], messages: list[dict[str, Any]], max_new: int, temperature: float, torch: Any
    ) -> tuple[str, str, int, int]:
        ids = self.prompt_ids(messages, body.get("tools"), max_new)
        gen_kwargs: dict[str, Any] = {
            "max_new_tokens": max_new,
            "do_sample": temperature > 0,
            "pad_token_id": self.tokenizer.pad_token_id or self.tokenizer.eos_token_id,
        }
        if temperature > 0:
            gen_kwargs["temperature"] = temperature
            if body.get("top_p") is not None:
                gen_kwargs["top_p"] = float(body["top_p"])
        else:
            gen_kwargs.update(temperature=None, top_p=None, top_k=None)
        with torch.no_grad():
            if self.prompt_cache is not None:
                kv = self.prompt_cache.get_or_fill(self.model, ids, torch)
                if kv is not None:
                    gen_kwargs["past_key_values"] = kv
            # after the prefill: decoding draws the same stream either way
            if body.get("seed") is not None:
                torch.manual_seed(int(body["seed"]))
            input_ids = torch.tensor([ids], dtype=torch.long)
            out = self.model.generate(input_ids=input_ids, attention_mask=torch.ones_like(input_ids), **gen_kwargs)
        new = out[0, len(ids) :].tolist()
        eos = self.model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [eos]) if eos is not None else set()
        finish = "stop" if (new and new[-1] in eos_ids) or len(new) < max_new else "length"
        text = self.tokenizer.decode(new, skip_special_tokens=True)
        at = [text.find(s) for s in stop_strings(body) if s in text]
        # OpenAI's ``stop``: the text ends before the first stop string, which is not returned
        if at:
            text, finish = text[: min(at)], "stop"
        return text, finish, len(ids), len(new)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: TeacherHTTPServer

    def log_message(self, format, *args):
        if self.server.log:
            self.server.log(f"{self.address_string()} {format % args}")

    def _json(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        payload = orjson.dumps(obj)
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def _error(self, status: int, message: str, kind: str) -> None:
        self._json(status, {"error": {"message": message, "type": kind}})

    def do_GET(self):
        path = self.path.split("?")[0].rstrip("/")
        if path in ("/health", "/v1/health"):
            caches = {
                n: m.prompt_cache.stats() for n, m in sorted(self.server.models.items()) if m.prompt_cache is not None
            }
            self._json(
                200,
                {
                    "status": "ok",
                    "models": sorted(self.server.models),
                    "greedy_memo": self.server.memo.stats(),
                    "prompt_cache": caches,
                },
            )
        elif path == "/v1/models":
            self._json(
                200,
                {
                    "object": "list",
                    "data": [{"id": n, "object": "model", "owned_by": "local"} for n in sorted(self.server.models)],
                },
            )
        else:
            self._error(404, f"no route {path}", "not_found")

    def do_POST(self):
        # idle means nothing in flight: the idle exit never cuts a generation short
        with self.server.busy:
            self.server.in_flight += 1
            self.server.last_request = time.monotonic()
        try:
            self._post()
        finally:
            with self.server.busy:
                self.server.in_flight -= 1
                self.server.last_request = time.monotonic()

    def _post(self):
        path = self.path.split("?")[0].rstrip("/")
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        if path != "/v1/chat/completions":
            self._error(404, f"no route {path}", "not_found")
            return
        try:
            body = orjson.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("body must be a JSON object")
        except (orjson.JSONDecodeError, ValueError) as e:
            self._error(400, f"invalid request body: {e}", "invalid_request_error")
            return
        name = body.get("model")
        # (a model that is not a string, a list say, is not served either: it is no dict key)
        model = self.server.models.get(name) if isinstance(name, str) else None
        if model is None:
            self._error(
                404, f"model {body.get('model')!r} not served; serving {sorted(self.server.models)}", "model_not_found"
            )
            return
        refused = unsupported_params(body)
        if refused:
            self._error(400, f"not supported by this server: {', '.join(refused)}", "invalid_request_error")
            return
        try:
            resp, how = model.complete_with_memo(body)
        except ValueError as e:
            self._error(400, str(e), "invalid_request_error")
            return
        # a model failure is the server's fault: 500, retryable
        except Exception as e:
            self._error(500, f"{type(e).__name__}: {e}", "server_error")
            return
        self._json(200, resp, {"X-Composer-Memo": how})


class TeacherHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, models: dict[str, LocalModel], host: str, port: int, log: Callable[[str], None] | None = None):
        super().__init__((host, port), _Handler)
        self.models = models
        self.log = log
        # start/end of the last completion (health checks do not keep it alive)
        self.last_request = time.monotonic()
        # completion requests being answered (or waiting for their model's lock)
        self.in_flight = 0
        self.busy = threading.Lock()
        memos = {id(m.memo): m.memo for m in models.values() if m.memo is not None}
        if len(memos) > 1:
            raise ValueError("all served models must share one GreedyMemo")
        # GreedyMemo(0): off, /health still reports
        self.memo = next(iter(memos.values()), None) or GreedyMemo(0)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        if isinstance(host, bytes):
            host = host.decode()
        return f"http://{host}:{port}/v1"


def load_models(
    models: Mapping[str, str | Path],
    max_prompt_tokens: int = 1024,
    memo_size: int = MEMO_SIZE,
    prompt_cache_size: int = PROMPT_CACHE_SIZE,
) -> dict[str, LocalModel]:
    """Served name -> loaded model; names resolving to one directory share the weights, the lock and
    the (server-wide) greedy memo. ``memo_size`` 0 turns the memo off."""

    if not models:
        raise ValueError("no models to serve")
    memo = GreedyMemo(memo_size) if memo_size > 0 else None
    by_path: dict[Path, LocalModel] = {}
    out: dict[str, LocalModel] = {}
    for name, p in models.items():
        path = resolve_model(p).resolve()
        if path in by_path:
            out[name] = replace(by_path[path], name=name)  # same tokenizer, model and lock objects
        else:
            pc = PromptCache(prompt_cache_size) if prompt_cache_size > 0 else None
            out[name] = by_path[path] = LocalModel(name, path, max_prompt_tokens, memo=memo, prompt_cache=pc).load()
    return out


def make_server(
    models: Mapping[str, str | Path],
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    max_prompt_tokens: int = 1024,
    log: Callable[[str], None] | None = None,
    memo_size: int = MEMO_SIZE,
) -> TeacherHTTPServer:
    return TeacherHTTPServer(load_models(models, max_prompt_tokens, memo_size), host, port, log)


def process_alive(pid: int) -> bool:
    """The process exists and is not a zombie (an exited child its parent has not reaped yet)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


# answers in flight when the owning process went: finished first, within this
OWNER_GONE_GRACE_S = 120.0


def _watch(
    srv: TeacherHTTPServer, idle_exit_s: float | None, exit_with_pid: int | None, on_exit: Callable[[str], None] | None
) -> None:
    """Stop the server when it has been idle too long, or when the process it belongs to is gone.

    Idle counts from the end of the last completion and only while none is in flight: shutting down
    under a generation killed its handler thread inside torch at interpreter exit (the client got a
    dropped connection, the log ``terminate called without an active exception``). When the owner is
    gone, requests in flight are still answered (up to ``OWNER_GONE_GRACE_S``) before the server stops."""
    owner_gone_at: float | None = None
    while True:
        with srv.busy:
            busy = srv.in_flight
            idle = 0.0 if busy else time.monotonic() - srv.last_request
        why = None
        if idle_exit_s and idle >= idle_exit_s:
            why = f"no completion request for {idle:.0f}s (idle_exit_s {idle_exit_s:g})"
        elif exit_with_pid and not process_alive(exit_with_pid):
            owner_gone_at = owner_gone_at or time.monotonic()
            if not busy or time.monotonic() - owner_gone_at >= OWNER_GONE_GRACE_S:
                why = f"process {exit_with_pid} (exit_with_pid) is gone"
        if why:
            if on_exit:
                on_exit(f"{why}: stopping")
            srv.shutdown()
            return
        if idle_exit_s and not (exit_with_pid or busy):
            # waiting on the idle limit alone: look again about when it would be reached
            time.sleep(min(5.0, max(0.2, idle_exit_s - idle)))
        else:
            time.sleep(1.0)


def serve(
    models: Mapping[str, str | Path],
    host: str = "127.0.0.1",
    port: int = 8765,
    *,
    max_prompt_tokens: int = 1024,
    on_ready: Callable[[str], None] | None = None,
    log: Callable[[str], None] | None = None,
    idle_exit_s: float | None = None,
    exit_with_pid: int | None = None,
) -> None:
    """Load the models and serve until interrupted, until ``idle_exit_s`` pass without a completion
    request, or until process ``exit_with_pid`` exits (the Dagster resource starts it so: a server a UI
    run started goes with the code location and does not outlive its use)."""
    srv = make_server(models, host, port, max_prompt_tokens=max_prompt_tokens, log=log)
    if on_ready:
        on_ready(srv.url)
    if idle_exit_s or exit_with_pid:
        threading.Thread(
            target=_watch,
            args=(srv, idle_exit_s, exit_with_pid, lambda m: print(m, flush=True)),
            daemon=True,
            name="exit-watch",
        ).start()
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        srv.server_close()


def start_server_thread(
    models: Mapping[str, str | Path], host: str = "127.0.0.1", port: int = 0, *, max_prompt_tokens: int = 1024
) -> tuple[str, Callable[[], None]]:
    """Serve in a daemon thread; returns (base URL ending in /v1, stop function)."""
    srv = make_server(models, host, port, max_prompt_tokens=max_prompt_tokens)
    t = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True, name="teacher-server")
    t.start()

    def stop() -> None:
        srv.shutdown()
        srv.server_close()
        t.join(timeout=5)

    return srv.url, stop
