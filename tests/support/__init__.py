"""Test helpers shared by the test suite and the benchmarks."""
