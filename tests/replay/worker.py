"""One replay process for the concurrency tests: ``python worker.py '<json args>'``.

Args: url, ledger (URL), cache, run, states (list of ints), pad, teachers (1 or 2), budget_usd,
max_concurrency, timeout_s, lease_s, ledger_outage_s, script, start_file (wait for it to exist before replaying: a
common start line), ignore_sigxfsz (for a file-size limit set on this process from outside: a full disk).
Prints one JSON line: the summary and the rows; exits 128+signal after SIGTERM/SIGINT (run closed), 2 with
``{"error": ...}`` on a ledger error (e.g. its run id live in another process).
"""

import dataclasses
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: replay.conftest
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo root: tests.support

from composer_pipeline.ledger import Ledger, LedgerError, ReplayInterrupted  # noqa: E402
from composer_pipeline.replay.run import replay_requests  # noqa: E402
from composer_pipeline.teachers.cache import ResponseCache  # noqa: E402
from replay.conftest import make_config, scripted_request, teacher_dict  # noqa: E402

a = json.loads(sys.argv[1])
# a file-size limit (a simulated full disk) makes write() fail instead of killing us
if a.get("ignore_sigxfsz"):
    import signal

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
over = dict(
    budget_usd=a.get("budget_usd", 10.0),
    max_concurrency=a.get("max_concurrency", 4),
    timeout_s=a.get("timeout_s", 20.0),  # a loaded 2-core CI box
)
teachers = [teacher_dict(a["url"], "t1", **over)] + (
    [teacher_dict(a["url"], "t2", model="scripted-b", **over)] if a.get("teachers", 1) > 1 else []
)
cfg = dataclasses.replace(
    make_config(a["url"], teachers=teachers, ceiling_usd=a.get("ceiling_usd", 10.0)),
    lease_s=a.get("lease_s", 30.0),
    ledger_outage_s=a.get("ledger_outage_s", 120.0),
)
reqs = [
    scripted_request(cfg, i, a.get("script", "answer"), teacher=k, pad=a.get("pad", 0))
    for i in a["states"]
    for k in range(len(cfg.teachers))
]
ledger = Ledger(a["ledger"])
if a.get("start_file"):
    Path(f"{a['start_file']}.{a['run']}").touch()  # ready: imports done, ledger open
    while not os.path.exists(a["start_file"]):
        time.sleep(0.01)
try:
    res = replay_requests(reqs, cfg, {}, cache=ResponseCache(a["cache"]), ledger=ledger, run_id=a["run"])
except ReplayInterrupted as e:
    print(json.dumps({"interrupted": e.signum}), flush=True)
    sys.exit(128 + e.signum)
except LedgerError as e:
    print(json.dumps({"error": str(e)}), flush=True)
    sys.exit(2)
cols = ["call_id", "state_id", "teacher", "status", "reason", "cost_usd", "paid_usd", "cache_hit", "attempts"]
print(json.dumps({"summary": res.summary, "rows": res.table.select(cols).to_pylist()}), flush=True)
