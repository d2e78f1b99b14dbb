"""RecordingTransport: the product's Transport base class with a scripted wire instead of SSH.

Everything above the wire (the coreutils timeout wrapper, ``check``, ``~`` resolution, the mapping
of failures to exit codes) is the product's own code; only ``_exec``, ``_put`` and ``_stream``
answer from a script (and ``_watch``, whose reply's stdout is handed over line by line). Each scripted reply matches the (unwrapped) command by regular expression;
a command no reply matches fails the test, so a step cannot send anything the test did not expect.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from deploy.config.models import Host
from deploy.ssh.transport import ExecTimedOut, Transport


@dataclass
class Reply:
    pattern: str
    exit_code: int = 0
    stdout: str = ""
    stderr: str = ""
    #: how many commands it answers (None: any number); used up replies are skipped
    times: int | None = None
    #: raise this instead of answering (ExecTimedOut, ConnectionError, ...)
    raises: BaseException | None = None


class RecordingTransport(Transport):
    def __init__(self, host: Host, replies: list[Reply], home: str = "/home/deploy",
                 command_timeout_s: float = 60.0) -> None:
        super().__init__(host, command_timeout_s)
        self.replies = list(replies)
        self.home_dir = home
        self.wrapped: list[str] = []
        self.commands: list[str] = []
        #: what each command (in ``commands``' order) got on stdin
        self.stdins: list[bytes | None] = []
        self.timeouts: list[float] = []
        self.uploads: list[tuple[str, bytes]] = []
        self.upload_dirs: list[str] = []
        self.upload_modes: dict[str, int] = {}
        self.streamed: list[str] = []
        self.watched: list[str] = []
        #: watch lines handed to the step (it stops reading once it has its answer)
        self.lines_read = 0

    @staticmethod
    def unwrap(wrapped: str) -> str:
        argv = shlex.split(wrapped)
        assert argv[:2] == ["timeout", "--kill-after=5"] and argv[3:5] == ["sh", "-c"], wrapped
        return argv[5]

    def _answer(self, command: str) -> Reply:
        if command == 'printf "%s" "$HOME"':
            return Reply("", stdout=self.home_dir)
        for reply in self.replies:
            if reply.times != 0 and re.search(reply.pattern, command):
                if reply.times is not None:
                    reply.times -= 1
                return reply
        raise AssertionError(f"unexpected command on {self.host.name}: {command}")

    def _exec(self, command: str, *, timeout: float, stdin: bytes | None = None) -> tuple[int, str, str]:
        self.wrapped.append(command)
        plain = self.unwrap(command)
        self.commands.append(plain)
        self.stdins.append(stdin)
        self.timeouts.append(timeout)
        reply = self._answer(plain)
        if reply.raises is not None:
            raise reply.raises
        return reply.exit_code, reply.stdout, reply.stderr

    def _watch(self, command, on_line, *, timeout, cancelled, silence_s=None):
        """A watch answers with its reply's stdout, one line at a time, until on_line says stop."""
        self.wrapped.append(command)
        plain = self.unwrap(command)
        self.commands.append(plain)
        self.timeouts.append(timeout)
        self.watched.append(plain)
        reply = self._answer(plain)
        if reply.raises is not None:
            raise reply.raises
        for line in reply.stdout.splitlines():
            if cancelled.is_set():
                return None, ""
            self.lines_read += 1
            if on_line(line):
                return None, ""
        return reply.exit_code, reply.stderr

    def _put(self, local: Path, remote: str) -> None:
        self.uploads.append((remote, Path(local).read_bytes()))

    def _upload(self, directory: str, files: list[tuple[bytes, str, int]]) -> None:
        """Uploads are recorded as (absolute path, content, mode); a reply whose pattern matches
        ``upload <path>`` and that raises makes the upload fail."""
        def absolute(path: str) -> str:
            return f"{self.home_dir}/{path[2:]}" if path.startswith("~/") else path

        self.upload_dirs.append(absolute(directory))
        for content, remote, mode in files:
            for reply in self.replies:
                if reply.raises is not None and re.search(reply.pattern, f"upload {absolute(remote)}"):
                    raise reply.raises
            self.uploads.append((absolute(remote), content))
            self.upload_modes[absolute(remote)] = mode

    def _stream(self, command: str) -> int:
        self.streamed.append(command)
        return 0


__all__ = ["ExecTimedOut", "RecordingTransport", "Reply"]
