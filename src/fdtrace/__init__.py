"""fdtrace: an eBPF tracer of sockets, FD exhaustion, thread growth and OOM kills."""

__version__ = "0.1.0"
