"""Sinks of event batches: JSON lines (and, later, recordings and exporters)."""
