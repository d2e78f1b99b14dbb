"""What a host serves after a run: the one decision behind every headline, JSON report and history row.

Four answers, each only what is known:

- ``serving``: a deployment verified in this run (or restored by the rollback and verified), or the
  server that was running untouched and is the host's last good deployment, answering /health 200;
- ``unverified``: a server process runs (its pid) but nothing verified it: still loading, failed
  verification, or not the last good deployment;
- ``nothing``: no SGLang server of deployctl's runs;
- ``unknown``: the host could not be asked (unreachable, the read failed, another run holds the lock).

Before this, the headlines were fixed sentences that could contradict the facts: "THE HOST IS SERVING
NOTHING" while a new server was loading after a network freeze, "nothing was stopped, the running
server keeps serving" when nothing ran, ``ok`` for a host whose steps never ran.
"""

from __future__ import annotations

from dataclasses import dataclass
from collections.abc import Mapping
from typing import Any, Literal, Optional

from deploy.facts.server import same_deployment
from deploy.host.records import LastGood

State = Literal["serving", "unverified", "nothing", "unknown"]


@dataclass(frozen=True)
class Serving:
    state: State
    pid: Optional[int] = None
    detail: str = ""

    def headline(self) -> str:
        if self.state == "serving":
            return f"THE HOST IS SERVING a verified deployment (pid {self.pid}){': ' + self.detail if self.detail else ''}"
        if self.state == "unverified":
            return (f"THE HOST SERVES NO VERIFIED DEPLOYMENT: pid {self.pid} runs unverified"
                    f"{' (' + self.detail + ')' if self.detail else ''}")
        if self.state == "nothing":
            return "THE HOST IS SERVING NOTHING (no SGLang server of deployctl's is running)"
        return f"WHAT THE HOST SERVES IS UNKNOWN{': ' + self.detail if self.detail else ''}"

    def to_dict(self) -> dict[str, Any]:
        return {"state": self.state, "pid": self.pid, "detail": self.detail}


def decide(*, verified_pid: Optional[int], state: Any = None, state_error: Optional[str] = None,
           stopped: bool = False, last_good: Optional[LastGood] = None, reached: bool = True,
           why_unreached: str = "", down: bool = False, launched: frozenset[int] = frozenset(),
           failed: Optional[Mapping[int, str]] = None) -> Serving:
    """``verified_pid``: the server this run verified (or its rollback restored and verified), if any.
    ``state``: the server-state read after the run (facts.server.ServerState), when one was made;
    ``state_error``: why that read failed. ``stopped``: this run (or its rollback) stopped the server
    that ran before. ``launched``: the PIDs this run launched (its own launch, its rollback's).
    ``failed``: PID -> what its verification in this run said when it failed (a converged server whose
    acceptance fell below the threshold, a rollback's relaunch). ``down``: the verb's purpose was to stop it.

    "The last good deployment, untouched by this run" only for a server this run neither stopped,
    launched nor failed to verify (issue 28: acceptance 1.40 against 1.5 on an unchanged checkpoint
    was headlined "serving a verified deployment ... untouched")."""
    if not reached:
        return Serving("unknown", None, why_unreached or "the host was not reached")
    if state is None:
        if state_error:
            return Serving("unknown", None, f"reading the server's state failed: {state_error}")
        if verified_pid is not None:
            return Serving("serving", verified_pid, "verified in this run")
        if down:
            return Serving("nothing", None, "stopped by this run")
        return Serving("unknown", None, "the server's state was not read")
    if not state.alive:
        return Serving("nothing")
    if verified_pid is not None and state.pid == verified_pid:
        health = "" if state.status == 200 else f"; now /health {state.status or state.error}"
        return Serving("serving" if state.status == 200 else "unverified", state.pid, f"verified in this run{health}")
    health = f"/health {state.status}" if state.status is not None else f"/health no answer ({state.error})"
    why_failed = (failed or {}).get(state.pid) if state.pid is not None else None
    if why_failed is not None:
        return Serving("unverified", state.pid, f"{health}; failed verification in this run: {why_failed}")
    if state.pid in launched:
        return Serving("unverified", state.pid, f"{health}; launched by this run, not verified")
    if not stopped and state.status == 200 and same_deployment(state.record, last_good):
        return Serving("serving", state.pid, "the last good deployment, untouched by this run")
    return Serving("unverified", state.pid, f"{health}; {'launched by this run, not verified' if stopped else 'not the last good deployment'}")

