"""The desired deployment: what a run launches on a host, as one value, and how it compares with a record.

``desired_deployment`` is the one place "what this run launches" is computed: the SGLang argv (with
the drafter from the host's store and the doctor's decisions, e.g. ``--speculative-draft-model-
quantization unquant``), the environment's hash, the drafter's fingerprint and path, the SGLang
version, the draft tokens. The launch step writes ``DesiredDeployment.record()`` (a ``DeploymentRecord``,
deploy/host/records.py) as deployment.json;
converge, the fleet's pre-drain probe, a node group and ``deployctl status`` compare a recorded
deployment with it (``differences``), so they cannot disagree on what "configured" means.
Pure, below the steps (facts, doctor, steps, fleet and verbs all read it).
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from typing import Any

from deploy.config.models import Host, Run
from deploy.host.records import DeploymentRecord
from deploy.host.sglang_argv import DRAFT_QUANT_FLAG, DRAFTER_FLAG, sglang_argv
from deploy.host.state_layout import StatePaths

#: the fields that make two deployments the same server (the rest is bookkeeping)
IDENTITY = ("argv", "drafter_fingerprint", "env_hash", "sglang_version")
#: what must be the same for a drafter swap (issue 29) once the drafter is put back: a tensor update
#: changes nothing else of the running server (SGLang 0.5.21+'s weight-update session)
SWAP_SAME = ("argv", "env_hash", "env_file", "sglang_version", "draft_tokens")


def env_hash(env: dict[str, str]) -> str:
    """sha256 of the sorted environment: compares runs without keeping the values anywhere."""
    text = "".join(f"{k}={v}\n" for k, v in sorted(env.items()))
    return hashlib.sha256(text.encode()).hexdigest()


#: ``drafter_update.how`` of a record whose server holds a drafter nobody verified (issue 38): a swap
#: whose tensors went out (``swapping``, written before the first one leaves) and whose outcome was
#: not verified (``swap-failed``: another weight_version, an unreadable answer, a signal, a crash).
#: Such a server is never "already running as desired" and never the last good deployment.
UNKNOWN_DRAFTER = ("swapping", "swap-failed")
UNKNOWN_DRAFTER_WORDS = "drafter unknown (a drafter swap into this server was not verified)"


def drafter_unknown(record: DeploymentRecord | None) -> bool:
    return record is not None and record.drafter_update is not None and record.drafter_update.how in UNKNOWN_DRAFTER


def identity(record: DeploymentRecord | None) -> dict[str, Any] | None:
    """The fields that make two deployments the same server; None for no record or a record whose
    server's drafter is unknown (equal to nothing, itself included)."""
    if record is None or drafter_unknown(record):
        return None
    return {k: getattr(record, k) for k in IDENTITY}


@dataclass(frozen=True)
class DesiredDeployment:
    """What one host is to run; ``record()`` is the deployment.json the launch writes (plus pid, log)."""

    run: str | None
    argv: tuple[str, ...]
    drafter_fingerprint: str | None
    #: the drafter the argv names (the host's store path once fix-keys ran; the run's path before)
    drafter_path: str | None
    env_hash: str | None
    sglang_version: str | None
    draft_tokens: int | None
    #: the environment file the launch sources (None: the run sets no env)
    env_file: str | None
    #: the doctor's --speculative-draft-model-quantization decision, kept so that a reader without the
    #: doctor's facts (``deployctl status``) builds the same argv
    draft_quantization: str | None = None

    def record(self) -> DeploymentRecord:
        """The deployment record of this deployment (every field given: an absent one means an older record)."""
        return DeploymentRecord.model_validate(asdict(self) | {"argv": list(self.argv)})

    def differences(self, recorded: DeploymentRecord | None, fields: tuple[str, ...] = IDENTITY) -> list[str]:
        """The identity fields (or ``fields``) in which ``recorded`` differs, as words ("drafter fingerprint")."""
        if recorded is None:
            return ["no deployment recorded"]
        want = self.record()
        changed = [key.replace("_", " ") for key in fields if getattr(want, key) != getattr(recorded, key)]
        if "drafter_fingerprint" in fields and drafter_unknown(recorded):
            changed = [c for c in changed if c != "drafter fingerprint"] + [UNKNOWN_DRAFTER_WORDS]
        return changed

    def with_drafter(self, path: str | None, fingerprint: str | None) -> DesiredDeployment:
        """This deployment with another drafter in its argv's drafter slot (the one ``sglang_argv``
        writes): what this run would launch with ``path``. ``differences`` of it with a running
        record says what changed besides the drafter (the drafter swap's rule)."""
        argv = list(self.argv)
        if DRAFTER_FLAG in argv and argv.index(DRAFTER_FLAG) + 1 < len(argv) and path is not None:
            argv[argv.index(DRAFTER_FLAG) + 1] = path
        return replace(self, argv=tuple(argv), drafter_path=path, drafter_fingerprint=fingerprint)

    def runs_in(self, recorded: DeploymentRecord | None) -> bool:
        return not self.differences(recorded)

    @classmethod
    def of_record(cls, record: DeploymentRecord) -> DesiredDeployment:
        """A recorded deployment as the desired one (a rollback relaunches the last good one exactly)."""
        return cls(run=record.run, argv=tuple(record.argv), drafter_fingerprint=record.drafter_fingerprint,
                   drafter_path=record.drafter_path, env_hash=record.env_hash, sglang_version=record.sglang_version,
                   draft_tokens=record.draft_tokens, env_file=record.env_file,
                   draft_quantization=recorded_draft_quantization(record, None))


def desired_deployment(run: Run, host: Host, draft_tokens: int | None = None, *, drafter_path: str | None = None,
                       drafter_fingerprint: str | None = None, sglang_version: str | None = None,
                       draft_quantization: str | None = None) -> DesiredDeployment:
    """What ``run`` launches on ``host``: ``drafter_path`` the drafter's store path (fix-keys), the
    SGLang version and the doctor's draft-quantization decision as read on the host."""
    tokens = run.draft_tokens if draft_tokens is None else draft_tokens
    return DesiredDeployment(
        run=run.name, argv=tuple(sglang_argv(run, host, tokens, drafter_path, draft_quantization)),
        drafter_fingerprint=drafter_fingerprint, drafter_path=drafter_path or run.drafter,
        env_hash=env_hash(run.env), sglang_version=sglang_version, draft_tokens=tokens,
        env_file=StatePaths(host.state_dir).env_file if run.env else None, draft_quantization=draft_quantization)


def recorded_draft_quantization(record: DeploymentRecord, run: Run | None) -> str | None:
    """The doctor's draft-quantization decision a recorded launch was made with: the record's field,
    or (a record written before it existed) the flag in its argv that the run's extra_args did not set."""
    if "draft_quantization" in record.model_fields_set:
        return record.draft_quantization
    argv = record.argv
    if DRAFT_QUANT_FLAG not in argv:
        return None
    if run is not None and DRAFT_QUANT_FLAG in run.extra_args:
        return None  # the user's own flag: sglang_argv passes extra_args as they are
    at = argv.index(DRAFT_QUANT_FLAG) + 1
    return argv[at] if at < len(argv) else None
