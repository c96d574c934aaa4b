"""The ledger as one asyncio replay run sees it.

In:  a :class:`~composer_pipeline.ledger.core.Ledger`, the run's id and lease (``lease_s``), and a
     directory where paid answers wait for a ledger that cannot record them (``spool``, beside the cache).
Out: :class:`AsyncLedger`: awaitable claim / reserve / mark sent / close / answer for the run's requests,
     a heartbeat task that keeps its lease, reconciles of dead runs while it waits, and :meth:`AsyncLedger.finish`
     that closes the run; :class:`ReplayInterrupted` for a run stopped by SIGTERM/SIGINT; :class:`ClaimLost`.

The run's process holds its run id under an owner token (one live process per run id: a second one waits
one lease for the holder to stop beating, then is refused with :class:`~.core.RunIdInUse`). A run paused
longer than its lease (SIGSTOP, a suspended laptop or VM, a blocked event loop) is finalized by another run,
which takes its claims over: when it wakes, its heartbeat registers it again, and every request it had
claimed is refused at its reservation or just before it is sent (:class:`ClaimLost`: nothing sent) so the
caller claims it again and gets the other run's answer. An answer that was in flight during the pause is
still settled at its cost and stored (``Ledger.close`` settles a finalized reservation late).

A paid answer the ledger cannot record (a PostgreSQL server down past ``outage_s``) is held: written to the
spool and retried in the background; the run does not end while it holds one (SIGTERM/SIGINT leave it in the
spool), and the next run with the same spool records it first. So every run finds it in the ledger once the
ledger is back, whatever its response cache.

Deliberately simplified: one worker thread per run serializes the run's ledger calls (the database
serializes writers anyway); waits poll with capped, jittered backoff (reservations 5 ms → 200 ms, claims
20 ms → 250 ms) instead of database notifications; a failed heartbeat is skipped (it beats every
``lease_s``/4, so a lease outlasts a few misses); a claim lost on a retry attempt leaves the earlier
attempt's kept money in the ledger only (the row reports the answer the other run bought); held answers
are retried once a second.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import random
import signal
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson

from composer_pipeline.ledger.backends import LedgerError, LedgerUnavailable
from composer_pipeline.ledger.core import DEFAULT_LEASE_S, Claim, Ledger, Reservation, Reserve, RunIdInUse

# a held answer's file in the spool (not ``.json``: the response cache counts those)
HELD_SUFFIX = ".pending"


class ReplayInterrupted(RuntimeError):
    """SIGTERM/SIGINT arrived: the run closed its ledger run (nothing left reserved) and stops."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(
            f"interrupted by {signal.Signals(signum).name}: ledger run closed "
            "(calls not sent released, calls in flight kept at worst case); re-run to finish"
        )


class ClaimLost(RuntimeError):
    """The run no longer holds this request's claim (paused past its lease: another run took the request
    over). Nothing was sent; the caller claims the request again."""

    def __init__(self) -> None:
        super().__init__("claim lost: another run took this request over while this run was paused past its lease")


class AsyncLedger:
    """The ledger as seen by one asyncio run: one worker thread (one connection) for its writes, a
    heartbeat task for its lease, waits that poll with backoff, and one batched poller for answers
    other runs are buying."""

    def __init__(self, ledger: Ledger, run_id: str, lease_s: float = DEFAULT_LEASE_S, spool: Path | None = None):
        self.ledger, self.run_id, self.lease_s = ledger, run_id, float(lease_s)
        self.owner = uuid.uuid4().hex  # this process's hold on the run id
        self.spool = Path(spool) if spool is not None else None
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger")
        self._heart: asyncio.Task | None = None
        self._last_reconcile = 0.0
        self._watch: dict[str, asyncio.Future] = {}
        self._watcher: asyncio.Task | None = None
        self._deliverer: asyncio.Task | None = None
        # reservation id -> the close a down ledger could not record
        self.held: dict[str, dict[str, Any]] = {}
        # another process holds the run id now: this run buys nothing more
        self.taken_over: str | None = None
        # reservations that had to wait for money in flight (not failures)
        self.waits = 0
        # requests another run took over while this one was paused
        self.lost_claims = 0

    async def _run(self, fn, *args, **kw):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kw))

    async def start(self) -> None:
        await self._record_spool()
        first_refusal: float | None = None
        while True:
            try:
                await self._run(self.ledger.start_run, self.run_id, self.lease_s, self.owner)
                break
            except RunIdInUse as e:
                # its holder may have died where this process cannot see (another machine or namespace): give it
                # one lease to stop heartbeating; a holder that keeps beating is alive and this run is refused
                now = time.monotonic()
                first_refusal = first_refusal or now
                if now - first_refusal > e.lease_s + 1.0:
                    raise
                await asyncio.sleep(min(1.0, max(0.1, e.lease_s / 8)))
        # a killed run's reservations stop counting now (its process is gone, or its lease expired), not only
        # once this run has to wait for money
        self._last_reconcile = time.monotonic()
        await self._run(self.ledger.reconcile)
        self._heart = asyncio.create_task(self._heartbeat())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(max(0.2, self.lease_s / 4))
            try:
                await self._keep_lease()
            except RunIdInUse as e:
                self.taken_over = str(e)
                return
            except LedgerError:
                # the next beat tries again; the lease is long enough to miss a few
                pass

    async def _keep_lease(self) -> None:
        """Beat; a run finalized while it was paused past its lease registers again (its claims went to other
        runs, and each request is claimed again before it is bought). :class:`RunIdInUse` when another process
        has taken the run id meanwhile."""
        if not await self._run(self.ledger.heartbeat, self.run_id, self.owner):
            await self._run(self.ledger.start_run, self.run_id, self.lease_s, self.owner)

    async def maybe_reconcile(self) -> None:
        now = time.monotonic()
        if now - self._last_reconcile >= max(0.5, min(self.lease_s / 4, 5.0)):
            self._last_reconcile = now
            await self._run(self.ledger.reconcile)

    async def claim(self, call_id: str, teacher: str) -> Claim:
        """Claim ``call_id``; while a live run is buying it, wait, then take its answer (or the claim)."""
        while True:
            if self.taken_over:
                raise RunIdInUse(self.taken_over)
            got = await self._run(self.ledger.claim, call_id, teacher, self.run_id, self.owner)
            if got.state != "wait":
                return got
            fut = self._watch.get(call_id)
            if fut is None:
                fut = self._watch[call_id] = asyncio.get_running_loop().create_future()
            if self._watcher is None or self._watcher.done():
                self._watcher = asyncio.create_task(self._watch_claims())
            await asyncio.shield(fut)

    async def _watch_claims(self) -> None:
        """Poll the claims waited for. A ledger error (its server gone past ``outage_s``: each poll already
        rode through the outage) is handed to every waiter, so no wait stays pending forever."""
        delay = 0.02
        while self._watch:
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, 0.25)
            ids = list(self._watch)
            try:
                status = await self._run(self.ledger.claims_status, ids)
                # a claimant whose lease expired, or whose process is gone, is finalized
                await self.maybe_reconcile()
            except Exception as e:
                for cid in ids:
                    fut = self._watch.pop(cid, None)
                    if fut is not None and not fut.done():
                        fut.set_exception(e)
                continue
            for cid, s in status.items():
                if s != "inflight":
                    fut = self._watch.pop(cid, None)
                    if fut is not None and not fut.done():
                        fut.set_result(s)
                        delay = 0.02

    async def reserve(self, op: Reserve) -> Reservation:
        """Reserve the worst case, waiting while money in flight (anyone's) or earlier waiters are in the way;
        :class:`ClaimLost` when this run no longer holds the request's claim."""
        op = dataclasses.replace(op, owner=self.owner)
        waiter = uuid.uuid4().hex
        delay = 0.005
        waited = False
        while True:
            res = await self._run(self.ledger.try_reserve, op, waiter)
            if res.lost:
                await self._lost()
            if not res.wait:
                return res
            if not waited:
                waited = True
                self.waits += 1
            # a dead run's reservations stop blocking once its lease expires
            await self.maybe_reconcile()
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 1.6, 0.2)

    async def mark_sent(self, reservation_id: str) -> None:
        """The request leaves next; :class:`ClaimLost` (its reservation released, nothing sent) when this run no
        longer holds its lease or the request's claim."""
        if not await self._run(self.ledger.mark_sent, reservation_id, self.owner):
            await self._run(self.ledger.close, reservation_id, "released", None, "claim lost before sending")
            await self._lost()

    async def _lost(self) -> None:
        self.lost_claims += 1
        # a finalized run registers again (or learns its id was taken over)
        await self._keep_lease()
        raise ClaimLost()

    async def close(
        self,
        reservation_id: str,
        state: str,
        cost_usd: float | None = None,
        note: str = "",
        answer: tuple[str, dict[str, Any]] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        """Close a reservation. When the ledger cannot record a paid answer (``answer`` given) the answer is held
        (spool + background retries) and the LedgerError says so; the run does not end before it is recorded."""
        try:
            await self._run(self.ledger.close, reservation_id, state, cost_usd, note, answer, usage)
        except LedgerError as e:
            if answer is None:
                raise
            where = self._hold(
                reservation_id,
                {"state": state, "cost_usd": cost_usd, "note": note, "answer": list(answer), "usage": usage},
            )
            if self._deliverer is None or self._deliverer.done():
                self._deliverer = asyncio.create_task(self._deliver_in_background())
            kind = LedgerUnavailable if isinstance(e, LedgerUnavailable) else LedgerError
            raise kind(f"{e}; the paid answer is held ({where}) and recorded once the ledger is back") from None

    async def fail_claim(self, call_id: str, reason: str) -> None:
        await self._run(self.ledger.fail_claim, call_id, self.run_id, reason, self.owner)

    # -- paid answers the ledger could not record
    def _hold(self, reservation_id: str, close: dict[str, Any]) -> str:
        """Keep one close for later, in memory and (when there is a spool) in a file; where it is kept."""
        self.held[reservation_id] = close
        if self.spool is None:
            return "in this process"
        try:
            self.spool.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".held.", dir=self.spool)
            with os.fdopen(fd, "wb") as f:
                f.write(orjson.dumps({"reservation_id": reservation_id, **close}))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.spool / f"{reservation_id}{HELD_SUFFIX}")
        except OSError as e:
            return f"in this process only: {e.strerror or type(e).__name__} writing {self.spool}"
        return f"in {self.spool}"

    async def _record_held(self) -> LedgerError | None:
        """Record every held close in the ledger; the error when the ledger still cannot take them."""
        for rid, close in list(self.held.items()):
            try:
                await self._run(
                    self.ledger.close,
                    rid,
                    close["state"],
                    close["cost_usd"],
                    close["note"] or "",
                    tuple(close["answer"]),
                    close["usage"],
                )
            except LedgerError as e:
                return e
            self.held.pop(rid, None)
            if self.spool is not None:
                (self.spool / f"{rid}{HELD_SUFFIX}").unlink(missing_ok=True)
        return None

    async def _record_spool(self) -> None:
        """Answers an earlier run with this spool paid for but could not record (it was stopped while the ledger
        was down): recorded now, before this run claims anything."""
        if self.spool is None or not self.spool.is_dir():
            return
        keys = {"reservation_id", "state", "cost_usd", "note", "answer", "usage"}
        for path in sorted(self.spool.glob(f"*{HELD_SUFFIX}")):
            try:
                close = orjson.loads(path.read_bytes())
            except FileNotFoundError:
                # another run with this spool recorded and removed it meanwhile
                continue
            except (OSError, orjson.JSONDecodeError):
                close = None
            if not isinstance(close, dict) or set(close) != keys:  # not written by _hold: set aside, named
                path.rename(path.with_suffix(".unreadable"))
                print(
                    f"ledger: {path} is not a held answer; set aside as {path.with_suffix('.unreadable').name}",
                    file=sys.stderr,
                )
                continue
            self.held[close.pop("reservation_id")] = close
        if self.held and await self._record_held() is not None:
            raise LedgerUnavailable(
                f"ledger {self.ledger.label}: cannot record {len(self.held)} paid answers held in {self.spool}"
            )

    async def _deliver_in_background(self) -> None:
        while self.held and await self._record_held() is not None:
            await asyncio.sleep(1.0)

    async def _wait_held(self, bounded: bool) -> None:
        """Before the run ends: record what it holds, waiting for a lost ledger server to come back (``bounded``:
        for at most ``outage_s``, when the run was interrupted; else until it is back or the run is stopped). A
        ledger that answers with another error (a full disk) is not waited for: the spool keeps them."""
        deadline = time.monotonic() + self.ledger.outage_s
        told = False
        while self.held and (err := await self._record_held()) is not None:
            if not isinstance(err, LedgerUnavailable) or (bounded and time.monotonic() > deadline):
                return  # left in the spool for the next run
            if not told:
                told = True
                print(
                    f"ledger {self.ledger.label} is unreachable: waiting for it to record {len(self.held)} paid "
                    f"answers (held in {self.spool or 'this process'}; stopping this run leaves them there for the "
                    "next replay with this response cache)",
                    file=sys.stderr,
                    flush=True,
                )
            await asyncio.sleep(1.0)

    async def answer(self, call_id: str) -> dict[str, Any] | None:
        return await self._run(self.ledger.answer, call_id)

    async def finish(self, note: str = "run ended") -> dict[str, int]:
        """Record the paid answers it holds, stop heartbeating and close the run (anything still open is
        finalized: released or kept)."""
        for t in (self._watcher, self._deliverer):
            if t is not None:
                t.cancel()
        try:
            # still heartbeating: its claims stay its own
            await self._wait_held(bounded=note != "run ended")
            if self._heart is not None:
                self._heart.cancel()
            return await self._run(self.ledger.close_run, self.run_id, note, self.owner)
        finally:
            if self._heart is not None:
                self._heart.cancel()
            self._pool.shutdown(wait=False)
