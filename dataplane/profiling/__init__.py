"""Offline measurement tools: whole-window forward passes, calibration data,
the per-block sensitivity profiler (``python -m dataplane.profiling.sensitivity``)."""
