"""The router, watched during a roll: a roll must never take a replica out of, or redeploy it
behind, a router that is gone.

Before this, a router killed mid-roll was read as "not running yet": ``restart --serial 1`` went on
taking replicas down without a drain (nothing to remove them from), started a new router holding
only the batch it had just redeployed, and exited 0 (855 failed requests behind smg, 1,366 behind
sglang-router). Now every router phase first asks ``watch``: once the run has seen the router (it
was running, or the run started it), a router whose process is gone, whose PID changed, or whose
management API (``GET /workers``) does not answer 200 ends the roll before the next removal with
``RouterLost`` (exit 14). The batch phase that puts back what its batch took out runs after a
failure too (``always``); it calls ``restart_with_healthy``: a router that died (not one that is
alive but not answering: its port is still held) is started again with EVERY replica of the run that
answers ``/health`` and serves a verified deployment, not only the current batch's.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from deploy.config.models import Host
from deploy.base.errors import DeployError, ExitCode
from deploy.facts.router import RouterState


class RouterLost(DeployError):
    exit_code = ExitCode.ROUTER_LOST


UNTOUCHED = "every replica the roll had not touched keeps serving"


def watch(state, router, when: str) -> RouterState | None:
    """The router's state (``fleet_ops.py router-state``); raises RouterLost when the router this run
    has seen is gone or not answering. None: no router was ever seen in this run (not running yet)."""
    got = router.state()
    seen = state.memory.router_pid
    alive, pid, status = got.alive, got.pid, got.status
    if seen is None:
        if alive and status == 200:
            state.memory.router_pid = pid
            return got
        if alive:  # running before this run, but its management API does not answer
            raise RouterLost(f"{router.host.name}: the router (pid {pid}) does not answer its management API "
                             f"(GET {router.url}/workers: {status or 'no answer'}) {when}; "
                             f"nothing was taken out; {UNTOUCHED}")
        return None
    if not alive or pid != seen:
        state.memory.router_died = True
        what = "died" if not alive else f"was replaced (pid {seen} -> {pid}, not by deployctl)"
        raise RouterLost(f"{router.host.name}: the router (pid {seen}) {what} {when}; the roll stops here, "
                         f"before the next removal; {UNTOUCHED}; its log ends:\n{router.log_tail()}")
    if status != 200:
        raise RouterLost(f"{router.host.name}: the router (pid {pid}) stopped answering its management API "
                         f"(GET {router.url}/workers: {status or 'no answer'}) {when}; the roll stops here, "
                         f"before the next removal; {UNTOUCHED}")
    return got


def started(state, pid: int) -> None:
    """The run started the router: from now on it is watched."""
    state.memory.router_pid, state.memory.router_died = pid, False
    if getattr(state, "router", None) is not None:  # a new router lists none of the old one's leaving workers
        state.router.leaving.clear()


def healthy_replicas(state, router, hosts: Sequence[Host], url_of: Callable[[Host], str],
                     serving: Callable[[Host], bool]) -> list[str]:
    """Worker URLs of every replica that may take requests: one the run touched must serve a verified
    deployment (``serving``), and each must answer ``/health`` 200 from the router host now."""
    urls = []
    for host in hosts:
        if host.name in state.reports and not serving(host):
            continue
        url = url_of(host)
        if router.healthy(url):
            urls.append(url)
    return urls


def restart_with_healthy(state, router, hosts: Sequence[Host], url_of: Callable[[Host], str],
                         serving: Callable[[Host], bool]) -> str:
    """Start the router again after it died mid-roll, with every healthy replica of the run."""
    urls = healthy_replicas(state, router, hosts, url_of, serving)
    if not urls:
        return "the router died and no replica answers /health: not restarted"
    pid = router.start(urls, state.stamp)
    started(state, pid)
    now = time.monotonic()
    for host in hosts:
        marks = state.rotation.get(host.name)
        # only a replica still out comes back in now: one the run had already put back keeps the
        # time it came back (issue 37: the report said 43-44 s out for a replica a poller saw out 19-22 s)
        if marks is not None and marks.still_out() and url_of(host) in urls:
            marks.back = now
    return f"the router had died: restarted (pid {pid}) with every healthy replica: {', '.join(urls)}"


def lost_or_restarted(state, router, when: str, replicas: Sequence[Host], url_of: Callable[[Host], str],
                      serving: Callable[[Host], bool]) -> str | None:
    """For the phase that puts a batch back (it runs after a failure too): a router an earlier phase
    saw die is started again with every healthy replica (what was done is returned); a router this
    phase finds gone is too, and RouterLost is raised (the roll stops here); a live router that
    does not answer raises RouterLost, nothing started over it. None: the router is as the run left it."""
    if state.memory.router_died:
        return restart_with_healthy(state, router, replicas, url_of, serving)
    try:
        watch(state, router, when)
    except RouterLost as lost:
        if not state.memory.router_died:
            raise  # alive but not answering: its port is held
        raise RouterLost(f"{lost}\n{restart_with_healthy(state, router, replicas, url_of, serving)}") from None
    return None
