"""The pipeline: one source (the live kernel with /proc sampling, or a replayed recording)
fanned out to sinks (JSON lines, Parquet, Prometheus, the live view), stopped in one place."""

from fdtrace.pipeline.protocols import Sink, Source
from fdtrace.pipeline.runner import Pipeline, SinkFailure, Stop
from fdtrace.pipeline.update import ArrowTable, HaproxyRow, SampleRound, SourceInfo, SystemFigures, Update

__all__ = ["ArrowTable", "HaproxyRow", "Pipeline", "SampleRound", "Sink", "SinkFailure", "Source", "SourceInfo",
           "Stop", "SystemFigures", "Update"]
