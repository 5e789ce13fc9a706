"""Analysis of recordings; every function returns pandas DataFrames."""

from fdtrace.recording import Recording, load

__all__ = ["Recording", "load"]
