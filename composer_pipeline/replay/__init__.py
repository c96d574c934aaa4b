"""Replay: trace states × teachers → priced answers (requests, plan, call, run, report, preflight)."""
