"""Timing: latency statistics, the stop rule, interleaved rounds, the vendors' own timers (trtexec, benchmark_app), a
precision mix timed on its target, and the GPU timing check's rules."""
