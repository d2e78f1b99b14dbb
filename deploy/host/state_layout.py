"""The host's state directory (``host.state_dir``, never /tmp), spelled in one place.

Every file deployctl keeps on a host is named here; host-side helpers (deploy/remote/) get these
paths as arguments, never their own spelling:

    <state_dir>/
      server.pid          the PID launch started (its session id stops the TP workers)
      deployment.json     what launch started: argv, drafter fingerprint and path, env hash, SGLang version, PID, log
      last-good.json      the last deployment that was verified (record-good), what a rollback relaunches
      last-good.env       the environment file that deployment was launched with
      launch.env          the run's environment (0600), sourced by launch
      helpers/            deployctl's host-side helpers (deploy/remote/), uploaded by ensure-helper
      drafters/           the drafter store (fixed checkpoints, by fingerprint)
      logs/               one SGLang log per launch; logs/latest.log links to the newest
      router/PORT/        one router's router.pid and logs/ (fleets; one folder per router port)
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timezone

from deploy.base.shell import path_join

#: the link to the newest log, in logs/ of the server and of the router
LATEST_LOG = "latest.log"
#: one SGLang log per launch, named by UTC time (microseconds) and a random suffix: two launches in the
#: same second never share a log, and the names sort by time (launch prunes the oldest by this pattern)
SERVER_LOG_PATTERN = r"^sglang-[0-9]{8}T[0-9.]+Z(-[0-9a-f]+)?\.log$"
#: the log's name in a plan (known only when the launch runs)
SERVER_LOG_PLACEHOLDER = "sglang-<UTC time>-<random>.log"


def server_log_name() -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S.%fZ")
    return f"sglang-{stamp}-{secrets.token_hex(3)}.log"


def router_log_name(stamp: str) -> str:
    """The router's log of the run started at ``stamp`` (the run's launch stamp)."""
    return f"router-{stamp}.log"


@dataclass(frozen=True)
class StatePaths:
    """Files deployctl keeps in the host's persistent state directory (never /tmp)."""

    root: str

    @property
    def helpers(self) -> str:
        return path_join(self.root, "helpers")

    @property
    def logs(self) -> str:
        return path_join(self.root, "logs")

    @property
    def latest_log(self) -> str:
        return path_join(self.root, "logs", LATEST_LOG)

    @property
    def pidfile(self) -> str:
        return path_join(self.root, "server.pid")

    @property
    def drafters(self) -> str:
        return path_join(self.root, "drafters")

    def helper(self, filename: str) -> str:
        return path_join(self.helpers, filename)

    @property
    def deployment(self) -> str:
        return deployment_path(self.root)

    @property
    def last_good(self) -> str:
        return last_good_path(self.root)

    @property
    def last_good_env(self) -> str:
        return last_good_env_path(self.root)

    @property
    def env_file(self) -> str:
        """The run's environment as launch sources it (0600; values never on a command line)."""
        return path_join(self.root, "launch.env")


def deployment_path(state_dir: str) -> str:
    return path_join(state_dir, "deployment.json")


def last_good_path(state_dir: str) -> str:
    return path_join(state_dir, "last-good.json")


def canary_path(state_dir: str) -> str:
    """Written while the host's replica is in a canary window (fleet/canary.py), removed after it; ``status``
    marks the replica while its server is the one named and the window has not passed."""
    return path_join(state_dir, "canary.json")


def last_good_env_path(state_dir: str) -> str:
    return path_join(state_dir, "last-good.env")


@dataclass(frozen=True)
class RouterPaths:
    """One router's files: ``<state_dir>/router/PORT/`` (its PID file and logs). One folder per port,
    not per state dir: two fleets whose routers share a router host (other ports) each stop, watch
    and restart only their own (issue 44: team B's `down` SIGTERMed team A's router through one
    ``router/router.pid``, whoever wrote it last). fleet_ops.py still reads the old
    ``router/router.pid`` for a router started before that, when its process listens on PORT."""

    state_dir: str
    port: int

    @property
    def root(self) -> str:
        return path_join(self.state_dir, "router", str(self.port))

    @property
    def pidfile(self) -> str:
        return path_join(self.root, "router.pid")

    @property
    def logs(self) -> str:
        return path_join(self.root, "logs")

    @property
    def latest_log(self) -> str:
        return path_join(self.root, "logs", LATEST_LOG)
