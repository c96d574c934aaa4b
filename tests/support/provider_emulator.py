"""A loopback emulator of two provider protocols with their prompt-caching, window and billing rules:
OpenAI-style chat completions and Anthropic's native Messages API (tests and ``bench/bench_caching.py``).

In:  ``POST /v1/chat/completions`` and ``POST /v1/messages``; the ``model`` field picks a
     :class:`ModelRules` (protocol, window, prices, cache rules, bytes per token of its "tokenizer").
Out: answers (a ``Read`` tool call when the request offers ``Read``, else a short text) with usage as the
     provider would report it, and ``billed`` (one :class:`Bill` per answered request, priced by the
     emulator itself: what an invoice would say), ``over_window`` (requests rejected as too long),
     ``requests`` (every request: path, model, headers that matter, body).

Rules emulated (from the providers' docs, /work/shared/notes/providers.md):

* tokens: the request's JSON bytes / ``bytes_per_token`` (a stand-in tokenizer: deterministic, so prefix
  caching and window checks are exact and testable);
* window: prompt + ``max_tokens`` > ``context_window`` → 400, not billed (OpenAI-style
  ``context_length_exceeded``; Anthropic ``invalid_request_error`` "prompt is too long");
* OpenAI-style automatic caching: prompts of ≥ ``min_cached`` (1024) tokens; the hit is the longest
  cached prefix in ``step`` (128) token increments, namespaced by ``prompt_cache_key``; a prompt's
  prefixes are cached only once the request that wrote them has been answered (requests of one
  conversation in flight together all miss); entries expire ``ttl_s`` after their last use;
* Anthropic caching: only at ``cache_control`` breakpoints (more than 4 → 400 as the API does); prefix
  order tools → system → messages; at each breakpoint the longest cached prefix ending at a block
  boundary up to 20 blocks before it is read; the prefix up to each breakpoint is written when at least
  ``min_cached`` tokens long; usage ``input_tokens`` (after the last breakpoint),
  ``cache_read_input_tokens``, ``cache_creation_input_tokens``; x-api-key / anthropic-version checked;
  user/assistant alternation and every ``tool_use`` answered by a ``tool_result`` in the next user turn;
* both batch APIs (OpenAI Files + Batches, Anthropic Message Batches): see ``tests/support/batch_api.py``;
  their requests are answered by the same rules and billed at ``BatchBook.rate`` (``Bill.batch``);
* ``inject``: scripted faults consumed in order, e.g. ``(529, {})`` overloaded, ``(429, {"retry-after": "0"})``;
* ``script``: scripted answers consumed in order by answered requests, each a dict with any of ``usage`` (the
  usage reported instead of the true one: absurd, negative or overflowing counts), ``stop`` (the stop reason,
  e.g. ``length`` / ``max_tokens``), ``refusal`` (a refusal text: OpenAI ``message.refusal``, Anthropic
  ``stop_reason: refusal``);
* ``answer`` (OpenAI protocol): a function of the request body giving the answer's message fields
  (``tool_calls`` in OpenAI's shape, or ``content``) instead of the default one, or None for the default:
  scripted teachers that agree or disagree with the agent state by state, whatever order requests come in;
* current models' request rules (providers.md): ``reasoning`` (OpenAI gpt-5 / o-series: ``max_tokens`` is
  400 ``unsupported_parameter``, a temperature other than 1 is 400 ``unsupported_value``) and
  ``sampling=False`` (newer Claude models: ``temperature`` / ``top_p`` are 400 "... is deprecated for this model.").

Deliberately simplified: one cache per emulator (no routing across machines), bytes-based tokens, no
streaming, no images, no rate limits beyond ``inject``.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import Any

import orjson

from tests.support.batch_api import BatchBook, batch_get, batch_post
from tests.support.scripted_server import JsonHandler

MAX_BREAKPOINTS = 4
LOOKBACK_BLOCKS = 20


@dataclass
class ModelRules:
    protocol: str  # openai | anthropic
    context_window: int
    input_usd_per_mtok: float
    output_usd_per_mtok: float
    cached_usd_per_mtok: float
    cache_write_usd_per_mtok: float = 0.0  # anthropic
    bytes_per_token: float = 4.0
    min_cached: int = 1024
    # openai: cached tokens come in these increments
    step: int = 128
    ttl_s: float = 300.0
    # openai: max_tokens and a temperature other than 1 are refused (400)
    reasoning: bool = False
    # anthropic: False refuses temperature / top_p (400, "deprecated for this model")
    sampling: bool = True


@dataclass
class Bill:
    model: str
    prompt_tokens: int
    cached_tokens: int
    cache_write_tokens: int
    completion_tokens: int
    usd: float
    # billed through a batch (at the batch rate)
    batch: bool = False


@dataclass
class Seen:
    path: str
    model: str
    headers: dict[str, str]
    body: dict[str, Any]
    status: int = 0


def _tokens(n_bytes: int, bpt: float) -> int:
    return -(-int(n_bytes * 1000) // int(bpt * 1000))


def _strip_cc(block: Any) -> Any:
    if isinstance(block, dict) and "cache_control" in block:
        return {k: v for k, v in block.items() if k != "cache_control"}
    return block


class _Handler(JsonHandler):
    server: ProviderEmulator

    def _send(self, status: int, obj: Any, headers: dict[str, str] | None = None) -> None:
        try:
            data = orjson.dumps(obj)
        # a scripted count beyond 64 bits: JSON has no limit, orjson has
        except TypeError:
            data = json.dumps(obj).encode()
        super()._send(status, data, headers)

    def do_GET(self):
        if not batch_get(self):
            self._send(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        srv = self.server
        path = self.path.rstrip("/")
        if batch_post(self, path, raw):
            return
        try:
            body = orjson.loads(raw)
        except orjson.JSONDecodeError:
            self._send(400, {"error": {"message": "invalid JSON"}})
            return
        heads = {
            k.lower(): v
            for k, v in self.headers.items()
            if k.lower() in ("authorization", "x-api-key", "anthropic-version")
        }
        seen = Seen(path, str(body.get("model")), heads, body)
        with srv.lock:
            srv.requests.append(seen)
            fault = srv.inject.pop(0) if srv.inject else None
        rules = srv.models.get(str(body.get("model")))
        if rules is None:
            seen.status = 404
            self._send(404, {"error": {"type": "not_found_error", "message": f"model {body.get('model')!r} not found"}})
            return
        if fault is not None:
            status, headers = fault
            seen.status = status
            kind = {529: "overloaded_error", 429: "rate_limit_error"}.get(status, "api_error")
            self._send(status, {"type": "error", "error": {"type": kind, "message": f"emulated {kind}"}}, headers)
            return
        if path == "/v1/chat/completions" and rules.protocol == "openai":
            status, out = srv.openai(body, rules)
        elif path == "/v1/messages" and rules.protocol == "anthropic":
            status, out = srv.anthropic(body, rules, heads)
        else:
            status, out = 404, {"error": {"message": f"{path} does not serve {body.get('model')!r}"}}
        seen.status = status
        self._send(status, out)


class ProviderEmulator(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 256

    def __init__(
        self,
        models: dict[str, ModelRules],
        *,
        latency_s: float = 0.0,
        api_key: str | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
    ):
        super().__init__((host, port), _Handler)
        self.models, self.latency_s, self.api_key = models, latency_s, api_key
        self.lock = threading.Lock()
        self.cache: dict[str, float] = {}  # entry hash -> expiry (monotonic)
        self.billed: list[Bill] = []
        self.requests: list[Seen] = []
        # (model, prompt tokens + max_tokens) rejected as too long
        self.over_window: list[tuple[str, int]] = []
        self.inject: list[tuple[int, dict[str, str]]] = []
        # scripted answers (see the module docstring)
        self.script: list[dict[str, Any]] = []
        self.answer: Callable[[dict[str, Any]], dict[str, Any] | None] | None = None  # see the module docstring
        self._thread: threading.Thread | None = None
        self._billing = threading.local()
        # both batch APIs (tests/support/batch_api.py)
        self.batches = BatchBook()

    # -- cache
    def _lookup(self, key: str) -> bool:
        now = time.monotonic()
        with self.lock:
            exp = self.cache.get(key)
            if exp is None or exp < now:
                self.cache.pop(key, None)
                return False
            return True

    def _touch(self, keys: list[str], ttl: float) -> None:
        exp = time.monotonic() + ttl
        with self.lock:
            for k in keys:
                self.cache[k] = exp

    def _bill(self, model: str, rules: ModelRules, prompt: int, cached: int, writes: int, completion: int) -> None:
        # a batch's requests are billed at the batch rate (batch_api.py)
        rate = getattr(self._billing, "rate", 1.0)
        usd = (
            rate
            * (
                (prompt - cached - writes) * rules.input_usd_per_mtok
                + cached * rules.cached_usd_per_mtok
                + writes * rules.cache_write_usd_per_mtok
                + completion * rules.output_usd_per_mtok
            )
            / 1e6
        )
        with self.lock:
            self.billed.append(Bill(model, prompt, cached, writes, completion, usd, rate != 1.0))

    def billed_usd(self, model: str | None = None) -> float:
        with self.lock:
            return sum(b.usd for b in self.billed if model is None or b.model == model)

    # -- answers
    @staticmethod
    def _offers_read(names: list[str]) -> bool:
        return "Read" in names

    def _next_script(self) -> dict[str, Any]:
        with self.lock:
            return self.script.pop(0) if self.script else {}

    @staticmethod
    def _openai_rules(body: dict[str, Any], rules: ModelRules) -> tuple[int, dict[str, Any]] | None:
        if not rules.reasoning:
            return None
        if "max_tokens" in body:
            return 400, {
                "error": {
                    "message": "Unsupported parameter: 'max_tokens' is not supported with this model. "
                    "Use 'max_completion_tokens' instead.",
                    "type": "invalid_request_error",
                    "param": "max_tokens",
                    "code": "unsupported_parameter",
                }
            }
        if body.get("temperature", 1) != 1:
            return 400, {
                "error": {
                    "message": f"Unsupported value: 'temperature' does not support {body['temperature']} with this "
                    "model. Only the default (1) value is supported.",
                    "type": "invalid_request_error",
                    "param": "temperature",
                    "code": "unsupported_value",
                }
            }
        return None

    def openai(self, body: dict[str, Any], rules: ModelRules) -> tuple[int, dict[str, Any]]:
        refused = self._openai_rules(body, rules)
        if refused is not None:
            return refused
        msgs = body.get("messages") or []
        parts = [orjson.dumps(body.get("tools") or [])] + [orjson.dumps(m) for m in msgs]
        stream = b"".join(parts)
        prompt = _tokens(len(stream), rules.bytes_per_token)
        max_out = int(body.get("max_tokens") or body.get("max_completion_tokens") or 0)
        if prompt + max_out > rules.context_window:
            with self.lock:
                self.over_window.append((str(body.get("model")), prompt + max_out))
            return 400, {
                "error": {
                    "code": "context_length_exceeded",
                    "type": "invalid_request_error",
                    "message": f"This model's maximum context length is {rules.context_window} tokens. However, "
                    f"you requested {prompt + max_out} tokens ({prompt} in the messages, {max_out} in the completion).",
                }
            }
        ns = f"openai|{body.get('model')}|{body.get('prompt_cache_key') or ''}|".encode()
        h = hashlib.sha256(ns)
        # key of each cacheable prefix length (step increments from min_cached)
        keys: list[str] = []
        step_bytes = int(rules.step * rules.bytes_per_token)
        pos = 0
        lengths: list[int] = []
        k = rules.min_cached
        while _tokens(int(k * rules.bytes_per_token), rules.bytes_per_token) <= prompt and int(
            k * rules.bytes_per_token
        ) <= len(stream):
            end = int(k * rules.bytes_per_token)
            h.update(stream[pos:end])
            pos = end
            keys.append(h.copy().hexdigest())
            lengths.append(k)
            k += rules.step
        del step_bytes
        cached = 0
        for key, n in zip(reversed(keys), reversed(lengths)):
            if self._lookup(key):
                cached = n
                self._touch([key], rules.ttl_s)
                break
        if self.latency_s:
            time.sleep(self.latency_s)
        names = [(t.get("function") or {}).get("name") for t in body.get("tools") or []]
        message: dict[str, Any] = {"role": "assistant", "content": None}
        if self._offers_read(names):
            message["tool_calls"] = [
                {
                    "id": f"call_{len(self.requests)}",
                    "type": "function",
                    "function": {"name": "Read", "arguments": '{"file_path": "/repo/README.md"}'},
                }
            ]
        else:
            message["content"] = "Done."
        scripted = self.answer(body) if self.answer is not None else None
        if scripted is not None:
            message = {"role": "assistant", "content": None, **scripted}
        completion = 12
        # the entries exist once this request is answered
        self._touch(keys, rules.ttl_s)
        self._bill(str(body.get("model")), rules, prompt, cached, 0, completion)
        script = self._next_script()
        if script.get("refusal"):
            message = {"role": "assistant", "content": None, "refusal": script["refusal"]}
        return 200, {
            "id": f"chatcmpl-emu{len(self.requests)}",
            "object": "chat.completion",
            "model": body.get("model"),
            "choices": [
                {
                    "index": 0,
                    "finish_reason": script.get("stop") or ("tool_calls" if "tool_calls" in message else "stop"),
                    "message": message,
                }
            ],
            "usage": script.get("usage")
            or {
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "total_tokens": prompt + completion,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }

    def _anthropic_cache_read(self, bps: list[int], cum: list[int], keys: list[str], rules: ModelRules) -> int:
        """The furthest block boundary a cached prefix is read up to: each breakpoint looks back up to
        LOOKBACK_BLOCKS boundaries for a stored prefix of at least ``rules.min_cached`` tokens (0: none)."""
        read_at = 0
        for bp in bps:
            for j in range(bp, max(0, bp - LOOKBACK_BLOCKS), -1):
                if j > read_at and cum[j] >= rules.min_cached and self._lookup(keys[j]):
                    read_at = j
                    break
        return read_at

    def anthropic(self, body: dict[str, Any], rules: ModelRules, heads: dict[str, str]) -> tuple[int, dict[str, Any]]:
        def bad(msg: str) -> tuple[int, dict[str, Any]]:
            return 400, {"type": "error", "error": {"type": "invalid_request_error", "message": msg}}

        if "anthropic-version" not in heads:
            return bad("anthropic-version header is required")
        if self.api_key is not None and heads.get("x-api-key") != self.api_key:
            return 401, {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"}}
        if not isinstance(body.get("max_tokens"), int):
            return bad("max_tokens: Field required")
        for k in ("temperature", "top_p"):
            if not rules.sampling and k in body:
                return bad(f"{k} is deprecated for this model.")
        blocks, problem = _anthropic_blocks(body)
        if problem is not None:
            return bad(problem)
        n_bp = sum(1 for b in blocks if isinstance(b, dict) and "cache_control" in b)
        if n_bp > MAX_BREAKPOINTS:
            return bad(f"A maximum of {MAX_BREAKPOINTS} blocks with cache_control may be provided. Found {n_bp}.")
        # prefix hashes and token counts at every block boundary
        h = hashlib.sha256(f"anthropic|{body.get('model')}|".encode())
        cum, keys = [0], [h.hexdigest()]
        size = 0
        for b in blocks:
            data = orjson.dumps(_strip_cc(b))
            size += len(data)
            h.update(data)
            cum.append(_tokens(size, rules.bytes_per_token))
            keys.append(h.copy().hexdigest())
        prompt = cum[-1]
        if prompt + int(body["max_tokens"]) > rules.context_window:
            with self.lock:
                self.over_window.append((str(body.get("model")), prompt + int(body["max_tokens"])))
            return bad(
                f"prompt is too long: {prompt} tokens > {rules.context_window - int(body['max_tokens'])} maximum"
            )
        bps = [
            i + 1 for i, b in enumerate(blocks) if isinstance(b, dict) and "cache_control" in b
        ]  # boundary after the block
        read_at = self._anthropic_cache_read(bps, cum, keys, rules)
        if read_at:
            self._touch([keys[read_at]], rules.ttl_s)
        writable = [bp for bp in bps if cum[bp] >= rules.min_cached and bp > read_at]
        last_write = max(writable) if writable else 0
        reads = cum[read_at] if read_at else 0
        writes = cum[last_write] - reads if last_write else 0
        if self.latency_s:
            time.sleep(self.latency_s)
        names = [t.get("name") for t in body.get("tools") or []]
        if self._offers_read(names):
            content = [
                {
                    "type": "tool_use",
                    "id": f"toolu_emu{len(self.requests)}",
                    "name": "Read",
                    "input": {"file_path": "/repo/README.md"},
                }
            ]
            stop = "tool_use"
        else:
            content, stop = [{"type": "text", "text": "Done."}], "end_turn"
        completion = 12
        self._touch([keys[bp] for bp in writable], rules.ttl_s)
        self._bill(str(body.get("model")), rules, prompt, reads, writes, completion)
        script = self._next_script()
        if script.get("refusal"):
            content, stop = [{"type": "text", "text": script["refusal"]}], "refusal"
        return 200, {
            "id": f"msg_emu{len(self.requests)}",
            "type": "message",
            "role": "assistant",
            "model": body.get("model"),
            "content": content,
            "stop_reason": script.get("stop") or stop,
            "usage": script.get("usage")
            or {
                "input_tokens": prompt - reads - writes,
                "output_tokens": completion,
                "cache_read_input_tokens": reads,
                "cache_creation_input_tokens": writes,
            },
        }

    # -- lifecycle
    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host}:{port}/v1"

    def start(self) -> ProviderEmulator:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.shutdown()
        self.server_close()


def _anthropic_blocks(body: dict[str, Any]) -> tuple[list[Any], str | None]:
    """The request's blocks in prompt order (tools, system, each message's content) and the first problem
    the Messages API would refuse (roles not alternating, empty content, a tool_use left unanswered)."""
    blocks: list[Any] = list(body.get("tools") or [])
    system = body.get("system") or []
    blocks += [{"type": "text", "text": system}] if isinstance(system, str) else list(system)
    expect: set[str] = set()
    for i, m in enumerate(body.get("messages") or []):
        role = m.get("role")
        if role != ("user" if i % 2 == 0 else "assistant"):
            return (
                blocks,
                f"messages: roles must alternate between user and assistant, starting with user (message {i})",
            )
        content = m.get("content")
        content = [{"type": "text", "text": content}] if isinstance(content, str) else list(content or [])
        if not content:
            return blocks, f"messages.{i}: content must not be empty"
        got = {b.get("tool_use_id") for b in content if b.get("type") == "tool_result"}
        if role == "user" and expect - got:
            return (
                blocks,
                f"messages.{i}: tool_use ids without a tool_result block right after them: {sorted(expect - got)}",
            )
        expect = {b.get("id") for b in content if b.get("type") == "tool_use"} if role == "assistant" else set()
        blocks += content
    return blocks, None
