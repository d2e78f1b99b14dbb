"""Which router package serves the fleet: Shepherd Model Gateway (``smg``) or ``sglang-router``.

SGLang's router was renamed: sgl-router became sgl-model-gateway and is published as ``smg``
(1.13.0, October 2026); ``sglang-router`` stopped at 0.3.2 (January 2026). Both are still met on
hosts. What differs between them, read from the published wheels:

| | sglang-router 0.3.x | smg 1.13 |
|---|---|---|
| launcher module | ``sglang_router.launch_router`` | ``smg.launch_router`` |
| process title (setproctitle) | ``sglang::router`` | ``smg::router`` |
| worker API | ``/workers`` (0.3+; older ``/add_worker``) | ``/workers``, ids are UUIDv7 |
| a deleted worker leaves ``GET /workers`` | at once | after the drain settle (5 s default) |
| readiness | ``/health`` | ``/readiness`` (and ``/liveness``, ``/health``) |

Pure: the package is chosen from the versions the router host's package metadata reports
(``fleet_ops.py router-packages``, never an import: both load a ~100 MB Rust extension).
"""

from __future__ import annotations

from dataclasses import dataclass

from deploy.base.errors import DeployError, ExitCode, RemoteOutputError

SMG = "smg"
SGLANG_ROUTER = "sglang-router"
PACKAGES = (SMG, SGLANG_ROUTER)

#: launch_router's --policy choices per package (smg 1.13 router_args.COMMON_POLICY_CHOICES;
#: sglang-router 0.3.2 launch_router)
POLICIES = {
    SMG: ("random", "round_robin", "passthrough", "cache_aware", "power_of_two", "least_load", "manual",
          "consistent_hashing", "prefix_hash"),
    SGLANG_ROUTER: ("cache_aware", "round_robin", "random", "power_of_two", "manual"),
}
ALL_POLICIES = tuple(dict.fromkeys(POLICIES[SMG] + POLICIES[SGLANG_ROUTER]))

#: command-line marks of a running router of EITHER package: a router started before the host
#: switched packages must still be recognised as ours (stop-stale leaves it, ``down`` stops it).
#: Before setproctitle runs, the command line still names the launcher module.
ROUTER_CMDLINE_MARKS = ("sglang_router", "sglang::router", "smg.launch_router", "smg::router")

#: smg's core keeps a deleted worker in GET /workers for its drain settle time (the Rust core's
#: --drain-settle-secs, default 5; smg 1.13's Python launcher does not expose it)
SMG_DRAIN_SETTLE_S = 5.0


class RouterPackageError(DeployError):
    exit_code = ExitCode.FAILED


def parse_release(version: str, package: str) -> tuple[int, int]:
    try:
        major, minor = (int(x) for x in version.split(".")[:2])
    except ValueError:
        raise RemoteOutputError(f"{package} version {version!r} is not a release number") from None
    return major, minor


@dataclass(frozen=True)
class RouterPackage:
    name: str
    version: str

    @property
    def module(self) -> str:
        return "smg.launch_router" if self.name == SMG else "sglang_router.launch_router"

    @property
    def label(self) -> str:
        return f"{self.name} {self.version}"

    @property
    def workers_api(self) -> bool:
        """Workers managed at /workers (smg always; sglang-router from 0.3; older: /add_worker)."""
        return self.name == SMG or parse_release(self.version, self.name) >= (0, 3)

    @property
    def drain_settle_s(self) -> float:
        return SMG_DRAIN_SETTLE_S if self.name == SMG else 0.0

    @property
    def readiness_path(self) -> str:
        return "/readiness" if self.name == SMG else "/health"

    @property
    def policies(self) -> tuple[str, ...]:
        return POLICIES[self.name]


def choose_package(installed: dict[str, str | None], forced: str, where: str) -> RouterPackage:
    """The package to run: ``forced`` (router.package) or, for ``auto``, smg when both are there.

    ``installed`` maps each package name to its installed version or None; ``where`` names the
    router host and interpreter for the message.
    """
    found = {name: version for name, version in installed.items() if name in PACKAGES and version}
    if forced != "auto":
        if forced not in found:
            other = ", ".join(f"{n} {v}" for n, v in found.items()) or "neither smg nor sglang-router"
            raise RouterPackageError(f"{where}: router.package is {forced!r} but it is not installed there "
                                     f"(found: {other}); pip install {forced} there, or set router.package: auto")
        package = RouterPackage(forced, found[forced])
    elif SMG in found:
        package = RouterPackage(SMG, found[SMG])
    elif SGLANG_ROUTER in found:
        package = RouterPackage(SGLANG_ROUTER, found[SGLANG_ROUTER])
    else:
        raise RouterPackageError(f"{where}: no router package is installed (neither smg nor sglang-router); "
                                 "pip install smg there (SGLang's router, Shepherd Model Gateway), or set "
                                 "router.python to an interpreter that has it")
    package.workers_api  # a version that is no release number is refused here, before anything runs
    return package


#: which package a running router is, from its command line: the process title setproctitle gives
#: it (``smg::router``, ``sglang::router``), or before that the launcher module deployctl started
_RUNNING_MARKS = ((SMG, ("smg::router", "smg.launch_router")), (SGLANG_ROUTER, ("sglang::router", "sglang_router")))


def running_package(cmdline: str) -> str | None:
    """The package of the running router process (None: its command line names neither)."""
    return next((name for name, marks in _RUNNING_MARKS if any(m in cmdline for m in marks)), None)


def package_text(running: str | None, installed: RouterPackage | None) -> str:
    """What doctor and gpu-status say: the running router's package, and the installed one when it
    differs (a router started before the host switched packages runs on until it is restarted)."""
    if running is None:
        return installed.label if installed is not None else "unknown"
    if installed is None or installed.name == running:
        return installed.label if installed is not None else running
    return (f"{running} (the running router's command line); installed for router.python: {installed.label}, "
            "used at the next router start")


def policy_problem(package: RouterPackage, policy: str) -> str | None:
    if policy in package.policies:
        return None
    return (f"router.policy {policy!r} is not a policy of {package.label} "
            f"(expected one of {', '.join(package.policies)})")
