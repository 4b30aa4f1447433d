"""Profiling tools for pldjax's kernels (``python -m bench.tools.NAME``); not benchmarks: they
time pldjax's internal stages and print, writing no result file."""
