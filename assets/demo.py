"""``composer-pipeline demo``: the whole chain through Dagster on a persistent local instance.

In: a trace root (default: the bundled sample sessions), a store dir, the demo teachers recipe
(recipes/demo_teachers.yaml: two sampled entries of SmolLM2, i.e. self-consistency, plus a sampled
random-init tiny model as a second, dissenting model, behind ``composer-pipeline teachers serve`` on 127.0.0.1, started on demand by the teachers
resource), trainer steps. Out: every table under the store, a checkpoint, eval metrics, runs
recorded in ``<repo>/.dagster_home`` so ``dagster dev -w workspace.yaml`` shows them, and a printed
report (rows per table, per-teacher answers and spend, pair agreement, how many steps each trainer
channel fired, checkpoint, eval, next commands with a real pair id).

Per session: the ``session_chain`` job (ingest -> cost_plan + blocking budget check -> replay ->
pairs -> normalized pairs); then ``nightly_training`` (training_set -> trained_policy -> policy_eval).
Simplified: sessions run one after another in-process (2 cores; the teacher server is the
bottleneck); a failed session is reported and the others go on.
"""

import argparse
import json
import logging
import os
import shutil
import sys
import time
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path

import dagster as dg

from assets.definitions import build_defs
from assets.partitions import SESSIONS, session_keymap
from assets.sensors import scan_sessions
from assets.settings import REPO_ROOT, load_settings
from composer_pipeline.cli import CLEAR_ERRORS, report_error
from composer_pipeline.cli.demo import add_arguments
from composer_pipeline.pairs.build import agreement_label
from composer_pipeline.store import Store
from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.evaluate import measured, smoke_line

DAGSTER_HOME = REPO_ROOT / ".dagster_home"
SAMPLES = REPO_ROOT / "composer_pipeline" / "samples" / "projects"
DEMO_TEACHERS = REPO_ROOT / "recipes" / "demo_teachers.yaml"
DAGSTER_YAML = """\
# Written by `composer-pipeline demo`. Local instance shared by the demo and `dagster dev`.
# Small machine: at most 2 runs at once; the `teachers` pool lets one replay talk to the
# (local or paid) teachers at a time.
concurrency:
  runs:
    max_concurrent_runs: 2
  pools:
    default_limit: 1
telemetry:
  enabled: false
"""
LOG_CONFIG = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}


@dataclass
class DemoReport:
    store: str
    sessions: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    checkpoint: str | None = None
    eval_metrics: dict[str, dict] = field(default_factory=dict)
    row_counts: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    dagster_home: str = str(DAGSTER_HOME)
    # env the UI needs to see the same sessions, store and teachers
    ui_env: str = ""
    teachers_recipe: str = ""
    teachers: dict[str, dict] = field(default_factory=dict)  # name -> answered, other, cached, spend
    # a normalized pair id for the `lineage` / `show` hints
    example_pair: str | None = None
    # "self_consistency: 2 of 2 samples ..." -> pairs
    agreement: dict[str, int] = field(default_factory=dict)
    # steps, seconds, data counts, steps each channel fired
    train: dict = field(default_factory=dict)
    # engine (or "python: <why>") -> sessions
    ingest_engines: dict[str, int] = field(default_factory=dict)
    # the train recipe's eval.min_rows_to_measure (below it the eval measured nothing)
    min_rows_to_measure: int = 30


def ensure_dagster_home(home: Path = DAGSTER_HOME) -> Path:
    home.mkdir(parents=True, exist_ok=True)
    cfg = home / "dagster.yaml"
    if not cfg.exists():
        cfg.write_text(DAGSTER_YAML)
    os.environ["DAGSTER_HOME"] = str(home)
    return home


def _first_failure(result) -> str:
    for ev in result.all_events:
        if ev.is_step_failure or ev.event_type_value == "RUN_FAILURE":
            data = ev.event_specific_data
            err = getattr(data, "error", None) or getattr(data, "error_info", None)
            while err is not None and getattr(err, "cause", None) is not None:  # the user code's own error
                err = err.cause
            return (err.message.strip().splitlines() or ["?"])[-1] if err else ev.message or "failed"
    failed_checks = [e.check_name for e in result.get_asset_check_evaluations() if not e.passed]
    return f"blocking checks failed: {failed_checks}" if failed_checks else "failed"


def _stop_started_servers(before: set[Path], state_dir: Path, echo) -> None:
    for pid_file in sorted(set(state_dir.glob("teacher_server-*.pid")) - before):
        try:
            pid = int(pid_file.read_text())
            os.kill(pid, 15)
            echo(f"stopped the local teacher server it started (pid {pid})")
        except (ValueError, ProcessLookupError):
            pass
        pid_file.unlink(missing_ok=True)


def run_demo(
    trace_root=None,
    store=None,
    steps=None,
    skip_train=False,
    teachers=None,
    keep_teachers=False,
    echo=print,
    dagster_home: Path = DAGSTER_HOME,
) -> DemoReport:
    t0 = time.monotonic()
    warnings.filterwarnings("ignore", message=".*is currently in preview.*")  # partitioned asset checks
    # instance migrations and per-request lines drown the progress
    for noisy in ("alembic", "httpx"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    ensure_dagster_home(Path(dagster_home))
    # per-file "Loading weights"/"Writing model shards" bars of the teacher server and the trainer
    # subprocess (both inherit this env) drown the progress; the user's own setting wins
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    from tqdm import tqdm

    settings = load_settings()
    teachers_recipe = str(Path(teachers or DEMO_TEACHERS).resolve())
    settings = replace(
        settings,
        trace_roots=[str(Path(trace_root or SAMPLES).expanduser().resolve())],
        store_root=str(store)
        if store and "://" in str(store)
        else str(Path(store or settings.store_root).expanduser().resolve()),
        recipes={**settings.recipes, "teachers": teachers_recipe},
        train=replace(settings.train, steps=steps if steps is not None else settings.train.steps),
    )
    defs = build_defs(settings)
    instance = dg.DagsterInstance.get()
    (root,) = settings.trace_roots
    sessions = scan_sessions(root)
    if not sessions:
        raise FileNotFoundError(f"no Claude Code sessions under {root}")
    keymap = session_keymap(instance, sessions)
    # short, readable partition keys (project/id) for sessions without one
    added = keymap.assign()
    if added:
        instance.add_dynamic_partitions(SESSIONS, sorted(added.values()))
    keys = sorted(keymap.partition_of[k] for k in sessions)
    echo(f"{len(keys)} sessions under {root}; store {settings.store_root}; DAGSTER_HOME {dagster_home}")

    report = DemoReport(store=settings.store_root, sessions=keys, dagster_home=str(dagster_home))
    report.ui_env = " ".join(
        [
            f"DAGSTER_HOME={dagster_home}",
            f"COMPOSER_TRACE_ROOT={root}",
            f"COMPOSER_STORE={settings.store_root}",
            f"COMPOSER_TEACHERS_RECIPE={teachers_recipe}",
        ]
    )
    state_dir = Path(settings.cache_dir).resolve().parent
    servers_before = set(state_dir.glob("teacher_server-*.pid"))
    chain = defs.resolve_job_def("session_chain")
    try:
        for key in tqdm(keys, desc="sessions", unit="session"):
            res = chain.execute_in_process(
                partition_key=key,
                instance=instance,
                run_config=LOG_CONFIG,
                raise_on_error=False,
                tags={"composer/demo": "1"},
            )
            if not res.success:
                report.failed[key] = _first_failure(res)
                echo(f"session {key}: FAILED ({report.failed[key]})")
            for ev in res.get_asset_materialization_events():  # which ingest engine read the session
                if ev.asset_key == dg.AssetKey("trace_states"):
                    meta = ev.materialization.metadata
                    engine = str(meta["ingest_engine"].value) if "ingest_engine" in meta else "?"
                    if "python_fallback_reason" in meta:
                        engine = f"{engine} ({meta['python_fallback_reason'].value})"
                    report.ingest_engines[engine] = report.ingest_engines.get(engine, 0) + 1
    finally:
        if not keep_teachers:
            _stop_started_servers(servers_before, state_dir, echo)

    training = defs.resolve_job_def("nightly_training")
    selection = [dg.AssetKey("training_set")] if skip_train else None
    echo("training_set" + ("" if skip_train else " -> trained_policy -> policy_eval") + " ...")
    res = training.execute_in_process(
        instance=instance,
        run_config=LOG_CONFIG,
        raise_on_error=False,
        asset_selection=selection,
        tags={"composer/demo": "1"},
    )
    if not res.success:
        report.failed["nightly_training"] = _first_failure(res)
        echo(f"training: FAILED ({report.failed['nightly_training']})")

    st = Store(settings.store_root)
    for name in st.table_names():
        report.row_counts[name] = st.read_table(name).num_rows
    report.teachers_recipe = teachers_recipe
    _summarize_tables(st, report)
    if not skip_train and res.success:
        tp = res.output_for_node("trained_policy").to_pylist()[0]
        report.checkpoint = tp["checkpoint"]
        report.train = _train_summary(tp)
        ev = res.output_for_node("policy_eval").to_pylist()

        train_recipe = settings.recipe("train")
        report.min_rows_to_measure = (
            TrainRecipe.load(train_recipe) if train_recipe else TrainRecipe.from_dict({})
        ).eval.min_rows_to_measure
        report.eval_metrics = {r["metric"]: {"trained": r["trained"], "base": r["base"], "n": r["n"]} for r in ev}
    report.seconds = time.monotonic() - t0
    return report


def _summarize_tables(st, report: DemoReport) -> None:
    """Per-teacher answers/spend and the pairs' agreement counts, for the printed report."""
    names = set(report.row_counts)
    if "teacher_replays" in names:
        for r in st.read_table("teacher_replays", ["teacher", "status", "cache_hit", "paid_usd"]).to_pylist():
            t = report.teachers.setdefault(r["teacher"], {"answered": 0, "other": 0, "cached": 0, "spend": 0.0})
            t["answered" if r["status"] == "answered" else "other"] += 1
            t["cached"] += bool(r["cache_hit"])
            t["spend"] += r["paid_usd"] or 0.0
    if report.row_counts.get("normalized_dpo_pairs"):
        cols = [
            "pair_id",
            "agreement_kind",
            "n_teachers",
            "n_models",
            "n_models_agreeing",
            "n_agreeing",
            "agreement_score",
            "has_error",
        ]
        rows = st.read_table("normalized_dpo_pairs", cols).to_pylist()
        for r in rows:
            key = f"{r['agreement_kind']}, {agreement_label(r)}"
            report.agreement[key] = report.agreement.get(key, 0) + 1
        report.example_pair = next((r["pair_id"] for r in rows if r["has_error"]), rows[0]["pair_id"])


def _train_summary(tp: dict) -> dict:
    """Steps, data counts and how many steps each loss channel fired (from the checkpoint's losses.jsonl)."""

    metrics = json.loads(tp.get("metrics") or "{}")
    out = {
        "steps": metrics.get("steps"),
        "seconds": metrics.get("train_seconds"),
        "model": tp.get("base_model"),
        "data": metrics.get("data") or {},
        "fired": {},
        "plots": None,
    }
    losses = Path(tp.get("local_dir") or "") / "losses.jsonl"
    if losses.is_file():
        steps = [json.loads(line) for line in losses.read_text().splitlines() if line.strip()]
        out["fired"] = {ch: sum(1 for s in steps if s.get(ch) is not None) for ch in ("grpo", "sdpo", "dpo")}
        out["plots"] = str(losses.parent / "loss_*.png")
    return out


def _cli_path() -> str:
    """How to call the CLI from the current directory: the venv's script (relative when inside cwd)."""

    script = Path(sys.executable).parent / "composer-pipeline"
    if not script.is_file() or shutil.which("composer-pipeline") == str(script):
        # on PATH (venv active) or not a venv install
        return "composer-pipeline"
    try:
        return str(script.relative_to(Path.cwd()))
    except ValueError:
        return str(script)


def print_report(r: DemoReport, echo=print) -> None:
    echo("")
    echo(
        f"== composer-pipeline demo: {len(r.sessions) - len([k for k in r.failed if k in r.sessions])}/{len(r.sessions)} "
        f"sessions through the chain in {r.seconds:.0f}s =="
    )
    echo(f"store (Parquet, one file per asset partition): {r.store}")
    for name, n in sorted(r.row_counts.items()):
        echo(f"  {name:<22} {n:>6} rows")
    if r.ingest_engines:
        engines = ", ".join(
            f"{engine}: {n} of {len(r.sessions)} sessions" for engine, n in sorted(r.ingest_engines.items())
        )
        echo(f"ingest engine ({'compiled C++' if 'native' in r.ingest_engines else 'Python'}): {engines}")
    if r.teachers:
        echo(f"teachers ({r.teachers_recipe}; local ones served over HTTP on loopback):")
        for name, t in sorted(r.teachers.items()):
            echo(
                f"  {name:<12} {t['answered']:>4} answered  {t['other']:>3} not answered  "
                f"{t['cached']:>4} from the response cache  ${t['spend']:.6f} this run"
            )
    if r.agreement:
        agree = "; ".join(f"{n} {k}" for k, n in sorted(r.agreement.items()))
        echo(f"pairs after data-juicer normalization: {sum(r.agreement.values())} ({agree})")
    if r.train:
        t, d = r.train, r.train.get("data") or {}
        secs = f"{t['seconds']:.0f}s" if t.get("seconds") is not None else "?"
        echo(
            f"training: {t.get('steps')} steps in {secs} on {t.get('model')}; data: {d.get('prompts', '?')} GRPO prompts, "
            f"{d.get('error_sites', '?')} error sites (hint channel), {d.get('pairs', '?')} DPO pairs"
        )
        if t.get("fired"):
            f = t["fired"]
            echo(
                f"  channels fired (steps of {t.get('steps')}): GRPO {f['grpo']}, hint-SDPO {f['sdpo']}, DPO {f['dpo']}"
                "  (SDPO only fires on batches that contain an error site)"
            )
    if r.checkpoint:
        echo(f"checkpoint: {r.checkpoint}")
    if r.train.get("plots"):
        echo(f"loss plots: {r.train['plots']}")
    for metric, v in r.eval_metrics.items():
        fmt = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
        echo(f"eval {metric:<20} trained {fmt(v['trained'])}  base {fmt(v['base'])}")
    if r.eval_metrics:
        was_measured, rows = measured(r.eval_metrics, r.min_rows_to_measure)
        if not was_measured:
            echo(smoke_line((r.train.get("data") or {}).get("pairs"), rows, r.min_rows_to_measure))
    for k, why in r.failed.items():
        echo(f"FAILED {k}: {why}")
    if r.row_counts.get("trace_states") and not r.row_counts.get("training_set"):
        echo(
            "no DPO pairs or positives: the teachers never reached consensus on any state (a pair needs "
            "`agreement_threshold` teachers with parsed, non-empty answers; see the `stats` metadata of "
            "dpo_pairs in the UI, or recipes/pairs.yaml and the teachers recipe)"
        )
    store_flag = f" --store {r.store}"
    cp = _cli_path()
    echo("")
    echo("next:")
    echo(f'  {cp} sql "select teacher, status, count(*) from teacher_replays group by all"{store_flag}')
    echo(f'  {cp} sql "select pair_id, chosen_text, rejected_text from normalized_dpo_pairs limit 5"{store_flag}')
    pair = r.example_pair or "<pair_id>"
    echo(f"  {cp} lineage {pair}{store_flag}")
    echo(f"  {cp} show {pair}{store_flag}")
    echo("  the UI (http://127.0.0.1:3000; this demo's runs are under Runs, the env makes it see the same sessions):")
    echo(
        f"    {r.ui_env or 'DAGSTER_HOME=' + r.dagster_home} env --default-signal=INT .venv/bin/dagster dev -w workspace.yaml -h 127.0.0.1 -p 3000"
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m assets.demo`` (what ``composer-pipeline demo`` runs): same flags as the CLI."""

    parser = argparse.ArgumentParser(prog="composer-pipeline demo", description=__doc__.splitlines()[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        report = run_demo(args.trace_root, args.store, args.steps, args.skip_train, args.teachers, args.keep_teachers)
    except CLEAR_ERRORS as e:
        return report_error("demo", e)
    print_report(report)
    return 1 if report.failed else 0


if __name__ == "__main__":
    import sys

    sys.exit(main())
