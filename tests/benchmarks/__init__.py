"""The benchmarks' own pure parts."""
