"""Benchmarks that print figures and side-by-side ratios; not part of the tests."""
