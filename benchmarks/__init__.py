"""Benchmarks: ``bench_<module>.py`` per capability, sharing :mod:`benchmarks.harness`."""
