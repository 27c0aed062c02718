"""Benchmark scripts (not tests). Run ``python bench/drain.py --help``."""
