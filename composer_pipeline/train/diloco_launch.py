"""``composer-pipeline train`` with ``diloco.replica_groups`` ≥ 2: a lighthouse and one process per group.

In:  a Store root, the recipe, ``out_dir`` (and the usual ``--model`` / ``--steps``).
Out: :func:`train` (the entry the CLI and :mod:`.pipes_entry` call for any recipe) returns a
     :class:`~.run.TrainResult`: ``out_dir/checkpoint`` (one, from the lowest-numbered group that finished;
     its ``metrics.json`` gains a ``diloco`` summary), the groups' step lines in ``out_dir/steps.jsonl``
     (each with ``group``, ``outer_step``, ``replica_groups_live``). While it runs,
     ``out_dir/replicas.json`` lists the live groups: ``{"groups": [{"group": 0, "pid": …}, …]}``.

One machine (``diloco.lighthouse`` null): :func:`launch` starts a torchft lighthouse in this process and
``python -m composer_pipeline.train.diloco_group`` per group (:mod:`.diloco`), each on its shard. A group that
dies (any non-zero exit, SIGKILL included) is restarted, up to ``max_restarts`` times, and must heal from a
live peer and rejoin (a step line with ``healed``) within ``rejoin_timeout_s``; otherwise it is killed and
dropped with the reason in the summary's ``groups_dropped``, and the others go on. A restarted group that
has not rejoined when the others finish is dropped the same way (there is no peer left to heal from).

Many hosts (``diloco.lighthouse`` or ``--lighthouse`` set): this process *is* group ``diloco.group``
(``--group``): it joins that lighthouse and trains; restarting it is the job of whatever started it
(the pod's restart policy, torchrun's ``--max-restarts``). See README "Beyond one machine".

Deliberately simplified: the run fails only when every group is dropped; the groups' final weights are
compared (``groups_max_weight_diff``) but one checkpoint is kept.
"""

from __future__ import annotations

import json
import queue
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import yaml

from composer_pipeline.train import distributed, run
from composer_pipeline.train.config import TrainRecipe
from composer_pipeline.train.run import TrainResult


@dataclass
class Group:
    """One replica group's process as the launcher sees it."""

    group: int
    proc: subprocess.Popen | None = None
    status: str = "running"  # running | rejoining | done | dropped
    restarts: int = 0
    restarted_at: float = 0.0
    outer_step: int = 0
    done: dict[str, Any] | None = None
    allreduce_bytes: int = 0
    readers: list[threading.Thread] = field(default_factory=list)

    @property
    def live(self) -> bool:
        return self.status in ("running", "rejoining")

    def process(self) -> subprocess.Popen:
        """The group's process (``Launch.start`` starts it before anything looks at it)."""
        if self.proc is None:
            raise RuntimeError(f"replica group {self.group} has no process: it was never started")
        return self.proc


def _copy_stderr(stderr: IO[str], err: Path) -> None:
    with err.open("a") as f:  # appended across restarts
        for line in stderr:
            f.write(line)


def _forward_stdout(g: int, pid: int, stdout: IO[str], lines: queue.Queue) -> None:
    for line in stdout:
        lines.put((g, pid, line))


class Launch:
    """The supervision loop of :func:`launch` (its state: the groups, the events, the step lines)."""

    def __init__(self, command: Callable[[int, bool], list[str]], groups: int, d, out_dir: Path, on_step):
        self.command, self.d, self.out_dir, self.on_step = command, d, out_dir, on_step
        self.groups = [Group(g) for g in range(groups)]
        self.lines: queue.Queue = queue.Queue()
        self.events: list[dict[str, Any]] = []
        self.steps: list[dict[str, Any]] = []
        self._listed: Any = None

    def start(self, grp: Group, must_heal: bool) -> None:
        log_dir = self.out_dir / "groups" / str(grp.group)
        log_dir.mkdir(parents=True, exist_ok=True)
        proc = grp.proc = subprocess.Popen(
            self.command(grp.group, must_heal), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1
        )
        if proc.stdout is None or proc.stderr is None:
            raise RuntimeError(f"replica group {grp.group}'s process has no stdout/stderr pipe")
        grp.readers = [
            threading.Thread(target=_forward_stdout, args=(grp.group, proc.pid, proc.stdout, self.lines), daemon=True),
            threading.Thread(target=_copy_stderr, args=(proc.stderr, log_dir / "stderr.log"), daemon=True),
        ]
        for t in grp.readers:
            t.start()

    def event(self, kind: str, grp: Group, **extra: Any) -> None:
        ev = {"event": kind, "group": grp.group, "outer_step": grp.outer_step, **extra}
        self.events.append(ev)
        print(json.dumps(ev), file=sys.stderr, flush=True)

    def drop(self, grp: Group, reason: str) -> None:
        if grp.proc is not None and grp.proc.poll() is None:
            grp.proc.kill()
            grp.proc.wait()
        grp.status = "dropped"
        self.event("dropped", grp, reason=reason)

    def list_replicas(self) -> None:
        live = [{"group": g.group, "pid": g.proc.pid} for g in self.groups if g.live and g.proc is not None]
        if live != self._listed:
            tmp = self.out_dir / "replicas.json.tmp"
            tmp.write_text(json.dumps({"groups": live}))
            tmp.replace(self.out_dir / "replicas.json")  # readers never see a half-written file
            self._listed = live

    def take_lines(self) -> None:
        while True:
            try:
                g, pid, line = self.lines.get_nowait()
            except queue.Empty:
                return
            grp = self.groups[g]
            if not line.startswith("{") or grp.proc is None or pid != grp.proc.pid:
                continue  # a killed process's last words
            rec = json.loads(line)
            if "done" in rec:
                grp.done, grp.allreduce_bytes = rec["done"], rec["allreduce_bytes"]
                continue
            grp.outer_step = rec.get("outer_step", grp.outer_step)
            if grp.status == "rejoining" and rec.get("healed"):
                grp.status = "running"
                self.event("rejoined", grp, restarts=grp.restarts)
            self.steps.append(rec)
            if self.on_step is not None:
                self.on_step(rec)

    def check(self, grp: Group) -> None:
        rc = grp.process().poll()
        if rc is None:
            waited = time.monotonic() - grp.restarted_at
            if grp.status == "rejoining" and waited > self.d.rejoin_timeout_s:
                self.drop(grp, f"did not rejoin within rejoin_timeout_s = {self.d.rejoin_timeout_s:g}")
            return
        # the pipes are closed: its last lines are on their way
        for t in grp.readers:
            t.join(timeout=10)
        self.take_lines()  # its last step lines and its done line
        if rc == 0 and grp.done is not None:
            grp.status = "done"
            return
        err = self.out_dir / "groups" / str(grp.group) / "stderr.log"
        tail = err.read_text()[-300:].strip().splitlines() if err.exists() else []
        self.event("lost", grp, exit_code=rc, last_error=tail[-1] if tail else "")
        if grp.restarts >= self.d.max_restarts:
            self.drop(grp, f"exited with code {rc} after {grp.restarts} restarts (max_restarts)")
            return
        grp.restarts += 1
        grp.status, grp.restarted_at = "rejoining", time.monotonic()
        self.start(grp, must_heal=True)
        self.event("restarted", grp, pid=grp.process().pid)

    def run(self, poll_s: float = 0.2) -> None:
        for grp in self.groups:
            self.start(grp, must_heal=False)
        try:
            while any(g.live for g in self.groups):
                self.list_replicas()
                self.take_lines()
                for grp in self.groups:
                    if grp.live:
                        self.check(grp)
                if any(g.status == "done" for g in self.groups):
                    for grp in self.groups:
                        if grp.status == "rejoining" and grp.process().poll() is None:
                            self.drop(grp, "the other groups finished before it rejoined")
                time.sleep(poll_s)
            self.take_lines()
        finally:
            for grp in self.groups:
                if grp.proc is not None and grp.proc.poll() is None:
                    grp.proc.kill()
                    grp.proc.wait()
            (self.out_dir / "replicas.json").write_text(json.dumps({"groups": []}))


def launch(
    data_root: str,
    recipe: TrainRecipe,
    *,
    out_dir: Path,
    model: str | None = None,
    steps: int | None = None,
    on_step: Callable[[dict], None] | None = None,
) -> TrainResult:
    """One machine: a lighthouse here and one process per group (see the module docstring)."""
    from composer_pipeline.train.diloco_manager import lighthouse_server

    d = recipe.diloco
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    recipe_path = out_dir / "train.yaml"
    recipe_path.write_text(yaml.safe_dump(recipe.to_dict(), sort_keys=False))
    target = d.outer_steps(int(steps if steps is not None else recipe.optim.steps))
    lighthouse = lighthouse_server(d)

    def command(g: int, must_heal: bool) -> list[str]:
        cmd = [sys.executable, "-m", "composer_pipeline.train.diloco_group", "--data", str(data_root)]
        cmd += ["--recipe", str(recipe_path), "--out", str(out_dir / "groups" / str(g)), "--group", str(g)]
        cmd += ["--lighthouse", lighthouse.address(), "--host", "127.0.0.1"]
        cmd += (["--model", model] if model else []) + (["--steps", str(steps)] if steps is not None else [])
        return cmd + (["--must-heal"] if must_heal else [])

    t0 = time.perf_counter()
    run = Launch(command, d.replica_groups, d, out_dir, on_step)
    try:
        run.run()
    finally:
        lighthouse.shutdown()
    finished = [g for g in run.groups if g.status == "done"]
    if not finished:
        raise RuntimeError(f"every replica group was dropped: {run.events}")
    with (out_dir / "steps.jsonl").open("w") as f:
        for rec in run.steps:
            f.write(json.dumps(rec) + "\n")
    keep = out_dir / "checkpoint"
    if keep.exists():
        shutil.rmtree(keep)
    # a group is done once its done line came (Launch.check)
    done = [g.done for g in finished if g.done is not None]
    src = [Path(d["checkpoint"]) for d in done]
    diff = _max_weight_diff(src)
    shutil.move(str(src[0]), keep)
    for other in src[1:]:
        shutil.rmtree(other)
    summary = {
        "replica_groups": d.replica_groups,
        "inner_steps": d.inner_steps,
        "outer_steps": min(d["outer_steps"] for d in done),
        "outer_steps_planned": target,
        "groups_finished": [g.group for g in finished],
        "groups_lost": sum(e["event"] == "lost" for e in run.events),
        "groups_rejoined": sum(e["event"] == "rejoined" for e in run.events),
        "groups_dropped": [{"group": e["group"], "reason": e["reason"]} for e in run.events if e["event"] == "dropped"],
        "events": run.events,
        "allreduce_bytes": {str(g.group): g.allreduce_bytes for g in finished},
        "groups_max_weight_diff": diff,
        "wall_seconds": time.perf_counter() - t0,
    }
    metrics = json.loads((keep / "metrics.json").read_text())
    metrics["diloco"] = summary
    (keep / "metrics.json").write_text(json.dumps(metrics, indent=2))
    return TrainResult(checkpoint=keep, metrics=metrics, losses=run.steps, plots={})


def _max_weight_diff(checkpoints: list[Path]) -> float:
    """The largest parameter difference between the groups' final weights (all end on the same sync)."""
    from safetensors.torch import load_file

    first = load_file(str(checkpoints[0] / "model.safetensors"))
    diff = 0.0
    for ck in checkpoints[1:]:
        other = load_file(str(ck / "model.safetensors"))
        diff = max([diff] + [float((first[k] - other[k]).abs().max()) for k in first])
    return diff


def train(
    data_root: str,
    recipe: TrainRecipe | str | Path | None,
    *,
    out_dir: Path,
    model: str | None = None,
    steps: int | None = None,
    on_step: Callable[[dict], None] | None = None,
    lighthouse: str | None = None,
    group: int | None = None,
) -> TrainResult:
    """Train with whatever the recipe asks: one process / DDP ranks (:func:`.run.train`), the replica
    groups on this machine (:func:`launch`), or one group of many hosts (``lighthouse`` + ``group``)."""

    recipe = recipe if isinstance(recipe, TrainRecipe) else TrainRecipe.load(recipe)
    d = recipe.diloco
    if d.enabled and distributed.current().distributed:
        raise ValueError("a DiLoCo replica group is one process: run it without torchrun ranks (nproc_per_node 1)")
    lighthouse = lighthouse or d.lighthouse
    group = group if group is not None else d.group
    if not d.enabled:
        if lighthouse or group is not None:
            raise ValueError("--lighthouse / --group need diloco.replica_groups >= 2 in the recipe")
        return run.train(data_root, recipe, model=model, steps=steps, out_dir=Path(out_dir), on_step=on_step)
    if lighthouse is None:
        return launch(data_root, recipe, out_dir=Path(out_dir), model=model, steps=steps, on_step=on_step)
    if group is None:
        raise ValueError("a group of many hosts needs its group id: diloco.group or --group")
    from composer_pipeline.train.diloco import train_group

    return train_group(
        data_root,
        recipe,
        group=group,
        lighthouse=lighthouse,
        out_dir=Path(out_dir),
        model=model,
        steps=steps,
        on_step=on_step,
    ).result
