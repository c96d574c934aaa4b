"""Codex rollout ingest (the Python-only reader, ingest/codex.py) vs Claude Code ingest: MB per CPU-second.

Two corpora of about the same size in /tmp:
  * claude: copies of the real Claude Code sessions (``COMPOSER_REAL_TRACES``, default ../shared/traces)
    with rewritten uuids (``bench_ingest.generate``);
  * codex: generated rollouts in the current ``{timestamp, type, payload}`` form, shaped like real ones:
    per turn a user message (+ its ``user_message`` event), a ``turn_context``, then steps of reasoning
    (encrypted content), ``exec_command`` / ``shell`` calls with JSON-string arguments, outputs of
    0.2-16 KB (plain text with exit codes, or JSON strings with ``metadata.exit_code``), ``apply_patch``
    custom calls, ``token_count`` and ``agent_message`` events; a few keys planted in arguments/outputs.
For each, interleaved and repeated: the floor (read every file, ``orjson.loads`` every line) and the
whole ``composer-pipeline ingest`` process (child CPU, interpreter start included). Prints JSON.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_codex_ingest.py [--mb 40] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
os.environ.setdefault("COMPOSER_REAL_TRACES", str(REPO.parent / "shared" / "traces"))
sys.path.insert(0, str(REPO / "bench"))

from bench_ingest import generate  # noqa: E402  (reads COMPOSER_REAL_TRACES at import)

WORDS = "the a fix test file read run check update import module function error value config path build".split()


def _text(rng: random.Random, n: int) -> str:
    out, size = [], 0
    while size < n:
        line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 14)))
        out.append(line)
        size += len(line) + 1
    return "\n".join(out)


def rollout(rng: random.Random, sid: str, turns: int) -> str:
    lines = []
    t = 0

    def add(kind, payload):
        nonlocal t
        t += 1
        lines.append(
            json.dumps(
                {"timestamp": f"2026-03-04T08:{t // 60 % 60:02d}:{t % 60:02d}.000Z", "type": kind, "payload": payload}
            )
        )

    add(
        "session_meta",
        {
            "id": sid,
            "timestamp": "2026-03-04T08:00:00Z",
            "cwd": "/home/dev/app",
            "originator": "codex_cli_rs",
            "cli_version": "0.118.0",
            "base_instructions": {"text": _text(rng, 3000)},
            "git": {"commit_hash": "abc", "branch": "main", "repository_url": "https://github.com/acme/app.git"},
        },
    )
    for turn in range(turns):
        ask = _text(rng, rng.randint(60, 600))
        add("turn_context", {"cwd": "/home/dev/app", "approval_policy": "never", "model": "gpt-5.2-codex"})
        add("response_item", {"type": "message", "role": "user", "content": [{"type": "input_text", "text": ask}]})
        add("event_msg", {"type": "user_message", "message": ask, "images": []})
        for step in range(rng.randint(2, 8)):
            add(
                "response_item",
                {
                    "type": "reasoning",
                    "summary": [{"type": "summary_text", "text": _text(rng, 80)}],
                    "encrypted_content": "gAAAA"
                    + "".join(rng.choice("ABCDEFGHabcdefgh0123456789") for _ in range(rng.randint(800, 3000))),
                },
            )
            cid = f"call_{turn}_{step}"
            if rng.random() < 0.2:
                add(
                    "response_item",
                    {
                        "type": "custom_tool_call",
                        "status": "completed",
                        "call_id": cid,
                        "name": "apply_patch",
                        "input": "*** Begin Patch\n*** Update File: src/app.py\n"
                        + _text(rng, rng.randint(200, 2000))
                        + "\n*** End Patch\n",
                    },
                )
                add(
                    "response_item",
                    {
                        "type": "custom_tool_call_output",
                        "call_id": cid,
                        "output": json.dumps(
                            {
                                "output": "Success. Updated the following files:\nM src/app.py",
                                "metadata": {"exit_code": 0},
                            }
                        ),
                    },
                )
                continue
            cmd = " ".join(rng.choice(WORDS) for _ in range(5))
            if rng.random() < 0.03:
                cmd += " --token sk-ant-api03-" + "".join(rng.choice("abcdefXYZ0123") for _ in range(40))
            out = _text(rng, int(rng.choice([200, 800, 2000, 6000, 16000]) * rng.uniform(0.5, 1.5)))
            code = 0 if rng.random() < 0.8 else 1
            if rng.random() < 0.5:
                add(
                    "response_item",
                    {
                        "type": "function_call",
                        "name": "exec_command",
                        "arguments": json.dumps({"cmd": cmd, "workdir": "/home/dev/app"}),
                        "call_id": cid,
                    },
                )
                add(
                    "response_item",
                    {
                        "type": "function_call_output",
                        "call_id": cid,
                        "output": f"Chunk ID: 1a2b\nWall time: 0.3 seconds\nProcess exited with code {code}\nOriginal token count: 99\nOutput:\n{out}",
                    },
                )
            else:
                add(
                    "response_item",
                    {
                        "type": "function_call",
                        "name": "shell",
                        "arguments": json.dumps({"command": ["bash", "-lc", cmd]}),
                        "call_id": cid,
                    },
                )
                add(
                    "response_item",
                    {
                        "type": "function_call_output",
                        "call_id": cid,
                        "output": json.dumps({"output": out, "metadata": {"exit_code": code, "duration_seconds": 0.3}}),
                    },
                )
            add(
                "event_msg",
                {
                    "type": "token_count",
                    "info": {"last_token_usage": {"input_tokens": rng.randint(1000, 90000), "output_tokens": 80}},
                },
            )
        answer = _text(rng, rng.randint(100, 1200))
        add(
            "response_item",
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": answer}]},
        )
        add("event_msg", {"type": "agent_message", "message": answer})
    return "\n".join(lines) + "\n"


def generate_codex(corpus: Path, target_mb: float, seed: int = 0) -> tuple[int, int]:
    rng = random.Random(seed)
    if corpus.exists():
        shutil.rmtree(corpus)
    total = files = 0
    while total < target_mb * 1e6:
        sid = f"019a{files:04x}-0000-7000-8000-{rng.getrandbits(48):012x}"
        day = corpus / "2026" / "03" / f"{files % 28 + 1:02d}"
        day.mkdir(parents=True, exist_ok=True)
        data = rollout(rng, sid, rng.randint(2, 10)).encode()
        (day / f"rollout-2026-03-04T08-00-00-{sid}.jsonl").write_bytes(data)
        total += len(data)
        files += 1
    return files, total


def floor(corpus: Path) -> float:
    import orjson

    t = time.process_time()
    for p in corpus.rglob("*.jsonl"):
        for line in p.read_bytes().split(b"\n"):
            if line:
                orjson.loads(line)
    return time.process_time() - t


def ingest(corpus: Path, out: Path) -> tuple[float, dict]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    p = subprocess.run(
        [sys.executable, "-m", "composer_pipeline", "ingest", str(corpus), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, json.loads(p.stdout.splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=40)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--tmp", default="/tmp/bench_codex_ingest")
    args = ap.parse_args()
    tmp = Path(args.tmp)
    corpora = {"claude": tmp / "claude", "codex": tmp / "codex"}
    sizes = {"claude": generate(corpora["claude"], args.mb)[1], "codex": generate_codex(corpora["codex"], args.mb)[1]}
    runs: dict[str, list[dict]] = {k: [] for k in corpora}
    # interleaved: the two corpora see the same machine load
    for _ in range(args.repeat):
        for kind, corpus in corpora.items():
            f = floor(corpus)
            cpu, total = ingest(corpus, tmp / f"out_{kind}")
            mb = sizes[kind] / 1e6
            runs[kind].append(
                {
                    "floor_mb_per_cpu_s": mb / f,
                    "ingest_mb_per_cpu_s": mb / cpu,
                    "ingest_cpu_s": cpu,
                    "states": total["states"],
                    "secrets": sum(total["secrets_scrubbed"].values()),
                }
            )
    result = {"mb": {k: round(v / 1e6, 1) for k, v in sizes.items()}}
    for kind, rs in runs.items():
        result[kind] = {k: round(statistics.median(r[k] for r in rs), 3) for k in rs[0]}
        result[kind]["ingest_range"] = [
            round(min(r["ingest_mb_per_cpu_s"] for r in rs), 1),
            round(max(r["ingest_mb_per_cpu_s"] for r in rs), 1),
        ]
    result["codex_vs_claude"] = round(
        result["codex"]["ingest_mb_per_cpu_s"] / result["claude"]["ingest_mb_per_cpu_s"], 3
    )
    print(json.dumps(result, indent=1))
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
