"""The router as ``plan`` walks a run-level phase (fleet/phases.py PlanContext).

Each method is the plan's side of the ``RouterHost`` method of the same name (fleet/router.py): it
lists every command that method may send, through the same ``RouterCalls`` builders, on either
management API (smg and sglang-router 0.3.x: ``/workers``; older: ``/list_workers``,
``/add_worker``, ``/remove_worker``), and answers as the plan assumes: the router runs and lists
every replica of the run that the walk has not taken out, healthy. The phases themselves are
written once (fleet/rolling.py, fleet/canary.py); ``tests/unit/test_fleet_phases.py`` drives
``RouterHost`` over a table of router answers and checks every command it sends is one its
``PlannedRouter`` method lists.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deploy.facts.router import EndToEnd, RouterState, StopAnswer, Worker
from deploy.fleet.router_ports import router_binds
from deploy.host.state_layout import router_log_name

RUNNING = "the router runs"
OLDER = "the router is older than 0.3"
DIED = "the router this run saw died (exit 14)"
RESTART = ("the router this run saw died mid-roll (router_watch.py): the roll stops, exit 14, and the router is "
           "started again with every replica that answers /health")


class PlannedRouter:
    def __init__(self, ctx: Any):
        view = ctx.view
        self.ctx, self.calls, self.at = ctx, view.calls, view.router_host
        self.spec = view.run.router
        self.host = view.network(view.config.host(self.at))
        self.url = self.calls.url
        self.package_read = False  # RouterHost.package() reads it once per run
        self.leaving: set[str] = set()
        self.health: dict[str, Any] = {}

    def _send(self, call: Any, when: str | None = None) -> None:
        self.ctx.send(self.at, call, when)

    def _package(self) -> None:
        if not self.package_read:
            self.package_read = True
            self._send(self.calls.packages(), "the first router call of the run that needs the package (it and "
                                              "its version decide the launcher module and the API)")

    def _members(self, until: str) -> None:
        """RouterHost.wait_members' host-side loop, on either API."""
        self._send(self.calls.watch_members(True), until)
        self._send(self.calls.watch_members(False), f"{until}; {OLDER}")

    # -- RouterHost's methods -----------------------------------------------------------------

    def state(self) -> RouterState:
        self._send(self.calls.state())
        return RouterState(alive=True, pid=0, status=200)

    def running(self) -> bool:
        return self.state().alive

    def workers(self) -> list[Worker]:
        self._package()
        self._send(self.calls.workers(True))
        self._send(self.calls.workers(False), OLDER)
        out = {h.name for h in self.ctx.config.hosts_of(self.ctx.run)
               if (marks := self.ctx.rotation.get(h.name)) is not None and marks.still_out()}
        return [Worker(id="<worker id>", url=self.ctx.url(h), is_healthy=True)
                for h in self.ctx.config.hosts_of(self.ctx.run) if h.name not in out]

    def unreachable(self, urls: list[str], timeout: float = 3) -> list[str]:
        self._send(self.calls.reach(urls, timeout))
        return []

    def checks(self) -> list[Any]:
        """fleet/doctor.py router_checks: the package, the running router, every port it binds."""
        spec = self.spec
        self._send(self.calls.packages())
        self._send(self.calls.state())
        self._send(self.calls.ports(router_binds(spec, self.host, None if spec.package == "auto" else spec.package)))
        return []

    def start(self, workers: list[str], stamp: str) -> int:
        self._package()
        self._send(self.calls.start(workers, router_log_name(stamp)))
        self._members("until every worker it was started with is listed healthy")
        self._send(self.calls.log_tail(), "the router died while starting")
        return 0

    def stop(self, grace: float = 15) -> StopAnswer:
        self._send(self.calls.stop(grace))
        return StopAnswer(pid=None, stopped=True, signal="TERM", note="")

    def log_tail(self, lines: int = 30) -> str:
        self._send(self.calls.log_tail(lines))
        return ""

    def add(self, url: str) -> None:
        self._package()
        self._send(self.calls.add(url, True))
        self._send(self.calls.add(url, False), OLDER)
        self._members(f"until {url} is listed healthy")

    def remove(self, url: str, settle: bool = True) -> float:
        self._package()
        self._send(self.calls.workers(True), "the worker's id (smg, sglang-router 0.3.x)")
        self._send(self.calls.remove(url, "<worker id>", True), "the router lists it")
        self._send(self.calls.remove(url, "", False), OLDER)
        if settle:
            self._members("until it is gone")
        else:
            self._members("until it is listed unhealthy or gone")
            self.leaving.add(url)
        return 0.0

    def settled(self) -> None:
        if self.leaving:
            self._members("until the workers removed before are gone from the list (smg's drain settle, 5 s)")
            self.leaving.clear()

    def healthy(self, url: str) -> bool:
        call = self.health.get(url)
        if call is None:  # built once per replica: every batch's router-add lists every replica's /health
            call = self.health[url] = self.calls.health(url)
        self._send(call)
        return True

    def drain(self, url: str, timeout: float) -> float:
        self._send(self.calls.watch_loads(url), "it was taken out: until nothing is in flight")
        return 0.0

    def watch_metrics(self, urls: list[str], interval_s: float, window_s: float,
                      observe: Callable[[dict, float], bool]) -> None:
        self._send(self.calls.watch_metrics(urls, interval_s, window_s))

    def end_to_end(self) -> EndToEnd:
        self._send(self.calls.end_to_end())
        return EndToEnd(text="")

    # -- router_watch.py's, over this router ------------------------------------------------------

    def watch(self, when: str) -> RouterState | None:
        """router_watch.watch: the router's state; its log tail when the router this run saw died."""
        got = self.state()
        self._send(self.calls.log_tail(), f"{DIED}, {when}")
        if self.ctx.memory.router_pid is None:
            self.ctx.memory.router_pid = 0
        return got

    def lost_or_restarted(self, when: str, replicas: list[str]) -> None:
        """router_watch.lost_or_restarted: watched; a router that died is started again with every
        replica that answers /health (restart_with_healthy)."""
        self.watch(when)
        for _ in self.ctx.only_when(True, RESTART):
            for url in replicas:
                self.healthy(url)
            self.start(replicas, self.ctx.stamp)
