"""Statistics of a latency series: the one summary every timed row uses (our runners' samples, trtexec's
``--exportTimes``, the timing checks). The timing loop itself is :func:`pipeline.runtime.runners.measure`."""

from __future__ import annotations

import numpy as np


def summarize(latencies_ms: list[float] | np.ndarray, batch_size: int) -> dict:
    """Statistics of a latency series (ms). Percentiles use linear interpolation (NumPy's default)."""
    x = np.asarray(latencies_ms, dtype=np.float64)
    if x.size == 0:
        raise ValueError("no latencies to summarise")
    mean = float(x.mean())
    std = float(x.std(ddof=1)) if x.size > 1 else 0.0
    p50, p90, p95, p99 = (float(v) for v in np.percentile(x, [50, 90, 95, 99]))
    return {
        "mean": mean,
        "std": std,
        "cv": std / mean if mean > 0 else 0.0,
        "min": float(x.min()),
        "max": float(x.max()),
        "p50": p50,
        "p90": p90,
        "p95": p95,
        "p99": p99,
        "iterations": int(x.size),
        "throughput": batch_size * 1000.0 / mean if mean > 0 else 0.0,
    }
