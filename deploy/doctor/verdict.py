"""What every doctor check takes and returns: the facts of one host (``DoctorInput``) and a verdict
(``Check``). Kept apart from the checks themselves so that check modules (checks.py, speculation.py)
import it without importing each other."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Literal, Optional

from deploy.config.models import Host, Run
from deploy.facts.doctor import HostFacts, SglangFacts

Status = Literal["pass", "warn", "fail"]


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    reason: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


@dataclass(frozen=True)
class DoctorInput:
    host: Host
    run: Run
    draft_tokens: int
    facts: HostFacts
    sglang: Optional[SglangFacts]
    #: the playbook runs fix-keys after the doctor: a speculators drafter is judged as converted
    fix_keys_will_run: bool = True
    hidden_states_from: str = "keep"
    #: why the SGLang facts are missing (sglang_python cannot be run), when they are
    sglang_error: Optional[str] = None


def version_tuple(version: Optional[str]) -> Optional[tuple[int, int, int]]:
    if not version:
        return None
    match = re.match(r"^v?(\d+)\.(\d+)(?:\.(\d+))?", version)
    if not match:
        return None
    return int(match.group(1)), int(match.group(2)), int(match.group(3) or 0)
