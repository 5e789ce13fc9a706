"""Sources of event batches: live BPF tracing (and, later, replay of recordings)."""
