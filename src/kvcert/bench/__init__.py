"""Benchmarks (not tests): speed and memory ratios measured side by side in one process."""
