"""Benchmarks (not tests): each prints a table and writes JSON; ``python -m bench.run_all``."""
