"""What fdtrace knows of the programs it watches: HAProxy (configuration, stats socket) and
PyTorch training jobs (the phase shim, callbacks, Kineto traces)."""
