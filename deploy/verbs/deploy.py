"""up, restart, down, plan and nightly: one request, one engine call, one result.

The command line becomes one ``DeployRequest`` (deploy/cli/ builds it and does nothing else).
``prepare`` resolves it against the config without a connection: the run and its hosts, the
rollout and every refusal it decides (deploy/fleet/rollout.py), the playbook with the settings the
request changes and its benchmark dataset. ``plan`` and ``run`` take that one value: ``plan``
lists what the run would send (``--dry-run``, ``deployctl plan``), ``run`` performs it under the
locks (``engine.run.run_locked``). Both return a ``DeployResult`` that the CLI renders and whose
``exit_code`` it returns (httpie's ``main(args, env) -> ExitStatus``). A refusal is raised by
``prepare``, before anything is connected, locked or changed.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from deploy.verbs.selection import rollout_of, run_and_hosts, with_dataset

if TYPE_CHECKING:  # pydantic and the engine stay unimported until a verb runs (a fast --help)
    from deploy.config.models import Config, Host, Run
    from deploy.engine.playbook import Playbook
    from deploy.engine.records import HostReport, Progress
    from deploy.engine.run import RunReport
    from deploy.fleet.rollout import Rollout

Verb = Literal["up", "restart", "down", "plan", "nightly"]


@dataclass(frozen=True)
class DeployRequest:
    """What the command line asked, as one value."""

    verb: Verb
    config_path: Path
    #: the playbook's name or YAML file (``plan``: its argument; else ``--playbook`` or the verb's own)
    playbook: str
    run_name: str | None = None
    #: ``--host`` (only these hosts of the run)
    host_names: tuple[str, ...] = ()
    draft_tokens: int | None = None
    #: ``--dataset`` (relative to the current directory); None: the playbook's own setting
    dataset: str | None = None
    dry_run: bool = False
    force: bool = False
    no_rollback: bool = False
    serial: int | None = None
    allow_downtime: bool = False
    canary: bool = False
    ignore_doctor: bool = False
    replace: bool = False
    retry_failed: bool = False
    #: down --free-gpus
    free_gpus: bool = False
    #: --swap-drafter ("swap") or --reload ("reload"); None: the run's drafter_update
    drafter_update: str | None = None
    #: nightly's regression gate; None: the playbook's
    min_accept_fraction: float | None = None
    min_throughput_fraction: float | None = None

    @property
    def plans_only(self) -> bool:
        return self.dry_run or self.verb == "plan"


def step_settings(request: DeployRequest) -> dict[str, dict[str, Any]]:
    """The playbook's step settings the request changes, by step name."""
    settings: dict[str, dict[str, Any]] = {}
    if request.ignore_doctor:
        settings["doctor"] = {"ignore": True}
    if request.replace:
        settings.setdefault("doctor", {})["replace"] = True
    if request.retry_failed:
        settings["quarantine"] = {"retry_failed": True}
    if request.drafter_update is not None:
        settings["swap-drafter"] = {"mode": request.drafter_update}
    if request.free_gpus:
        settings["free-gpus"] = {"enabled": True}
        settings["wait-gpus-free"] = {"enabled": True}
    gate = {k: v for k, v in (("min_accept_fraction", request.min_accept_fraction),
                              ("min_throughput_fraction", request.min_throughput_fraction)) if v is not None}
    if gate:
        settings["regression-gate"] = gate
    return settings


@dataclass(frozen=True)
class Prepared:
    """A request resolved against the config: what ``plan`` lists and ``run`` performs (the same)."""

    request: DeployRequest
    config: Config
    run: Run
    hosts: list[Host]
    rollout: Rollout
    playbook: Playbook


@dataclass
class DeployResult:
    """A plan (``plans`` set) or a run (``ran`` set) of one request, and its exit code."""

    request: DeployRequest
    run: Run
    exit_code: int
    #: a plan: every host's planned actions, the hosts' ssh endpoints, the run-level plan (None: no fleet)
    plans: dict | None = None
    endpoints: dict | None = None
    fleet_plan: dict | None = None
    #: a run: what ``run_locked`` returned
    ran: RunReport | None = None

    @property
    def reports(self) -> list[HostReport]:
        return list(self.ran.reports) if self.ran is not None else []

    @property
    def fleet(self) -> Any:
        """The fleet's or node group's phases (fleet.phases.RunResult) when they ran, else None."""
        phased = self.ran.phased if self.ran is not None else None
        return phased if getattr(phased, "phases", None) is not None else None

    @property
    def router(self) -> dict[str, Any] | None:
        """``down`` behind a router: what became of the router (fleet.phases.DownResult's DownRouter) as
        ``--json`` prints it, else None."""
        phased = self.ran.phased if self.ran is not None else None
        router = getattr(phased, "router", None)
        return router.document() if router is not None else None


def prepare(request: DeployRequest, config: Config) -> Prepared:
    """Resolve ``request`` (pure: no connection, no lock); every refusal is raised here."""
    from deploy.engine.playbook import load_playbook

    run, hosts = run_and_hosts(config, request.run_name, request.host_names, request.draft_tokens)
    name = request.playbook
    verb = name if request.verb == "plan" and name in ("up", "restart", "down") else request.verb
    rollout = rollout_of(config, run, verb, request.host_names, request.serial, request.allow_downtime,
                         playbook=name, canary=request.canary)
    playbook = load_playbook(name)
    for step, updates in step_settings(request).items():
        playbook = playbook.with_settings(step, **updates)
    # a playbook's benchmark dataset (nightly's gate compares only records of the same one): exit 3 if bad
    playbook = with_dataset(playbook, request.dataset, request.config_path)
    return Prepared(request, config, run, hosts, rollout, rollout.playbook(playbook))


def plan(prepared: Prepared) -> DeployResult:
    """What ``run`` would send, per host and for the fleet; touches nothing."""
    from deploy.engine.plan import plan_with_endpoints

    p = prepared
    plans, endpoints = plan_with_endpoints(p.playbook, p.run, p.hosts, p.config)
    plans, fleet_plan = p.rollout.plan(p.config, p.playbook, plans, endpoints)
    # a host whose ssh settings are refused (ssh_config) is planned as "ssh: ERROR": the plan
    # is still printed, but it exits with that error's code, like gpu-status (HOSTILE, issue 22)
    refused = [int(e["exit_code"]) for e in (endpoints or {}).values() if "error" in e]
    return DeployResult(p.request, p.run, max(refused) if refused else 0, plans=plans, endpoints=endpoints,
                        fleet_plan=fleet_plan)


def run(prepared: Prepared, progress: Progress) -> DeployResult:
    """Run it: local and host locks, the rollout's phases or one parallel playbook, history."""
    from deploy.engine.run import run_locked

    p, request = prepared, prepared.request
    down = p.rollout.verb == "down" or request.playbook == "down"
    runner = p.rollout.runner(p.config, p.playbook, progress)
    ran = run_locked(request.config_path, p.config, request.verb, p.playbook, p.run, p.hosts, progress,
                     rollback=not request.no_rollback and not down, force=request.force, runner=runner)
    return DeployResult(request, p.run, int(ran.exit_code()), ran=ran)


def execute(request: DeployRequest, config: Config, progress: Progress) -> DeployResult:
    """The one engine call of up, restart, down and plan: prepare, then plan or run."""
    prepared = prepare(request, config)
    return plan(prepared) if request.plans_only else run(prepared, progress)
