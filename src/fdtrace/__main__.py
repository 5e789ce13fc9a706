"""``python -m fdtrace``."""

from fdtrace.cli import main

main()
