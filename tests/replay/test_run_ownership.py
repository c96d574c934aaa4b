"""Who holds a run and its claims (issue 30, items 1–3), on both ledgers, counted at a loopback billing server:

* a replay stopped with SIGSTOP for longer than its lease beside a second replay: the second finalizes it
  and buys what it had claimed; the paused one, woken, buys none of it again (each request is claimed again
  before it is reserved and sent) and its answers that were in flight during the pause are settled at their
  cost and stored, never thrown away;
* a live replay in another PID namespace with the same hostname (``unshare --pid``): its pid means nothing
  here, so it is judged by its lease and not finalized as "process gone";
* the same run id twice at once: the second is refused with a message, the two never share claims.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from ledger_helpers import ledger_rows, reserve

from composer_pipeline.ledger import Ledger, RunIdInUse
from composer_pipeline.ledger.core import machine_id

WORKER = Path(__file__).with_name("worker.py")
TASK_RE = re.compile(rb"task (\d+) ")


def _start(args: dict, prefix: list[str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [*(prefix or []), sys.executable, str(WORKER), json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )


def _result(p: subprocess.Popen, timeout: float = 120) -> tuple[int, dict, str]:
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        raise AssertionError(f"worker hung: {err[-3000:]}")
    lines = out.strip().splitlines()
    assert lines, f"rc={p.returncode}: {err[-3000:]}"
    return p.returncode, json.loads(lines[-1]), err


def _wait(cond, what: str, procs: list[subprocess.Popen], timeout: float = 90) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        for p in procs:
            assert p.poll() is None, f"{what}: a worker exited: {p.communicate()}"
        time.sleep(0.01)


def _states_sent(server) -> set[int]:
    return {int(TASK_RE.search(r.body).group(1)) for r in server.requests}


def _billed_twice(server) -> int:
    return sum(n - 1 for n in Counter(r.body_hash for r in server.requests).values())


def _billed_usd(server) -> float:
    return sum(p * 1.0 / 1e6 + c * 2.0 / 1e6 for _, p, c in server.billed)  # teacher_dict prices


def _settled_usd(ledger: Ledger) -> float:
    return sum(r["cost_usd"] or 0.0 for r in ledger_rows(ledger) if r["state"] == "settled")


@pytest.mark.slow
def test_a_run_paused_past_its_lease_buys_nothing_twice(tmp_path, server, ledger_url):
    """Replay A (10 states, 2 in flight at a time, 1 s per answer, lease 1 s) is stopped with its first two
    requests in flight; replay B starts after A's lease has run out, finalizes A, takes over its claims and
    buys everything A had not sent; then A is continued. Before issue 30 A re-registered and bought again
    everything it had claimed."""
    server.latency_s = 1.0
    states = list(range(10))
    # a read timeout far above the pause: the answers in flight are read when A wakes, however slow B is here
    common = {"url": server.url, "ledger": ledger_url, "max_concurrency": 2, "lease_s": 1.0, "timeout_s": 300.0}
    a = _start({**common, "cache": str(tmp_path / "ca"), "run": "paused", "states": states})
    _wait(lambda: len(server.requests) >= 2, "A's first requests", [a])
    os.kill(a.pid, signal.SIGSTOP)
    try:
        # a request written just before the stop reaches the server
        time.sleep(0.3)
        in_flight = _states_sent(server)
        assert len(in_flight) == 2
        time.sleep(1.5)  # longer than A's lease
        b = _start({**common, "cache": str(tmp_path / "cb"), "run": "other", "states": sorted(set(states) - in_flight)})
        rc_b, res_b, err_b = _result(b)
        assert rc_b == 0 and res_b["summary"]["answered"] == 8, err_b[-2000:]
    finally:
        os.kill(a.pid, signal.SIGCONT)
    rc_a, res_a, err_a = _result(a)
    assert rc_a == 0, err_a[-3000:]
    assert {r["status"] for r in res_a["rows"]} == {"answered"} and len(res_a["rows"]) == 10
    assert len(server.requests) == 10 and _billed_twice(server) == 0, "a request was bought twice"
    ledger = Ledger(ledger_url)
    mine = [r for r in ledger_rows(ledger) if r["run_id"] == "paused"]
    # the answers in flight during the pause: settled at their cost after the run was finalized, not kept
    assert sorted(r["state"] for r in mine) == ["settled", "settled"], mine
    assert all("settled late" in r["note"] for r in mine)
    assert _settled_usd(ledger) == pytest.approx(_billed_usd(server)) and ledger.open_reservations() == 0
    # and stored where every run finds them: each of the 10 answers in the ledger, whatever the cache
    assert ledger.answered_ids([r["call_id"] for r in res_a["rows"]]) == {r["call_id"] for r in res_a["rows"]}


def _unshare_prefix(pid: int) -> list[str]:
    """Run a command in a new PID namespace (same hostname, network and files) as pid ``pid`` there."""
    return [
        "unshare",
        "--pid",
        "--fork",
        "--mount-proc",
        "sh",
        "-c",
        f'echo {pid - 1} > /proc/sys/kernel/ns_last_pid && "$@"; exit $?',
        "sh",
    ]


def _free_pid() -> int:
    """A pid no process has in this namespace (so a process there with it looks dead from here)."""
    used = {int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()}
    top = int(Path("/proc/sys/kernel/pid_max").read_text())
    return next(p for p in range(min(top - 1, 30000), 300, -1) if p not in used)


def _can_unshare() -> str:
    if shutil.which("unshare") is None:
        return "the unshare command is missing"
    r = subprocess.run(_unshare_prefix(_free_pid()) + ["true"], capture_output=True, text=True)
    return "" if r.returncode == 0 else f"unshare --pid is not permitted here: {r.stderr.strip()[:200]}"


@pytest.mark.slow
def test_a_live_run_in_another_pid_namespace_is_not_finalized(tmp_path, server, ledger_url):
    """Replay A runs in its own PID namespace (a container beside another on one node: same hostname) as a
    pid that does not exist here; replay B here needs the same answers. Before issue 30 B judged A by
    (hostname, pid), found it "gone", finalized it and bought its claims again."""
    why = _can_unshare()
    if why:
        pytest.skip(why)
    server.latency_s = 0.5
    states = list(range(8))
    pid = _free_pid()
    common = {"url": server.url, "ledger": ledger_url, "max_concurrency": 2, "states": states}
    a = _start({**common, "cache": str(tmp_path / "ca"), "run": "in-container"}, prefix=_unshare_prefix(pid))
    ledger = Ledger(ledger_url)
    _wait(lambda: len(server.requests) >= 2, "A's first requests", [a])
    row = next(r for r in ledger_rows(ledger, "runs") if r["run_id"] == "in-container")
    assert row["pid"] == pid and row["machine"] != machine_id()  # the same host name, another namespace
    b = _start({**common, "cache": str(tmp_path / "cb"), "run": "here"})
    (rc_a, res_a, err_a), (rc_b, res_b, err_b) = _result(a), _result(b)
    assert rc_a == 0 and rc_b == 0, (err_a[-2000:], err_b[-2000:])
    for res in (res_a, res_b):
        assert {r["status"] for r in res["rows"]} == {"answered"} and len(res["rows"]) == len(states)
    assert len(server.requests) == len(states) and _billed_twice(server) == 0
    assert res_b["summary"]["shared_answers"] == len(states)  # B waited for A's claims
    assert not [r for r in ledger_rows(ledger) if "gone" in (r["note"] or "")]
    assert {r["run_id"]: r["state"] for r in ledger_rows(ledger, "runs")} == {
        "in-container": "closed",
        "here": "closed",
    }


def test_a_run_on_another_machine_named_alike_is_judged_by_its_lease(ledger_url):
    """Two machines with one hostname on a shared ledger: a live run whose pid does not exist here is not
    finalized before its lease expires."""
    ledger = Ledger(ledger_url)
    ledger.start_run("remote", lease_s=600)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    ledger._tx(
        lambda c: c.execute(
            "UPDATE runs SET pid = ?, machine = ? WHERE run_id = 'remote'",
            [int(dead.stdout), "another-boot-id/pidns:4026531836"],
        )
    )
    res = reserve(ledger, "t", 0.1, budget_usd=1.0, run_id="remote", ceiling_usd=1.0)
    ledger.mark_sent(res.id)
    assert Ledger(ledger_url).reconcile()["expired_runs"] == []
    assert ledger.open_reservations() == 1
    # the same row on this machine and namespace with its process gone: finalized at once (kill -9)
    ledger._tx(lambda c: c.execute("UPDATE runs SET machine = ? WHERE run_id = 'remote'", [machine_id()]))
    assert Ledger(ledger_url).reconcile()["expired_runs"] == ["remote"]


def test_a_run_id_is_held_by_one_process(ledger_url):
    """Another owner's live run id is refused; a closed one, or one whose lease expired, is taken over."""
    a, b = Ledger(ledger_url), Ledger(ledger_url)
    a.start_run("nightly", lease_s=0.5)
    assert a.claim("c" * 64, "t", "nightly").state == "mine"
    with pytest.raises(RunIdInUse, match="is live in another process"):
        b.start_run("nightly", lease_s=0.5)
    # a claim is the owner's, not the run id's
    assert b.claim("c" * 64, "t", "nightly").state == "wait"
    a.start_run("nightly", lease_s=0.5)  # its own: revived
    time.sleep(0.7)
    # a's lease expired: finalized, taken over
    b.start_run("nightly", lease_s=30)
    assert {r["run_id"]: r["state"] for r in ledger_rows(b, "runs")} == {"nightly": "live"}
    assert not a.heartbeat("nightly") and b.heartbeat("nightly")
    assert b.claim("c" * 64, "t", "nightly").state == "mine"
    assert b.close_run("nightly")["claims_dropped"] == 1
    a.start_run("nightly")  # closed: anyone may use the id again


@pytest.mark.slow
def test_the_same_run_id_twice_at_once_is_refused(tmp_path, server, ledger_url):
    """`--run-id nightly-$(date +%F)` overlapping itself: the second replay waits one lease for the first to
    stop heartbeating, then is refused with a message; nothing is bought twice. Before issue 30 each took
    the other's claims as its own and bought them."""
    # the first replay runs 8 s: longer than the second's start and its wait of one lease
    server.latency_s = 0.5
    states = list(range(16))
    common = {"url": server.url, "ledger": ledger_url, "max_concurrency": 1, "lease_s": 1.0, "states": states}
    a = _start({**common, "cache": str(tmp_path / "ca"), "run": "nightly"})
    _wait(lambda: len(server.requests) >= 2, "the first replay's requests", [a])
    b = _start({**common, "cache": str(tmp_path / "cb"), "run": "nightly"})
    rc_b, res_b, err_b = _result(b)
    assert rc_b == 2 and "run id 'nightly' is live in another process" in res_b["error"], (res_b, err_b[-2000:])
    rc_a, res_a, err_a = _result(a)
    assert rc_a == 0 and {r["status"] for r in res_a["rows"]} == {"answered"}, err_a[-2000:]
    assert len(server.requests) == len(states) and _billed_twice(server) == 0
    ledger = Ledger(ledger_url)
    assert ledger.open_reservations() == 0 and _settled_usd(ledger) == pytest.approx(_billed_usd(server))
