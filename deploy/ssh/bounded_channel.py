"""Reading a remote command's answer within a byte limit and a deadline (one SSH channel).

fabric's ``Connection.run(hide=True)`` keeps all of stdout in memory: an nvidia-smi (or a shim
in its place) printing 60 MB took over 90 s and as much memory, and an endless one would never
end before the local timeout. Here the channel is read as output arrives (Ctrl-C is noticed
within 0.05 s, the deadline as it passes) and closed as soon as either stream passes the limit: the host-side
command then dies of SIGPIPE on its next write. The caller turns :class:`OutputTooLarge` into a
RemoteOutputError (exit 5) naming the host and command.
"""

from __future__ import annotations

import threading
import time

#: the largest answer a command may print (a 100k-line ``deployctl logs -n`` of long lines fits;
#: every fact deployctl reads is a few KB)
MAX_OUTPUT_BYTES = 16 << 20
#: the longest line a host-side watch loop may print before its newline
MAX_LINE_BYTES = 1 << 20
#: how often a command that may be cancelled (Ctrl-C) looks at its ``cancelled`` event
CANCEL_POLL_S = 0.05
#: the longest a command that cannot be cancelled sleeps between looks at its deadline: it wakes
#: at once when output, EOF or the exit status arrives
IDLE_WAIT_S = 1.0


class OutputTooLarge(Exception):
    def __init__(self, stream: str, limit: int):
        super().__init__(f"printed more than {limit} bytes on {stream}")
        self.stream = stream
        self.limit = limit


class DeadlinePassed(Exception):
    pass


class Cancelled(Exception):
    """``cancelled`` was set while the command ran (Ctrl-C, SIGTERM, SIGHUP): the caller closes the channel.
    ``stderr``: what the command printed on stderr until then (its process group's mark, transport.py)."""

    def __init__(self, command: str, stderr: bytes = b""):
        super().__init__(command)
        self.stderr = stderr


def exec_bounded(channel, command: str, *, deadline: float, limit: int = MAX_OUTPUT_BYTES,
                 cancelled=None, stdin: bytes | None = None) -> tuple[int, bytes, bytes]:
    """Run ``command`` on the open session ``channel``: (exit status, stdout, stderr), each at most ``limit``.

    ``stdin``: sent to the command, then EOF (a record written on the host travels here, never on a
    command line another user reads in /proc/*/cmdline, nor into ARG_MAX: issue 38); sent as the
    channel's window allows, between reads, so a command that answers before it has read all of it
    never deadlocks against us. Raises OutputTooLarge, DeadlinePassed or Cancelled (``cancelled``: a
    threading.Event, checked at every poll, so a signal reaches a running bench_serving or fix-keys
    within 0.05 s instead of when the command ends; the channel is left to the caller to close).
    """
    channel.settimeout(0.05)
    # Woken by paramiko when output arrives or a stream closes (BufferedPipe.set_event), so a command
    # that prints nothing for seconds costs a wake-up per CANCEL_POLL_S (or IDLE_WAIT_S), not one per
    # 0.02 s: at 0.02 s polls a 2.5 s `status` read cost 6 ms of deployctl's CPU per host (issue 37).
    woken = threading.Event()
    channel.in_buffer.set_event(woken)
    channel.in_stderr_buffer.set_event(woken)
    channel.exec_command(command)
    out, err = bytearray(), bytearray()
    pending = memoryview(stdin) if stdin is not None else None
    while True:
        woken.clear()  # before the reads: output fed after them sets it again, and the wait returns at once
        progressed = False
        if pending is not None:
            if not pending:
                channel.shutdown_write()
                pending = None
            elif channel.send_ready():
                pending = pending[channel.send(pending[:1 << 15]):]
                progressed = True
            elif channel.exit_status_ready():
                pending = None  # it ended without reading the rest: its answer says why
        if channel.recv_ready():
            out += channel.recv(1 << 16)
            progressed = True
        if channel.recv_stderr_ready():
            err += channel.recv_stderr(1 << 16)
            progressed = True
        if len(out) > limit:
            raise OutputTooLarge("stdout", limit)
        if len(err) > limit:
            raise OutputTooLarge("stderr", limit)
        if cancelled is not None and cancelled.is_set():
            raise Cancelled(command, bytes(err))
        if not progressed:
            if channel.exit_status_ready() and not channel.recv_ready() and not channel.recv_stderr_ready():
                if channel.eof_received or channel.closed:
                    break
            now = time.monotonic()
            if now > deadline:
                raise DeadlinePassed(command)
            if channel.exit_status_ready():
                time.sleep(0.005)  # the EOF follows the exit status at once
            elif pending is not None:
                channel.status_event.wait(0.02)  # the channel's window opening for stdin wakes nothing
            else:
                wait = CANCEL_POLL_S if cancelled is not None else IDLE_WAIT_S
                # after the EOF (OpenSSH sends it before the exit status) only the exit status is left to wait for
                (channel.status_event if channel.eof_received else woken).wait(min(wait, max(deadline - now, 0.0) + 0.01))
    return channel.recv_exit_status(), bytes(out), bytes(err)
