"""Benchmarks that print figures and side-by-side ratios; not part of the tests.

Importing any of them points RIFT_TEST_CACHE at the tests' image cache unless it
is set (tests.support reads it as it is imported): the benchmarks run on the
images the tests cached."""

from bench.common import use_test_cache

use_test_cache()
