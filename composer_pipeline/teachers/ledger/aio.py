"""The ledger as one asyncio replay run sees it.

In:  a :class:`~composer_pipeline.teachers.ledger.core.Ledger`, the run's id and lease (``lease_s``).
Out: :class:`AsyncLedger`: awaitable claim / reserve / mark sent / close / answer for the run's requests,
     a heartbeat task that keeps its lease, reconciles of dead runs while it waits, and :meth:`AsyncLedger.finish`
     that closes the run; :class:`ReplayInterrupted` for a run stopped by SIGTERM/SIGINT.

Deliberately simplified: one worker thread per run serializes the run's ledger calls (the database
serializes writers anyway); waits poll with capped, jittered backoff (reservations 5 ms → 200 ms, claims
20 ms → 250 ms) instead of database notifications; a failed heartbeat is skipped (it beats every
``lease_s``/4, so a lease outlasts a few misses).
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from composer_pipeline.teachers.ledger.backends import LedgerError
from composer_pipeline.teachers.ledger.core import DEFAULT_LEASE_S, Claim, Ledger, Reservation, Reserve


class ReplayInterrupted(RuntimeError):
    """SIGTERM/SIGINT arrived: the run closed its ledger run (nothing left reserved) and stops."""

    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(
            f"interrupted by {signal.Signals(signum).name}: ledger run closed "
            "(calls not sent released, calls in flight kept at worst case); re-run to finish"
        )


class AsyncLedger:
    """The ledger as seen by one asyncio run: one worker thread (one connection) for its writes, a
    heartbeat task for its lease, waits that poll with backoff, and one batched poller for answers
    other runs are buying."""

    def __init__(self, ledger: Ledger, run_id: str, lease_s: float = DEFAULT_LEASE_S):
        self.ledger, self.run_id, self.lease_s = ledger, run_id, float(lease_s)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ledger")
        self._heart: asyncio.Task | None = None
        self._last_reconcile = 0.0
        self._watch: dict[str, asyncio.Future] = {}
        self._watcher: asyncio.Task | None = None
        self.waits = 0  # reservations that had to wait for money in flight (not failures)

    async def _run(self, fn, *args, **kw):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kw))

    async def start(self) -> None:
        await self._run(self.ledger.start_run, self.run_id, self.lease_s)
        # a killed run's reservations stop counting now (its process is gone, or its lease expired), not only
        # once this run has to wait for money
        self._last_reconcile = time.monotonic()
        await self._run(self.ledger.reconcile)
        self._heart = asyncio.create_task(self._heartbeat())

    async def _heartbeat(self) -> None:
        while True:
            await asyncio.sleep(max(0.2, self.lease_s / 4))
            try:
                if not await self._run(self.ledger.heartbeat, self.run_id):
                    # finalized by someone else: re-register; its open money was already settled safely
                    await self._run(self.ledger.start_run, self.run_id, self.lease_s)
            except LedgerError:
                pass  # the next beat tries again; the lease is long enough to miss a few

    async def maybe_reconcile(self) -> None:
        now = time.monotonic()
        if now - self._last_reconcile >= max(0.5, min(self.lease_s / 4, 5.0)):
            self._last_reconcile = now
            await self._run(self.ledger.reconcile)

    async def claim(self, call_id: str, teacher: str) -> Claim:
        """Claim ``call_id``; while a live run is buying it, wait, then take its answer (or the claim)."""
        while True:
            got = await self._run(self.ledger.claim, call_id, teacher, self.run_id)
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
                await self.maybe_reconcile()  # a claimant whose lease expired, or whose process is gone, is finalized
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
        """Reserve the worst case, waiting while money in flight (anyone's) or earlier waiters are in the way."""
        waiter = uuid.uuid4().hex
        delay = 0.005
        waited = False
        while True:
            res = await self._run(self.ledger.try_reserve, op, waiter)
            if not res.wait:
                return res
            if not waited:
                waited = True
                self.waits += 1
            await self.maybe_reconcile()  # a dead run's reservations stop blocking once its lease expires
            await asyncio.sleep(delay * random.uniform(0.5, 1.5))
            delay = min(delay * 1.6, 0.2)

    async def mark_sent(self, reservation_id: str) -> None:
        await self._run(self.ledger.mark_sent, reservation_id)

    async def close(
        self,
        reservation_id: str,
        state: str,
        cost_usd: float | None = None,
        note: str = "",
        answer: tuple[str, dict[str, Any]] | None = None,
        usage: dict[str, Any] | None = None,
    ) -> None:
        await self._run(self.ledger.close, reservation_id, state, cost_usd, note, answer, usage)

    async def fail_claim(self, call_id: str, reason: str) -> None:
        await self._run(self.ledger.fail_claim, call_id, self.run_id, reason)

    async def answer(self, call_id: str) -> dict[str, Any] | None:
        return await self._run(self.ledger.answer, call_id)

    async def finish(self, note: str = "run ended") -> dict[str, int]:
        """Stop heartbeating and close the run (anything still open is finalized: released or kept)."""
        for t in (self._heart, self._watcher):
            if t is not None:
                t.cancel()
        try:
            return await self._run(self.ledger.close_run, self.run_id, note)
        finally:
            self._pool.shutdown(wait=False)
