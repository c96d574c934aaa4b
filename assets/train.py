"""Training stage: ``trained_policy`` (three-channel trainer in a Pipes subprocess) -> ``policy_eval``.

``trained_policy`` launches ``composer_pipeline.train.pipes_entry`` through ``PipesSubprocessClient``
(extras: data_root, recipe, model, steps, out_dir); the subprocess streams progress, per-channel
losses and final metrics back. The checkpoint dir (safetensors + tokenizer + recipe) is uploaded to
``<store>/checkpoints/<run_id>`` when the store is ``s3://``. The asset's own output is a one-row
table (checkpoint location, base model, lineage to the training set) that ``policy_eval`` reads.
``policy_eval`` runs ``evaluate_policy`` for the new checkpoint and the starting model; a check flags
regressions. Simplified: one local process; swap the launcher for torchrun/k8s without touching this.
"""

import json
from pathlib import Path

import dagster as dg
import pyarrow as pa

from assets.metadata import counts, png_markdown
from resources.recipes import PipelineRecipes
from resources.storage import StoreResource
from resources.trainer import TrainerLauncher

GROUP = "train"


def _train_recipe_dict(path):
    import yaml

    return (yaml.safe_load(Path(path).read_text()) or {}) if path and Path(path).is_file() else {}


def base_model(recipes: PipelineRecipes) -> str:
    model = recipes.train_model or _train_recipe_dict(recipes.train).get("model")
    if not model:
        raise ValueError("no base model: set train.model in recipes/pipeline.yaml, `model:` in the train recipe, "
                         "or COMPOSER_TRAIN_MODEL")
    return str(model)


def _loss_plot(losses: dict, out: Path):
    """Per-channel loss curves (one line per channel) -> PNG path, or None without data."""
    series = {k: v for k, v in losses.items() if isinstance(v, list) and v}
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.2), dpi=100)
    for name, vals in sorted(series.items()):
        ax.plot(range(1, len(vals) + 1), vals, label=name)
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.legend(fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out


@dg.asset(
    group_name=GROUP,
    kinds={"pytorch", "safetensors"},
    description="Policy trained on the training set (GRPO + α·hint self-distillation JSD + β·DPO) in a "
    "Dagster Pipes subprocess; output is a one-row table pointing at the checkpoint.",
)
def trained_policy(
    context: dg.AssetExecutionContext,
    training_set: pa.Table,
    recipes: PipelineRecipes,
    store: StoreResource,
    trainer: TrainerLauncher,
    pipes_subprocess_client: dg.PipesSubprocessClient,
) -> dg.Output:
    if training_set.num_rows == 0:
        raise ValueError("training_set is empty: materialize the pairs of at least one session first")
    model = base_model(recipes)
    out_dir = Path(recipes.checkpoints_dir) / context.run_id
    out_dir.mkdir(parents=True, exist_ok=True)
    data_root = store.store().root
    extras = {"data_root": data_root, "recipe": recipes.train, "model": model,
              "steps": recipes.train_steps, "out_dir": str(out_dir)}
    results = trainer.run(context, extras=extras, pipes_client=pipes_subprocess_client).get_results()
    reported: dict = {}
    for r in results:
        reported.update(getattr(r, "metadata", None) or {})
    reported = {k: (v.value if hasattr(v, "value") else v) for k, v in reported.items()}

    losses_file = out_dir / "losses.json"
    losses = json.loads(losses_file.read_text()) if losses_file.is_file() else reported.get("losses") or {}
    checkpoint = str(reported.get("checkpoint") or out_dir)
    location = store.upload_dir(checkpoint, f"checkpoints/{context.run_id}") if store.store().is_remote else checkpoint
    kinds = counts(training_set.column("kind").to_pylist())
    keys = sorted(set(training_set.column("session_key").to_pylist()))
    version = context.instance.get_latest_data_version(dg.AssetKey("training_set"))  # lineage
    meta = {
        "checkpoint": dg.MetadataValue.path(location),
        "base_model": model,
        "training_rows": training_set.num_rows,
        "training_rows_by_kind": dg.MetadataValue.json(kinds),
        "training_partitions": dg.MetadataValue.json(keys),
        "training_set_data_version": str(version.value) if version else "",
        "final_metrics": dg.MetadataValue.json({k: v for k, v in reported.items() if k not in ("losses", "checkpoint")}),
    }
    png = _loss_plot(losses, out_dir / "losses.png")
    if png:
        meta["loss_curves"] = png_markdown(str(png), "Per-channel loss")
    for k, v in reported.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            meta[f"final_{k}"] = float(v)
    row = pa.table({
        "checkpoint": [location], "local_dir": [checkpoint], "base_model": [model], "run_id": [context.run_id],
        "training_rows": [training_set.num_rows], "training_partitions": [keys],
        "metrics": [json.dumps(reported, default=str)],
    })
    return dg.Output(row, metadata=meta)


@dg.asset(
    group_name=GROUP,
    kinds={"pytorch"},
    description="Held-out evaluation of the new checkpoint and of the starting model (same data, same recipe).",
    check_specs=[dg.AssetCheckSpec("no_regression", asset="policy_eval",
                                   description="The new policy's score is not worse than the base model's by more than the threshold.")],
)
def policy_eval(
    context: dg.AssetExecutionContext, trained_policy: pa.Table, recipes: PipelineRecipes, store: StoreResource
):
    from composer_pipeline.train.evaluate import evaluate_policy

    row = trained_policy.to_pylist()[0]
    data_root = store.store().root
    new = evaluate_policy(row["local_dir"], data_root, recipes.train)
    base = evaluate_policy(row["base_model"], data_root, recipes.train)
    metrics = sorted({k for k, v in {**new, **base}.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    table = pa.table({
        "metric": metrics,
        "trained": [float(new[k]) if k in new else None for k in metrics],
        "base": [float(base[k]) if k in base else None for k in metrics],
        "checkpoint": [row["checkpoint"]] * len(metrics),
        "run_id": [context.run_id] * len(metrics),
    })
    score_key = next((k for k in ("score", "reward", "accuracy", "action_match") if k in new and k in base), None)
    meta = {"dagster/row_count": table.num_rows, "checkpoint": row["checkpoint"],
            "trained": dg.MetadataValue.json(new), "base": dg.MetadataValue.json(base)}
    for k in metrics:
        if k in new:
            meta[f"trained_{k}"] = float(new[k])
    yield dg.Output(table, metadata=meta)
    if score_key is None:
        yield dg.AssetCheckResult(check_name="no_regression", passed=False, severity=dg.AssetCheckSeverity.WARN,
                                  description=f"no comparable score in eval output (keys: {sorted(new)})")
    else:
        delta = float(new[score_key]) - float(base[score_key])
        yield dg.AssetCheckResult(
            check_name="no_regression", passed=delta >= -recipes.max_eval_regression,
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"metric": score_key, "trained": float(new[score_key]), "base": float(base[score_key]),
                      "delta": delta, "allowed_regression": recipes.max_eval_regression},
        )
