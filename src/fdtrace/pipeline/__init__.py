"""The pipeline: one source (the live kernel with /proc sampling, or a replayed recording)
fanned out to sinks (JSON lines, Parquet, Prometheus, the live view), stopped in one place;
and the controls a view is given over it (the replay's clock, the live view's recording)."""

from fdtrace.pipeline.controls import Controls, NoPlayback, Notice, Position
from fdtrace.pipeline.protocols import Sink, Source
from fdtrace.pipeline.runner import Pipeline, SinkFailure, Stop
from fdtrace.pipeline.update import ArrowTable, Baseline, HaproxyRow, SampleRound, SourceInfo, SystemFigures, Update

__all__ = ["ArrowTable", "Baseline", "Controls", "HaproxyRow", "NoPlayback", "Notice", "Pipeline", "Position",
           "SampleRound", "Sink", "SinkFailure", "Source", "SourceInfo", "Stop", "SystemFigures", "Update"]
