"""Demo teacher cost: the old "one model under two greedy names" vs two samples of one model.

The demo used to serve SmolLM2 under two greedy teacher names (one generation per state, the second
name answered from the greedy memo) and called that consensus. It now samples SmolLM2 twice (two
seeds, temperature 0.3): honest self-consistency, at the price of a second generation per state. The
server reuses the prompt's prefill for the second sample (``PromptCache``). For N demo states, side by
side in one process (interleaved per state, so machine load hits all three alike), this measures the
CPU seconds per state of

* ``greedy_twice``: 2 greedy requests, memo on (the old demo);
* ``two_samples``: 2 sampled requests (seeds 1, 2), prompt cache on (the new demo);
* ``two_samples_no_prefill_reuse``: the same without the prompt cache.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_demo_teachers.py [--states 6]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def demo_prompts(n: int) -> list[tuple[list[dict], list[dict]]]:
    from composer_pipeline.render import Conversation, RenderOptions, render_state
    from composer_pipeline.store import Store

    out = Path(tempfile.mkdtemp(prefix="bench-demo-"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "composer_pipeline",
            "ingest",
            str(REPO / "composer_pipeline" / "samples" / "projects"),
            "--out",
            str(out),
        ],
        check=True,
        capture_output=True,
    )
    st = Store(str(out))
    conv = Conversation.from_table(st.read_table("trace_messages"))
    states = st.read_table("trace_states").to_pylist()
    step = max(1, len(states) // n)
    picked = states[::step][:n]
    return [(r.messages, r.tools) for r in (render_state(conv, s, RenderOptions()) for s in picked)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--states", type=int, default=6)
    ap.add_argument("--max-tokens", type=int, default=48)
    args = ap.parse_args()
    import torch

    from composer_pipeline.teachers.server import load_models

    torch.set_num_threads(1)
    # one copy of the weights per configuration, so no configuration reuses another's prefill or memo
    old = load_models({"m": "smollm2-135m-instruct"}, prompt_cache_size=0)["m"]  # the old server: memo only
    with_cache = load_models({"m": "smollm2-135m-instruct"}, memo_size=0)["m"]
    plain = load_models({"m": "smollm2-135m-instruct"}, memo_size=0, prompt_cache_size=0)["m"]
    prompts = demo_prompts(args.states)

    def body(messages, tools, **params):
        b = {"model": "m", "messages": messages, "max_tokens": args.max_tokens, **params}
        if tools:
            b["tools"] = tools
        return b

    def greedy_twice(msgs, tools):
        for _ in range(2):
            old.complete(body(msgs, tools, temperature=0.0))

    def two_samples(msgs, tools):
        for seed in (1, 2):
            with_cache.complete(body(msgs, tools, temperature=0.3, seed=seed))

    def two_samples_plain(msgs, tools):
        for seed in (1, 2):
            plain.complete(body(msgs, tools, temperature=0.3, seed=seed))

    runs = {"greedy_twice": greedy_twice, "two_samples": two_samples, "two_samples_no_prefill_reuse": two_samples_plain}
    cpu = {k: 0.0 for k in runs}
    wall = {k: 0.0 for k in runs}
    order = list(runs)
    for i, (msgs, tools) in enumerate(prompts):
        for name in order[i % 3 :] + order[: i % 3]:  # rotate who goes first
            c0, w0 = time.process_time(), time.perf_counter()
            runs[name](msgs, tools)
            cpu[name] += time.process_time() - c0
            wall[name] += time.perf_counter() - w0
    n = len(prompts)
    res = {
        k: {
            "cpu_s_per_state": round(cpu[k] / n, 3),
            "wall_s_per_state": round(wall[k] / n, 3),
            "cpu_ratio_to_greedy_twice": round(cpu[k] / cpu["greedy_twice"], 3),
        }
        for k in runs
    }
    print(
        json.dumps(
            {
                "states": n,
                "max_tokens": args.max_tokens,
                "results": res,
                "prompt_cache": with_cache.prompt_cache.stats(),
                "greedy_memo": old.memo.stats(),
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
