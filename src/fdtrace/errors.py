"""Errors a user can meet and fix; the CLI prints them as one line and exits non-zero."""

from __future__ import annotations


class FdtraceError(Exception):
    """A problem with the environment or the input, explained in one line.

    Attributes:
        exit_code: the process exit status the CLI uses for it.
    """

    def __init__(self, message: str, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code
