"""Whose failure it was: the checkpoint's, the benchmark harness's, or the host's. Decided once, here.

Before issue 28, ``steps/quarantine.py`` judged by step name: any failure in ``benchmark`` or
``regression-gate`` counted as the deployment's own, so a client-side benchmark failure (a dataset
mismatch, bench_serving crashing, a timeout) rolled a verified deployment back and quarantined its
fingerprint, and every later night exited 13. Now the cause is typed, from the step AND the error:

- the checkpoint's (quarantined after a new deployment): it crashed or failed to load (the server
  died, whichever step noticed), it never became ready (wait-ready timed out or /health answered
  an error), its acceptance was below the threshold (verify-acceptance), a conclusive regression;
- the checkpoint's refusals before anything was launched (issue 39: recorded as "host" before): its
  tensor names SGLang would not load (fix-keys' verification), a checkpoint that cannot be read
  (exit 6), and a quarantined fingerprint refused (exit 13); named the checkpoint's, never
  quarantined (again) for it: nothing was launched;
- the benchmark harness's: any other failure of the ``benchmark`` step (``BenchmarkHarnessFailed``,
  a timeout): reported as such, nothing quarantined, the deployment stays when this run verified it;
- the host's: everything else (connection, lock, GPUs never freed, a launch command that could not
  write its files, a record that could not be read), never the checkpoint's;
- interrupted: a signal.

``deployment_stays`` says when a failure must not roll back: it is not the checkpoint's and this
run verified the deployment (verify-acceptance passed), so the host serves a verified deployment.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from typing import Any

from deploy.base.errors import (BenchmarkHarnessFailed, ConnectionFailed, DeployError, ExitCode, Interrupted, LockHeld,
                                Quarantined, Regression, ServerDied, ServerUnhealthy, StepTimeout, VerificationFailed)


class Cause(str, Enum):
    CRASHED = "crashed"
    NOT_READY = "not-ready"
    ACCEPTANCE = "acceptance-below-threshold"
    REGRESSION = "regression"
    HARNESS = "benchmark-harness"
    HOST = "host"
    #: the checkpoint's, refused before anything was launched (issue 39)
    INVALID = "checkpoint-invalid"
    QUARANTINED = "checkpoint-quarantined"
    INTERRUPTED = "interrupted"

    @property
    def checkpoints_fault(self) -> bool:
        return self in CHECKPOINT_CAUSES or self in CHECKPOINT_REFUSALS

    @property
    def quarantines(self) -> bool:
        """A failure of a launched deployment that quarantines its fingerprint (not a refusal before the launch)."""
        return self in CHECKPOINT_CAUSES

    def describe(self) -> str:
        return {
            Cause.CRASHED: "the checkpoint's: the server crashed or failed to load",
            Cause.NOT_READY: "the checkpoint's: the server never became ready",
            Cause.ACCEPTANCE: "the checkpoint's: acceptance below the threshold",
            Cause.REGRESSION: "the checkpoint's: a conclusive regression against the last good deployment",
            Cause.HARNESS: "the benchmark harness's, not the checkpoint's",
            Cause.HOST: "the host's or the connection's, not the checkpoint's",
            Cause.INVALID: "the checkpoint's: SGLang would not load it as it is (its tensors, names or files)",
            Cause.QUARANTINED: "the checkpoint's: its fingerprint is quarantined on this host (it failed here before)",
            Cause.INTERRUPTED: "interrupted by a signal",
        }[self]


CHECKPOINT_CAUSES = frozenset({Cause.CRASHED, Cause.NOT_READY, Cause.ACCEPTANCE, Cause.REGRESSION})
#: the checkpoint's, found before a launch: reported as the checkpoint's, not quarantined for it
CHECKPOINT_REFUSALS = frozenset({Cause.INVALID, Cause.QUARANTINED})


def failure_cause(step: str, error: DeployError) -> Cause:
    """The one classification of a failed step (``step``: its playbook name, a ``rollback/`` label ignored)."""
    step = step.rsplit("/", 1)[-1]
    if isinstance(error, Interrupted):
        return Cause.INTERRUPTED
    if isinstance(error, (ConnectionFailed, LockHeld)):
        return Cause.HOST
    if isinstance(error, Quarantined):
        return Cause.QUARANTINED
    if error.exit_code == ExitCode.CHECKPOINT or (step == "fix-keys" and isinstance(error, VerificationFailed)):
        # exit 6 is only ever the checkpoint's (not safetensors, truncated, unreadable); fix-keys' verification
        # failing is SGLang refusing the checkpoint's tensor names or shapes
        return Cause.INVALID
    if isinstance(error, ServerDied):
        # engine.session.died: the launched server is gone, whatever step noticed (a crash on load, on generate)
        return Cause.CRASHED
    if isinstance(error, Regression):
        return Cause.REGRESSION
    if step == "benchmark" or isinstance(error, BenchmarkHarnessFailed):
        return Cause.HARNESS
    if step == "wait-ready" and isinstance(error, (StepTimeout, ServerUnhealthy)):
        return Cause.NOT_READY
    if step == "verify-acceptance" and isinstance(error, VerificationFailed):
        return Cause.ACCEPTANCE
    return Cause.HOST


def verified_in_this_run(records: Sequence[Any]) -> bool:
    return any(getattr(r, "name", None) == "verify-acceptance" and getattr(r, "status", None) == "ok" for r in records)


def deployment_stays(cause: Cause, records: Sequence[Any]) -> bool:
    """No rollback: the failure is not the checkpoint's and this run verified the deployment it serves."""
    return not cause.checkpoints_fault and cause is not Cause.INTERRUPTED and verified_in_this_run(records)
