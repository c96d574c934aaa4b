"""Where a demo teacher answer's CPU time goes: SmolLM2-135M-Instruct, a prompt of the demo's average
length (450 tokens), 48 sampled new tokens (temperature 0.3, as recipes/demo_teachers.yaml), one
thread. Prints, per repetition, ``generate`` vs the bare forward passes it amounts to (a prefill plus
47 one-token steps over the KV cache) vs the prefill alone, all in process CPU seconds.

    OMP_NUM_THREADS=1 .venv/bin/python bench/profile_demo_generation.py [--reps 2]
"""

from __future__ import annotations

import argparse
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--prompt-tokens", type=int, default=450)
    ap.add_argument("--new-tokens", type=int, default=48)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from composer_pipeline.models import resolve_model

    path = resolve_model("smollm2-135m-instruct")
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    torch.manual_seed(0)
    ids = torch.randint(100, 40000, (1, args.prompt_tokens))
    n, new = args.prompt_tokens, args.new_tokens

    def generate():
        torch.manual_seed(1)
        with torch.no_grad():
            return model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=new,
                min_new_tokens=new,
                do_sample=True,
                temperature=0.3,
                pad_token_id=tok.eos_token_id,
            )

    generate()  # warm-up
    for _ in range(args.reps):
        t = time.process_time()
        out = generate()
        t_gen = time.process_time() - t
        t = time.process_time()
        with torch.no_grad():
            kv = model(input_ids=ids, use_cache=True).past_key_values
            for i in range(new - 1):
                kv = model(input_ids=out[:, n + i : n + i + 1], past_key_values=kv, use_cache=True).past_key_values
        t_fwd = time.process_time() - t
        t = time.process_time()
        with torch.no_grad():
            model(input_ids=ids, use_cache=True)
        t_pre = time.process_time() - t
        print(
            f"generate {t_gen:.2f} s | prefill + {new - 1} one-token forwards {t_fwd:.2f} s | prefill alone {t_pre:.2f} s"
        )


if __name__ == "__main__":
    main()
