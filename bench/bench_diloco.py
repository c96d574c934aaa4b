"""DiLoCo replica groups vs DDP vs one process on the tiny model: bytes exchanged per optimizer step and
held-out loss after the same number of samples.

    OMP_NUM_THREADS=1 .venv/bin/python bench/bench_diloco.py [--steps 16] [--inner-steps 4] [--rows 48]

Three runs of the three-channel trainer on one synthetic store (``tests/support/synthetic_train.py``),
same recipe, same samples seen in all (``--steps`` optimizer steps × a global batch of 2 prompts × 4
rollouts + 2 DPO pairs):

* **one process** (``python -m composer_pipeline.train.pipes_entry``);
* **DDP**, 2 gloo ranks (``torchrun --nproc-per-node=2``, the trainer launcher's command), each rank half
  the global batch;
* **DiLoCo**, 2 replica groups (``composer-pipeline train`` with ``diloco.replica_groups: 2``), each group
  1 prompt × 4 rollouts + 1 pair per step on its own shard, syncing every H = ``--inner-steps`` steps,
  outer Nesterov SGD lr 0.7 / momentum 0.9 (the paper's defaults).

Bytes per optimizer step: DiLoCo's are counted where torchft's Manager hands each pseudo-gradient to the
process group (``allreduce_bytes`` in the step log, divided by the inner steps); DDP's are counted by a
comm hook on a ``DistributedDataParallel`` of the same model over 2 gloo ranks (the buckets it
all-reduces per backward; TRL/accelerate wrap the policy in the same DDP). Both are payload bytes per
replica; a ring all-reduce moves about 2(N−1)/N of that over each link, for either.

Held-out loss: on the store's held-out pairs (``data.heldout_fraction``), the DPO loss against the
starting model (``composer_pipeline.train.losses.dpo_sigmoid_loss``, β from the recipe) and the NLL of
the chosen answers, for each final checkpoint and for the start.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _run(cmd: list[str], what: str) -> float:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    env.pop("DAGSTER_PIPES_CONTEXT", None)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode:
        raise RuntimeError(f"{what} failed:\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def _ddp_bytes_per_step(model_dir: Path) -> int:
    """Bytes one rank hands to gloo per backward under torch DDP (2 ranks, a comm hook counts them)."""
    script = f"""
import os, json, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from transformers import AutoModelForCausalLM
dist.init_process_group("gloo")
model = DDP(AutoModelForCausalLM.from_pretrained({str(model_dir)!r}).float())
sent = []
def hook(state, bucket):
    sent.append(bucket.buffer().numel() * bucket.buffer().element_size())
    fut = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
    return fut.then(lambda f: f.value()[0] / dist.get_world_size())
model.register_comm_hook(None, hook)
ids = torch.randint(0, model.module.config.vocab_size, (2, 16))
for step in range(2):
    sent.clear()
    model(input_ids=ids, labels=ids).loss.backward()
if dist.get_rank() == 0:
    print(json.dumps({{"bytes": sum(sent)}}))
dist.destroy_process_group()
"""
    from resources.trainer import torchrun_command

    cmd = torchrun_command(2, python=sys.executable, extra=["--standalone"])[:-2]  # a script, not the entry
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(script)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([*cmd, f.name], capture_output=True, text=True, env=env, timeout=300)
    os.unlink(f.name)
    if proc.returncode:
        raise RuntimeError(proc.stderr[-3000:])
    return json.loads([x for x in proc.stdout.splitlines() if x.startswith("{")][-1])["bytes"]


def _heldout_losses(checkpoint: Path, start: Path, data_root: str, recipe) -> dict:
    import torch

    from composer_pipeline.train.data import dpo_batches_from, load_train_data
    from composer_pipeline.train.losses import chosen_nll, completion_token_logps, dpo_sigmoid_loss
    from composer_pipeline.train.modeling import load_policy

    data = load_train_data(data_root, heldout_fraction=recipe.data.heldout_fraction, hints=recipe.sdpo.hint)
    tok, policy = load_policy(str(checkpoint))
    _, ref = load_policy(str(start))
    dpo, nll, n = 0.0, 0.0, 0
    with torch.no_grad():
        for b in dpo_batches_from(tok, data.heldout_pairs, recipe):
            args = (b["prompt_ids"], b["prompt_mask"], b["completion_ids"], b["completion_mask"])
            k = b["prompt_ids"].size(0) // 2
            pol, rf = completion_token_logps(policy.eval(), *args), completion_token_logps(ref.eval(), *args)
            loss, _ = dpo_sigmoid_loss(
                pol[:k].sum(-1), pol[k:].sum(-1), rf[:k].sum(-1), rf[k:].sum(-1), beta=recipe.dpo.beta
            )
            dpo += float(loss) * k
            nll += float(chosen_nll(pol[:k], b["completion_mask"][:k])) * k
            n += k
    return {"heldout_pairs": n, "heldout_dpo_loss": dpo / n, "heldout_chosen_nll": nll / n}


def main() -> int:
    import yaml
    from safetensors.torch import load_file

    from composer_pipeline.tiny_model import build_tiny_model
    from composer_pipeline.train.config import TrainRecipe
    from resources.trainer import torchrun_command
    from tests.support.synthetic_train import write_store

    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--inner-steps", type=int, default=4)
    ap.add_argument("--rows", type=int, default=48)
    ap.add_argument("--workdir", type=Path, default=None)
    a = ap.parse_args()
    root = a.workdir or Path(tempfile.mkdtemp(prefix="bench-diloco-"))
    root.mkdir(parents=True, exist_ok=True)
    model_dir = root / "tiny"
    if not (model_dir / "config.json").exists():
        build_tiny_model(model_dir)
    data = write_store(root / "data", a.rows)

    base = yaml.safe_load((Path(__file__).resolve().parent.parent / "recipes" / "train.yaml").read_text())
    base["model"] = str(model_dir)
    base["optim"].update(steps=a.steps, learning_rate=1e-3)
    base["grpo"]["max_completion_length"] = 16
    # the DPO channel as bench/RESULTS.md's DiLoCo numbers were measured (before the shipped default
    # became dpop over the first differing token + NLL, pairs shuffled)
    base["dpo"].update(variant="dpo", preference_tokens="all", sft_weight=0.0, data_order="table")
    (root / "one.yaml").write_text(yaml.safe_dump(base))
    groups = json.loads(json.dumps(base))
    # per group: half the global batch, as a DDP rank has
    groups["grpo"]["prompts_per_step"] = 1
    groups["dpo"]["batch_size"] = 1
    groups["diloco"].update(replica_groups=2, inner_steps=a.inner_steps)
    (root / "diloco.yaml").write_text(yaml.safe_dump(groups))

    entry = [sys.executable, "-m", "composer_pipeline.train.pipes_entry", "--data-root", data]
    runs = {
        "one process": (entry + ["--recipe", str(root / "one.yaml"), "--out-dir", str(root / "one")], root / "one"),
        "DDP, 2 ranks": (
            torchrun_command(2, python=sys.executable, extra=["--standalone"])
            + ["--data-root", data, "--recipe", str(root / "one.yaml")]
            + ["--out-dir", str(root / "ddp")],
            root / "ddp",
        ),
        f"DiLoCo, 2 groups, H={a.inner_steps}": (
            [sys.executable, "-m", "composer_pipeline", "train", "--data", data, "--recipe", str(root / "diloco.yaml")]
            + ["--out", str(root / "diloco")],
            root / "diloco",
        ),
    }
    recipe = TrainRecipe.load(root / "one.yaml")
    weights = load_file(str(model_dir / "model.safetensors"))
    n_bytes = sum(t.numel() * t.element_size() for t in weights.values())
    ddp_bytes = _ddp_bytes_per_step(model_dir)
    rows = [{"run": "start (no training)", **_heldout_losses(model_dir, model_dir, data, recipe)}]
    for name, (cmd, out) in runs.items():
        wall = _run(cmd, name)
        metrics = json.loads((out / "checkpoint" / "metrics.json").read_text())
        row = {"run": name, "wall_s": round(wall, 1), **_heldout_losses(out / "checkpoint", model_dir, data, recipe)}
        if name.startswith("DiLoCo"):
            dl = metrics["diloco"]
            steps = [json.loads(x) for x in (out / "steps.jsonl").read_text().splitlines()]
            inner = max(r["step"] for r in steps)
            row["bytes_per_step"] = round(max(dl["allreduce_bytes"].values()) / inner)
            row["outer_steps"] = dl["outer_steps"]
        elif name.startswith("DDP"):
            row["bytes_per_step"] = ddp_bytes
        else:
            row["bytes_per_step"] = 0
        rows.append(row)
    print(json.dumps({"params_bytes": n_bytes, "steps": a.steps, "rows": rows}, indent=1))
    print()
    print(
        "| run | bytes all-reduced per optimizer step (per replica) | vs DDP | held-out DPO loss | held-out chosen NLL | wall s |"
    )
    print("|---|---|---|---|---|---|")
    for r in rows:
        b = r.get("bytes_per_step")
        ratio = f"{b / ddp_bytes:.3f}" if b is not None else "–"
        print(
            f"| {r['run']} | {b if b is not None else '–'} | {ratio} | {r['heldout_dpo_loss']:.4f} | "
            f"{r['heldout_chosen_nll']:.4f} | {r.get('wall_s', '–')} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
