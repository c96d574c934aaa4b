"""Helpers for the tests and benchmarks, never imported by the pipeline itself.

``sessions`` builds Claude Code sessions record by record; ``traces`` writes the project's own corpus
of them (every format feature the tests need).
"""
