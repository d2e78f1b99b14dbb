"""Exit codes (the same numbers as deployctl's ``deploy.base.errors.ExitCode``) and FixError."""

from __future__ import annotations

EXIT_OK = 0
EXIT_CHANGE_NEEDED = 1
EXIT_USAGE = 2
EXIT_CONFIG = 3
EXIT_CHECKPOINT = 6
EXIT_VERIFY = 8
EXIT_IO = 10
EXIT_INTERRUPTED = 130


class FixError(Exception):
    """A user or environment error: ``code`` is the exit code, ``message`` names the file."""

    def __init__(self, code: int, message: str) -> None:
        super(FixError, self).__init__(message)
        self.code = int(code)
        self.message = message

    def __str__(self) -> str:
        return self.message
