"""Offline parsers of profiler and ncu output (CPU core): they read files a GPU run wrote,
and never import the GPU layer."""
