"""Loading fdtrace's BPF programs: kernel feature probes (no bcc) and the bcc loader."""
