"""Helpers for the tests and benchmarks, never imported by the pipeline itself and not installed with it
(a checkout imports them as ``tests.support``: pytest puts the repo root on the path, the benchmarks do it themselves).

* ``sessions``: builds Claude Code sessions record by record; ``traces``: the project's own corpus of
  them (every format feature the tests need).
* ``scripted_server``: an OpenAI-compatible server on loopback that answers by script (fault injection).
* ``synthetic_pairs``: generated DPO pair tables; ``default_executor``: the same normalize recipe through
  data-juicer's own executor (the reference ``bench/bench_normalize.py`` compares against).
* ``synthetic_train``: a small trainable store (states, pairs) for the trainer tests and bench.
"""
