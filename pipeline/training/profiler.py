"""torch.profiler over the first optimizer steps, written as a Chrome trace."""

from __future__ import annotations

import logging
from pathlib import Path

from pipeline.core.run import atomic_path

log = logging.getLogger("pipeline")


class StepProfiler:
    """torch.profiler over the first ``steps`` optimizer steps; a no-op when profiling is off."""

    def __init__(self, device, steps: int, trace: Path | None):
        self.steps, self.trace, self.prof = steps, trace, None
        if trace is not None:
            from torch.profiler import ProfilerActivity, profile

            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            self.prof = profile(activities=activities, record_shapes=False)
            self.prof.start()

    def step(self) -> None:
        if self.prof is not None:
            self.prof.step()
            if self.prof.step_num >= self.steps:
                self.finish()

    def finish(self) -> None:
        """Stop and write the Chrome trace (at the last profiled step or the end of training)."""
        if self.prof is None:
            return
        prof, self.prof = self.prof, None
        prof.stop()
        with atomic_path(self.trace) as tmp:
            prof.export_chrome_trace(str(tmp))
        table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=10)
        log.info("train: profile of %d steps written to %s (open in https://ui.perfetto.dev)\n%s", prof.step_num,
                 self.trace.name, table)

    def close(self) -> None:
        """Stop without writing (an interrupted or failed run)."""
        if self.prof is not None:
            self.prof.stop()
            self.prof = None
