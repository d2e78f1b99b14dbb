"""Errors a user can cause, each with the documented exit code the CLI returns.

The exit codes are part of the interface (cron jobs branch on them); see README "Exit codes" and docs/exit-codes.md.
"""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    OK = 0
    #: ``--check``: a change is needed; or a command ran and at least one host failed a step.
    FAILED = 1
    #: bad command-line flags (click's own usage errors use 2 as well).
    USAGE = 2
    #: the YAML config (hosts, runs) or a playbook is invalid.
    CONFIG = 3
    #: a host could not be reached: DNS, refused, timeout, auth, unknown or changed host key; or it died
    #: or froze mid-step (deploy/ssh/transport.py: "the host stopped answering").
    CONNECTION = 4
    #: a remote command printed something we do not recognise (never read as "fine").
    REMOTE_OUTPUT = 5
    #: the drafter checkpoint is not valid (not safetensors, truncated, holes, duplicate keys...).
    CHECKPOINT = 6
    #: a wait ran out of time (GPUs never freed, server never ready).
    TIMEOUT = 7
    #: verification failed: a tensor would be dropped by SGLang, or speculation accepts nothing.
    VERIFY = 8
    #: another deployctl holds the host's (or this config and run's) lock; the message names it.
    LOCKED = 9
    #: writing failed on the target filesystem (read-only, no space); nothing was changed.
    IO = 10
    #: a step after stop-stale failed; the last good deployment was restored and verified.
    ROLLED_BACK = 11
    #: nightly: a conclusive regression: acceptance, or throughput over the benchmark rounds
    #: (deploy/local/throughput_gate.py), below the configured fraction of the last good one.
    REGRESSION = 12
    #: restart/nightly: the drafter's fingerprint failed on this host before for a cause that was the
    #: checkpoint's (deploy/steps/failure_cause.py; its quarantine record); nothing was stopped.
    #: ``--retry-failed`` or a changed checkpoint.
    QUARANTINED = 13
    #: a roll behind the router stopped because the router died or stopped answering its management
    #: API; the replicas the roll had not touched serve as before (fleet/router_watch.py).
    ROUTER_LOST = 14
    #: SIGHUP (128 + 1): handled like Ctrl-C (deploy/base/signals.py)
    HANGUP = 129
    INTERRUPTED = 130
    #: SIGTERM (128 + 15): handled like Ctrl-C (deploy/base/signals.py)
    TERMINATED = 143


#: set by ``deployctl --traceback``: a bug (an exception deployctl did not expect) prints its traceback
#: instead of the one line "internal error: ... (run with --traceback)".
show_tracebacks = False


class DeployError(Exception):
    """Base for every error that is the user's or the environment's, not a bug of ours."""

    exit_code: ExitCode = ExitCode.FAILED

    def __init__(self, message: str, *, exit_code: ExitCode | None = None):
        super().__init__(message)
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class ConfigError(DeployError):
    exit_code = ExitCode.CONFIG


class UsageError(DeployError):
    exit_code = ExitCode.USAGE


class ConnectionFailed(DeployError):
    exit_code = ExitCode.CONNECTION


class HostKeyRejected(ConnectionFailed):
    pass


class RemoteOutputError(DeployError):
    """A remote command's output did not have the shape we require. Quotes the offending line."""

    exit_code = ExitCode.REMOTE_OUTPUT


class RemoteCommandFailed(DeployError):
    exit_code = ExitCode.FAILED


class StepTimeout(DeployError):
    exit_code = ExitCode.TIMEOUT


class VerificationFailed(DeployError):
    exit_code = ExitCode.VERIFY


class Interrupted(DeployError):
    """Ctrl-C (or SIGTERM from cron's supervisor): steps stop at their next poll."""

    exit_code = ExitCode.INTERRUPTED


class ServerDied(DeployError):
    """The SGLang server process is gone, whatever step noticed; the message carries its log tail."""

    exit_code = ExitCode.FAILED


class ServerUnhealthy(DeployError):
    """/health answered something other than 200 (ready) or 503 (loading)."""

    exit_code = ExitCode.FAILED


class LockHeld(DeployError):
    exit_code = ExitCode.LOCKED


class BenchmarkHarnessFailed(DeployError):
    """The benchmark client failed (bench_serving crashed, no result block, lost requests, a dataset it
    could not read, a timeout): the harness's failure, never the checkpoint's (no quarantine)."""

    exit_code = ExitCode.FAILED


class Regression(DeployError):
    exit_code = ExitCode.REGRESSION


class Quarantined(DeployError):
    exit_code = ExitCode.QUARANTINED
