"""One value for a rollout: which hosts a verb touches, in which shape and batches, and what it refuses.

``Rollout.of`` is built once per verb from the config's run, its selected hosts, the verb, ``--host``,
``--serial`` and ``--allow-downtime``, and is pure (no connection, no file): ``plan``/``--dry-run``,
``up``, ``restart``, ``down``, ``bench`` and ``nightly`` all ask it, so a plan refuses exactly what
its run refuses (tests/unit/test_rollout.py generates the combinations). What it decides:

- the shape: ``hosts`` (the playbook on every host in parallel), ``fleet`` (a router or ``--serial``:
  rolling batches with the router's phases between them), ``nodes`` (one SGLang server across the
  run's ``nodes``); ``down`` runs no run-level phases (the router is told or stopped around it);
- the checked ``--serial`` and the batches;
- the ``--host`` rules: a node group is one server, ``--host`` cannot pick one node (nor can
  ``--serial`` split it);
- the playbook the router survives: ``stop-stale --scope user`` spares a router running on a
  replica host;
- the canary (``restart``/``nightly`` behind a router, with ``rollout.canary`` or ``--canary``): the
  first batch is the canary's ``replicas`` hosts, judged on live traffic before the others roll
  (fleet/canary.py); refused when no other replica would serve beside it to compare with.

What it cannot know without a connection stays a run-time check, in plan and run alike: a batch
that would take the router's last HEALTHY worker out (fleet/rolling.py, exit 2) depends on what the
router serves when the batch starts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from deploy.base.errors import UsageError

if TYPE_CHECKING:
    from deploy.config.models import CanarySpec, Host, Run
    from deploy.engine.playbook import Playbook

Shape = Literal["hosts", "fleet", "nodes"]

def batches(hosts: Sequence[Host], serial: int) -> list[tuple[Host, ...]]:
    return [tuple(hosts[i:i + serial]) for i in range(0, len(hosts), serial)]


def default_serial(run: Run, hosts: Sequence[Host]) -> int:
    """All at once without a router; one host at a time with one (the others keep serving)."""
    return 1 if run.router is not None else max(1, len(hosts))


def check_serial(serial: int, hosts: Sequence[Host], run: Run, allow_downtime: bool) -> None:
    """A typed ``--serial`` that takes every replica out of the router at once, where a smaller one
    exists. The default (1 with a router) is never refused here: a run with one replica has no
    smaller batch, and whether its only worker is the router's last healthy one is known only when
    the batch starts (fleet/rolling.py: exit 2 then, nothing changed; nothing serving yet: it goes)."""
    from deploy.fleet.router import empties_the_router

    leaving = min(serial, len(hosts))
    if run.router is not None and len(hosts) > 1 and empties_the_router(leaving, len(hosts) - leaving, allow_downtime):
        raise UsageError(f"--serial {serial} takes all {len(hosts)} replica(s) of run {run.name!r} out of the "
                         "router at once: nothing would serve; use a smaller --serial or --allow-downtime")


def canary_of(run: Run, verb: str, asked: bool) -> CanarySpec | None:
    """The canary settings a roll uses: ``restart`` and ``nightly`` (or their plans) behind a router, with
    the run's ``rollout.canary`` or ``--canary`` (then the defaults when the run sets none)."""
    from deploy.config.models import CanarySpec

    spec = run.rollout.canary if run.rollout is not None else None
    if asked and run.router is None:
        raise UsageError(f"--canary: run {run.name!r} has no router; a canary serves live traffic through it "
                         "beside the replicas that keep the last good drafter")
    if asked and spec is None:
        spec = CanarySpec()
    if verb not in ("restart", "nightly"):
        if asked:
            raise UsageError(f"--canary is for restart and nightly, not {verb}")
        return None
    return spec if run.router is not None else None


def router_spared(playbook: Playbook, run: Run) -> Playbook:
    """stop-stale --scope user must not stop a router that runs on a replica host."""
    from deploy.fleet.router_package import ROUTER_CMDLINE_MARKS

    if run.router is None:
        return playbook
    for step in playbook.steps:
        if step.name == "stop-stale":
            settings: Any = step.settings
            exclude = list(settings.exclude) + [m for m in ROUTER_CMDLINE_MARKS if m not in settings.exclude]
            return playbook.with_settings("stop-stale", exclude=exclude)
    return playbook


@dataclass(frozen=True)
class Rollout:
    verb: str
    run: Run
    #: the hosts this verb touches, in the config's order (``--host`` applied)
    hosts: tuple[Host, ...]
    shape: Shape
    #: hosts per batch (``fleet``: checked; ``hosts``/``nodes``: every host at once)
    serial: int
    #: the user typed ``--serial``
    typed_serial: bool
    allow_downtime: bool
    #: every host of the run is selected (``down`` of the whole run stops its router too)
    whole: bool
    #: the canary's settings: the first batch is judged on live traffic (fleet/canary.py); None: no canary
    canary: CanarySpec | None = None

    @classmethod
    def of(cls, run: Run, run_hosts: Sequence[Host], verb: str, host_names: Sequence[str] = (),
           serial: int | None = None, allow_downtime: bool = False, playbook: str | None = None,
           canary: bool = False) -> Rollout:
        """``run_hosts``: every host of the run; ``host_names``: ``--host`` (already known to be the
        run's); ``playbook``: the playbook's name when it is not the verb's own (``plan down``);
        ``canary``: ``--canary`` (the run's ``rollout.canary`` settings, else their defaults)."""
        if canary:
            canary_of(run, verb, True)  # --canary where no canary can be: refused whatever the shape
        hosts = tuple(h for h in run_hosts if not host_names or h.name in host_names)
        whole = {h.name for h in hosts} == {h.name for h in run_hosts}
        down = verb == "down" or playbook == "down"
        if run.nodes and not down:
            if host_names:
                raise UsageError(f"run {run.name!r} is one server across {', '.join(run.nodes)}: "
                                 "--host cannot pick a node")
            if serial is not None:
                raise UsageError(f"run {run.name!r} is one server across {', '.join(run.nodes)}: "
                                 "--serial cannot split it")
            return cls(verb, run, hosts, "nodes", max(1, len(hosts)), False, allow_downtime, whole)
        if down or (run.router is None and serial is None):
            return cls(verb, run, hosts, "hosts", max(1, len(hosts)), serial is not None, allow_downtime, whole)
        checked = serial or default_serial(run, hosts)
        if serial is not None:
            check_serial(checked, hosts, run, allow_downtime)
        spec = canary_of(run, verb, canary)
        if spec is not None and spec.replicas >= len(run_hosts):
            raise UsageError(f"the canary of run {run.name!r} is {spec.replicas} replica(s) of {len(run_hosts)}: "
                             "at least one other replica must serve the last good drafter beside it to compare with")
        return cls(verb, run, hosts, "fleet", checked, serial is not None, allow_downtime, whole, spec)

    @property
    def batches(self) -> list[tuple[Host, ...]]:
        if self.canary is not None:
            n = self.canary.replicas
            return [self.hosts[:n]] + batches(self.hosts[n:], self.serial)
        return batches(self.hosts, self.serial)

    @property
    def phased(self) -> bool:
        """Run-level phases (router batches, a node group's barriers) around the playbook."""
        return self.shape != "hosts"

    def playbook(self, playbook: Playbook) -> Playbook:
        """The playbook as this rollout runs (and plans) it: a router on a replica host is spared."""
        return router_spared(playbook, self.run)

    def with_run(self, run: Run) -> Rollout:
        """The same rollout of another value of its run (a bench round's draft tokens)."""
        return dataclasses.replace(self, run=run)

    def runner(self, config, playbook: Playbook, progress):
        """``run_locked``'s runner for a phased rollout; None: one parallel playbook."""
        if self.shape == "nodes":
            from deploy.fleet.nodes import run_nodes

            return lambda options: run_nodes(config, playbook, self.run, list(self.hosts), progress, options)
        if self.shape == "fleet":
            from deploy.fleet.rolling import run_fleet

            return lambda options: run_fleet(config, playbook, self, progress, options)
        if self.down and self.run.router is not None:
            from deploy.fleet.rolling import run_down

            return lambda options: run_down(config, playbook, self, progress, options)
        return None

    @property
    def down(self) -> bool:
        return self.verb == "down"

    def plan(self, config, playbook: Playbook, plans: dict, endpoints: dict | None) -> tuple[dict, dict | None]:
        """(the hosts' plans, the run-level plan or None), from what ``runner`` runs."""
        if self.shape == "nodes":
            from deploy.fleet.nodes import plan_nodes

            return plan_nodes(config, playbook, self.run, list(self.hosts), endpoints)
        if self.run.router is not None or self.shape == "fleet":
            from deploy.fleet.plan import plan_fleet

            return plans, plan_fleet(config, self, playbook if self.phased else None, endpoints)
        return plans, None
