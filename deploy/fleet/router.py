"""SGLang's router (``smg`` or ``sglang-router``, see router_package.py) on the router host: start, stop, membership, drain, requests.

Command builders and strict parsers, plus ``RouterHost``: the few lines that send them over the
router host's SSH connection. Every HTTP call (the router's management API, a worker's
``/v1/loads``, the end-to-end request) is made from the router host by
``deploy/remote/fleet_ops.py`` (sent inline): that is where the router reaches the workers from.
"""

from __future__ import annotations

import ipaddress
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path

from deploy.base.limits import parse_json
from deploy.config.models import Host, Run, RouterSpec
from deploy.facts.helpers import helper_python
from deploy.base.once import built_once
from deploy.facts.inline import inline_program
from deploy.base.errors import DeployError, ExitCode, RemoteOutputError, StepTimeout
from deploy.fleet.router_package import (ROUTER_CMDLINE_MARKS, RouterPackage, choose_package, parse_release,
                                         policy_problem)
from deploy.base.shell import quote, quote_path, path_join
from deploy.host.sglang_argv import WILDCARD_BINDS, serve_address
from deploy.host.state_layout import RouterPaths, router_log_name
from deploy.base.terminal import strip_escapes
from deploy.facts.router import (A, EndToEnd, HttpAnswer, MembersLine, RouterProcess, RouterState, StopAnswer, Worker,
                                 answer_of, parse_loads, parse_router_state, parse_workers)
from deploy.steps.base import Command

FLEET_OPS = Path(__file__).resolve().parents[1] / "remote" / "fleet_ops.py"
#: stop-stale --scope user leaves ROUTER_CMDLINE_MARKS alone: a router on a replica host keeps
#: routing to the other replicas while that host is redeployed
__all__ = ["ROUTER_CMDLINE_MARKS", "parse_loads", "parse_workers"]


class RouterError(DeployError):
    exit_code = ExitCode.FAILED


def url_host(address: str) -> str:
    """An address as the host part of a URL: an IPv6 literal goes in brackets (RFC 3986)."""
    return f"[{address}]" if ":" in address and not address.startswith("[") else address


def worker_address(run: Run, host: Host) -> str:
    """Where the router host reaches the replica: the address the server binds, or, for a wildcard
    bind (0.0.0.0, ::: every interface), the replica's network address (``host`` as the network
    sees it: its ssh_config HostName or ``address``, see engine.session.network_host). Never the
    127.0.0.1 a local probe uses (sglang.argv.probe_address): that is the router host's own loopback."""
    address = serve_address(run, host)
    return host.address if address in WILDCARD_BINDS else address


def worker_url(run: Run, host: Host) -> str:
    return f"http://{url_host(worker_address(run, host))}:{run.port}"


def is_loopback(address: str) -> bool:
    if address.lower() in ("localhost", "localhost.", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(address.strip("[]")).is_loopback
    except ValueError:
        return False


#: the names of "this machine" itself; other 127.x addresses may be distinct hosts' (one machine
#: serving several addresses, as the sandbox does)
THIS_MACHINE = ("127.0.0.1", "::1", "localhost")


def loopback_problem(run: Run, host: Host, router_host: str) -> str | None:
    """A worker URL on a loopback address is reachable from the replica's host only: fine when the
    router runs on that same host, a dead worker URL otherwise (a serve_host the user set to a
    loopback address, or a host whose network address is this machine's own name)."""
    address = worker_address(run, host)
    if host.name == router_host:
        return None
    if address.lower() in THIS_MACHINE and address == host.address:
        return (f"{host.name}: its address {address} is the router host's own loopback there: the router on "
                f"{router_host} would reach itself, not {host.name}; give {host.name} its network address "
                "(or an ssh_config HostName)")
    if address == host.address or not is_loopback(address):
        return None
    return (f"{host.name}: serve_host {address} is a loopback address: only {host.name} itself reaches it, "
            f"not the router on {router_host}; use serve_host 0.0.0.0 (the router then uses "
            f"{url_host(host.address)}) or the host's network address")


def empties_the_router(leaving: int, staying_healthy: int, allow_downtime: bool) -> bool:
    """The last-healthy-worker rule: a batch that takes workers out of the router must leave it at
    least one healthy worker, unless ``--allow-downtime``. Asked by ``rollout.check_serial`` (a typed
    ``--serial`` against the run's replicas) and by each batch's router-remove (fleet/rolling.py,
    against the router's own list, exit 2 before anything is taken out)."""
    return leaving > 0 and staying_healthy == 0 and not allow_downtime


def router_address(spec: RouterSpec, host: Host) -> str:
    address = spec.bind or host.address
    if address == "0.0.0.0":
        return "127.0.0.1"
    return "::1" if address == "::" else address


def router_url(spec: RouterSpec, host: Host) -> str:
    return f"http://{url_host(router_address(spec, host))}:{spec.port}"


#: shown by ``plan`` where the package is chosen on the router host at run time
MODULE_PLACEHOLDER = "<smg.launch_router|sglang_router.launch_router>"


def router_argv(spec: RouterSpec, host: Host, workers: list[str], package: RouterPackage | None = None) -> list[str]:
    module = package.module if package is not None else (
        RouterPackage(spec.package, "0").module if spec.package != "auto" else MODULE_PLACEHOLDER)
    return [spec.python, "-m", module, "--host", spec.bind or host.address,
            "--port", str(spec.port), "--policy", spec.policy,
            "--worker-startup-timeout-secs", str(int(spec.startup_timeout_s)),
            *spec.extra_args, "--worker-urls", *workers]


def start_command(spec: RouterSpec, host: Host, workers: list[str], log_name: str,
                  package: RouterPackage | None = None) -> str:
    paths = RouterPaths(host.state_dir, spec.port)
    log = path_join(paths.logs, log_name)
    argv = " ".join(quote(a) for a in router_argv(spec, host, workers, package))
    return (f"mkdir -p -- {quote_path(paths.logs)} && cd {quote_path(paths.root)} && "
            f"ln -sfn -- {quote(log_name)} {quote_path(paths.latest_log)} && "
            f"{{ setsid nohup {argv} > {quote_path(log)} 2>&1 < /dev/null & "
            f"pid=$!; printf '%s\\n' \"$pid\" > {quote_path(paths.pidfile)} && echo \"$pid\"; }}")


@built_once
def fleet_ops_program() -> str:
    """fleet_ops.py with its HTTP client (http_plain.py), the port listeners' reader it shares with the
    doctor and the host side's process start time (state_files.py), as one program."""
    remote = FLEET_OPS.parent
    return inline_program([("http_plain", (remote / "http_plain.py").read_text()),
                           ("listeners", (remote / "listeners.py").read_text()),
                           ("state_files", (remote / "state_files.py").read_text()),
                           ("fleet_ops", FLEET_OPS.read_text())], "fleet_ops")


def ops_command(python: str, *args: str, script: str | None = None, isolated: bool = True) -> str:
    """``script``: what the plan shows instead of fleet_ops.py's text (``<deploy/remote/fleet_ops.py>``).
    ``isolated``: ``-I -S`` like every stdlib-only helper (helper_python: 25 ms less per start); not for
    ``router-packages``, which reads router.python's own site-packages."""
    start = helper_python(python) if isolated else quote(python)
    return f"{start} -c {script or quote(fleet_ops_program())} " + " ".join(quote(a) for a in args)


OPS_SCRIPT = "<deploy/remote/fleet_ops.py>"
#: how often the host-side loops read the worker list and a draining worker's load
MEMBERS_POLL_S = 0.2
LOADS_POLL_S = 0.1
END_TO_END = {"text": "deployctl end-to-end check", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}


class RouterCalls:
    """Every command the router host gets, built once: ``RouterHost`` performs these, and the run's
    plan (fleet/plan.py) lists the same ones (``planned``: fleet_ops.py shown by name)."""

    def __init__(self, spec: RouterSpec, host: Host, planned: bool = False):
        self.spec, self.host = spec, host
        self.paths = RouterPaths(host.state_dir, spec.port)
        self.url = router_url(spec, host)
        self.script = OPS_SCRIPT if planned else None

    def ops(self, *args: str, timeout: float = 30, python: str | None = None, description: str = "",
            when: str | None = None) -> Command:
        return Command(description=description or f"fleet_ops {args[0]}", when=when,
                       command=ops_command(python or self.host.python, *args, script=self.script,
                                           isolated=args[0] != "router-packages"),
                       timeout_s=timeout + 30, what=f"fleet_ops {args[0]}")

    def http(self, method: str, url: str, body: dict | None = None, timeout: float = 10, description: str = "",
             when: str | None = None) -> Command:
        args = ["request", method, url] + ([json.dumps(body)] if body is not None else [])
        return self.ops(*args, "--timeout", f"{timeout:g}", timeout=timeout,
                        description=description or f"{method} {url}", when=when)

    def packages(self) -> Command:
        # the package metadata of router.python, never an import (each package loads a ~100 MB extension)
        return self.ops("router-packages", python=self.spec.python,
                        description="which router package router.python has (smg, sglang-router) and its version")

    def reach(self, urls: list[str], timeout: float = 3) -> Command:
        return self.ops("reach", *urls, "--timeout", f"{timeout:g}", timeout=timeout * len(urls) + 5,
                        description="the router host can open a connection to every worker URL")

    def ports(self, binds) -> Command:
        """``binds``: router_ports.router_binds; the listeners on each port and their holders."""
        return self.ops("ports", self.paths.pidfile, *sorted({str(b.port) for b in binds}, key=int),
                        description="every port the router binds ("
                        + ", ".join(b.label for b in binds) + ") is free, or held by the router deployctl started")

    def state(self) -> Command:
        return self.ops("router-state", self.paths.pidfile, self.url + "/workers", "--timeout", "5", timeout=5,
                        description="the router's PID file, process and worker list")

    def workers(self, modern: bool) -> Command:
        return self.http("GET", self.url + ("/workers" if modern else "/list_workers"))

    def add(self, url: str, modern: bool) -> Command:
        if modern:
            return self.http("POST", self.url + "/workers", {"url": url}, description=f"add worker {url}")
        return self.http("POST", self.url + "/add_worker?url=" + url, description=f"add worker {url}")

    def remove(self, url: str, worker_id: str, modern: bool) -> Command:
        if modern:
            return self.http("DELETE", self.url + "/workers/" + worker_id, description=f"remove worker {url}")
        return self.http("POST", self.url + "/remove_worker?url=" + url, description=f"remove worker {url}")

    def health(self, url: str) -> Command:
        return self.http("GET", url + "/health", timeout=5, description=f"is {url} healthy (GET /health)")

    def watch_members(self, modern: bool) -> Command:
        """The router's process and worker list every 0.2 s on one channel (``RouterHost.wait_members``
        decides on each line): ``timeout_s`` bounds the loop on the host beyond the wait's own deadline."""
        return self.ops("poll", f"{MEMBERS_POLL_S:g}", "members", self.paths.pidfile,
                        self.url + ("/workers" if modern else "/list_workers"), "--timeout", "10",
                        timeout=self.spec.startup_timeout_s + 30,
                        description="the router's process and worker list, every 0.2 s until the membership "
                                    "is as expected (one host-side loop)")

    def watch_loads(self, url: str) -> Command:
        """A removed worker's requests in flight (SGLang /v1/loads) every 0.1 s on one channel (``drain``)."""
        return self.ops("poll", f"{LOADS_POLL_S:g}", "request", "GET", url + "/v1/loads", "--timeout", "5",
                        timeout=self.spec.drain_timeout_s + 30,
                        description=f"requests in flight on {url}, every 0.1 s until none (one host-side loop)")

    def watch_metrics(self, urls: list[str], interval_s: float, window_s: float) -> Command:
        """Every worker's /metrics (or /server_info) at the same instants, every ``interval_s``, on one
        channel (the canary's window, fleet/canary.py decides on each line); bounded beyond the window."""
        return self.ops("poll", f"{interval_s:g}", "metrics", *urls, "--timeout", "5", timeout=window_s + 60,
                        description=f"every replica's /metrics at the same instants, every {interval_s:g} s, for "
                                    f"the canary's window (at most {window_s:g} s; one host-side loop)")

    def start(self, workers: list[str], log_name: str, package: RouterPackage | None = None) -> Command:
        label = package.label if package is not None else "the router"
        return Command(description=f"start {label} detached (setsid nohup), PID file and log in the state dir",
                       command=start_command(self.spec, self.host, workers, log_name, package), timeout_s=30,
                       what=f"starting {label}")

    def stop(self, grace: float = 15) -> Command:
        return self.ops("stop-router", self.paths.pidfile, "--timeout", f"{grace:g}", timeout=grace + 10,
                        description="stop the router by its PID file (SIGTERM, then SIGKILL)")

    def log_tail(self, lines: int = 30) -> Command:
        return Command(description="the router's log tail", when="the router died",
                       command=f"tail -n {lines} -- {quote_path(self.paths.latest_log)}")

    def end_to_end(self) -> Command:
        return self.http("POST", self.url + "/generate", END_TO_END, timeout=60,
                         description="one request through the router must answer")


def parse_json_line(output: str, source: str, keys: tuple[str, ...]) -> dict:
    try:
        document = parse_json(output)
        if not isinstance(document, dict) or any(k not in document for k in keys):
            raise ValueError("missing keys")
    except (ValueError, RecursionError):
        raise RemoteOutputError(f"{source}: fleet_ops.py printed unexpected output: {output[:300]!r}") from None
    return document


def workers_answer(got: HttpAnswer, path: str, source: str) -> list[Worker]:
    """fleet_ops.py's GET of the worker list -> the workers; a non-200 answer is a RouterError."""
    if got.status != 200:
        raise RouterError(f"{source}: router GET {path} answered {got.status} {got.why()}")
    return parse_workers(got.body, source)


class MembershipWait:
    """One wait on the router's worker list, decided one observation at a time (pure: the host-side
    loop's lines in ``RouterHost.wait_members``, lists in the unit tests).

    Done when every ``expected`` URL is listed healthy and no ``absent`` one is listed (``out_only``:
    none of them listed healthy, the router sending it nothing new). ``out_since``: the first
    observation that found each ``absent`` URL gone or listed unhealthy (smg keeps a removed worker
    listed, unhealthy and sent nothing new, for its 5 s drain settle: those seconds are out of rotation).
    ``died``: the router process went away ("launched": the one this wait started; "membership":
    under a membership change); the caller says so with the router's log tail."""

    def __init__(self, source: str, path: str, expected: set[str], absent: frozenset[str], out_only: bool,
                 pid: int | None, deadline: float, timeout_s: float):
        self.source, self.path, self.expected, self.absent, self.out_only = source, path, expected, absent, out_only
        self.pid, self.deadline, self.timeout_s = pid, deadline, timeout_s
        self.last = "no answer yet"
        self.out_since: float | None = None
        self.done_at: float | None = None
        self.died: str | None = None

    def observe(self, state: RouterProcess, workers: HttpAnswer, polled: float) -> bool:
        """True: decided (``done_at`` or ``died`` set); raises StepTimeout past the deadline."""
        if self.pid is not None and not state.alive:
            self.died = "launched"
            return True
        try:
            listed = {w.url: w for w in workers_answer(workers, self.path, self.source)}
        except RouterError as exc:
            self.last = str(exc)
            if self.pid is None and not state.alive:
                self.died = "membership"
                return True
        else:
            missing = [u for u in self.expected if not (u in listed and listed[u].is_healthy)]
            still = [u for u in self.absent if u in listed]
            if self.out_since is None and not [u for u in still if listed[u].is_healthy]:
                self.out_since = polled
            if not missing and (not still or (self.out_only and self.out_since is not None)):
                self.done_at = self.out_since if self.out_since is not None else polled
                return True
            self.last = f"waiting for {missing or ''} {('to leave: ' + str(still)) if still else ''}".strip()
        if polled > self.deadline:
            raise StepTimeout(f"{self.source}: router membership not as expected after "
                              f"{self.timeout_s:g} s: {self.last}")
        return False


class DrainWait:
    """A removed worker's drain, decided one /v1/loads answer at a time (pure, like MembershipWait).

    Done at zero twice, 0.25 s apart: a request the router dispatched just before the removal may not
    have reached the worker yet, and SGLang counts a request as finished before its last stream chunk
    is written. A worker that does not answer has nothing to finish either."""

    def __init__(self, url: str, timeout_s: float, started: float):
        self.url, self.timeout_s, self.started = url, timeout_s, started
        self.idle_since: float | None = None
        self.seconds: float | None = None

    def observe(self, got: HttpAnswer, polled: float) -> bool:
        left = parse_loads(got.body, self.url) if got.status == 200 else None
        if left is None or left == 0:
            if left is None or (self.idle_since is not None and polled - self.idle_since >= 0.25):
                self.seconds = polled - self.started
                return True
            self.idle_since = self.idle_since or polled
            return False
        self.idle_since = None
        if polled - self.started > self.timeout_s:
            raise StepTimeout(f"{self.url}: still {left} request(s) in flight after the drain timeout "
                              f"({self.timeout_s:g} s); not redeployed")
        return False


def modern_api(version: str) -> bool:
    """sglang-router 0.3.x manages workers at /workers; older releases at /add_worker, /remove_worker."""
    return parse_release(version, "sglang-router") >= (0, 3)


def parse_router_packages(output: str, source: str) -> dict[str, str | None]:
    """fleet_ops.py router-packages -> {"smg": version|None, "sglang-router": version|None}, strictly."""
    document = parse_json_line(output, source, ("packages",))
    packages = document["packages"]
    if not isinstance(packages, dict) or not all(
            isinstance(k, str) and (v is None or (isinstance(v, str) and 0 < len(v) <= 64)) for k, v in packages.items()):
        raise RemoteOutputError(f"{source}: fleet_ops.py router-packages printed unexpected output: {output[:300]!r}")
    return dict(packages)


def parse_reach(got: dict, urls: list[str], source: str) -> list[str]:
    """fleet_ops.py reach -> the URLs the router host cannot reach, each with why (empty: all fine)."""
    entries = got.get("reach")
    if not isinstance(entries, list) or len(entries) != len(urls) or not all(
            isinstance(e, dict) and isinstance(e.get("reachable"), bool) and e.get("url") == u
            for e, u in zip(entries, urls)):
        raise RemoteOutputError(f"{source}: fleet_ops.py reach printed unexpected output: {str(got)[:300]!r}")
    return [f"{e['url']} ({str(e.get('error') or 'unreachable')[:200]})" for e in entries if not e["reachable"]]


def choose_router_package(installed: dict[str, str | None], spec: RouterSpec, host: Host) -> RouterPackage:
    """The package router.python runs on ``host`` (router.package, or smg before sglang-router)."""
    package = choose_package(installed, spec.package, f"{host.name} ({spec.python})")
    problem = policy_problem(package, spec.policy)
    if problem:
        raise RouterError(f"{host.name}: {problem}")
    return package


class RouterHost:
    """The router host's connection, used by the run-level phases."""

    def __init__(self, conn, host: Host, run: Run, progress: Callable[[str], None] = lambda m: None):
        assert run.router is not None
        self.conn, self.host, self.run, self.spec = conn, host, run, run.router
        self.paths = RouterPaths(host.state_dir, self.spec.port)
        self.url = router_url(self.spec, host)
        self.calls = RouterCalls(self.spec, host)
        self.progress = progress
        self._package: RouterPackage | None = None
        self.leaving: set[str] = set()  # removed with settle=False, maybe still listed (settled())

    # -- plumbing -----------------------------------------------------------------------------

    def _do(self, call: Command) -> dict:
        result = self.conn.check(call.command, timeout=call.timeout_s, what=call.what or "fleet_ops")
        return parse_json_line(result.stdout.strip(), self.host.name, ())

    def _answer(self, call: Command, model: type[A]) -> A:
        """``call``'s one JSON line as ``model`` (facts/router.py), strictly: the host and field named otherwise."""
        return answer_of(model, self._do(call), self.host.name, (call.what or "").removeprefix("fleet_ops ") or "?")

    def _http(self, call: Command) -> HttpAnswer:
        return self._answer(call, HttpAnswer)

    def package(self) -> RouterPackage:
        if self._package is None:
            call = self.calls.packages()
            result = self.conn.check(call.command, timeout=call.timeout_s, what=call.what or "router-packages")
            self._package = choose_router_package(parse_router_packages(result.stdout.strip(), self.host.name),
                                                  self.spec, self.host)
        return self._package

    def unreachable(self, urls: list[str], timeout: float = 3) -> list[str]:
        """Worker URLs the router host cannot open a connection to, each with why (empty: all fine)."""
        return parse_reach(self._do(self.calls.reach(urls, timeout)), urls, self.host.name)

    # -- lifecycle ----------------------------------------------------------------------------

    def state(self) -> RouterState:
        return parse_router_state(self._do(self.calls.state()), self.host.name)

    def running(self) -> bool:
        return self.state().alive

    def start(self, workers: list[str], stamp: str) -> int:
        package = self.package()
        log_name = router_log_name(stamp)
        call = self.calls.start(workers, log_name, package)
        result = self.conn.check(call.command, timeout=call.timeout_s, what=call.what or "starting sglang-router")
        text = result.stdout.strip()
        if not text.isdigit():
            raise RemoteOutputError(f"{self.host.name}: starting the router printed {text[:200]!r}; expected its PID")
        pid = int(text)
        self.progress(f"router pid {pid} on {self.url}, log {path_join(self.paths.logs, log_name)}")
        self.wait_members(set(workers), pid=pid)
        return pid

    def stop(self, grace: float = 15) -> StopAnswer:
        return self._answer(self.calls.stop(grace), StopAnswer)

    def log_tail(self, lines: int = 30) -> str:
        """The router's last log lines as words: smg 1.13 writes ANSI colours into its log file."""
        return strip_escapes(self.conn.run(self.calls.log_tail(lines).command).stdout).rstrip()

    # -- membership ---------------------------------------------------------------------------

    def workers(self) -> list[Worker]:
        modern = self.package().workers_api
        return workers_answer(self._http(self.calls.workers(modern)), "/workers" if modern else "/list_workers",
                              self.host.name)

    def _poll(self, call: Command, observe: Callable[[dict, float], bool]) -> None:
        """Run a host-side poll loop (``fleet_ops.py poll``) on one channel; ``observe(line, arrived)``
        decides on each JSON line as it comes, True ending the loop (its channel closed)."""
        # a signal that came before this wait started does not stop it: the phases that put a batch
        # back into the router after Ctrl-C wait on the router too (fleet/phases.py run_phases)
        cancelled = self.conn.cancelled
        if cancelled is None or cancelled.is_set():
            cancelled = threading.Event()

        def on_line(line: str) -> bool:
            return observe(parse_json_line(line.strip(), self.host.name, ()), time.monotonic())

        ended = self.conn.watch(call.command, on_line, timeout=call.timeout_s or 60, cancelled=cancelled)
        if ended.exit_code is not None:
            raise RouterError(f"{self.host.name}: {call.what} ended (exit {ended.exit_code}) before deployctl "
                              f"decided: {strip_escapes(ended.stderr.strip())[-300:]}")

    def watch_metrics(self, urls: list[str], interval_s: float, window_s: float,
                      observe: Callable[[dict, float], bool]) -> None:
        """The canary's reads (``RouterCalls.watch_metrics``) until ``observe`` returns True."""
        self._poll(self.calls.watch_metrics(urls, interval_s, window_s), observe)

    def wait_members(self, expected: set[str], pid: int | None = None, absent: frozenset[str] = frozenset(),
                     out_only: bool = False) -> float:
        """Wait (MembershipWait) until every ``expected`` URL is listed healthy and no ``absent`` one is
        (``out_only``: until none of them is listed healthy); returns when the router stopped routing to
        the ``absent`` URLs. ``pid``: the router this run just started, which must stay alive."""
        modern = self.package().workers_api
        wait = MembershipWait(self.host.name, "/workers" if modern else "/list_workers", expected, absent, out_only,
                              pid, time.monotonic() + self.spec.startup_timeout_s, self.spec.startup_timeout_s)

        def observe(line: dict, arrived: float) -> bool:
            got = answer_of(MembersLine, line, self.host.name, "poll members")
            return wait.observe(got.state, got.workers, arrived)

        self._poll(self.calls.watch_members(modern), observe)
        if wait.died == "launched":
            raise RouterError(f"{self.host.name}: the router (pid {pid}) died; its log ends:\n{self.log_tail()}")
        if wait.died == "membership":
            from deploy.fleet.router_watch import RouterLost

            raise RouterLost(f"{self.host.name}: the router died while deployctl waited for "
                             f"{', '.join(sorted(expected | absent))} to "
                             f"{'join' if expected else 'leave'}; its log ends:\n{self.log_tail()}")
        assert wait.done_at is not None
        return wait.done_at

    def add(self, url: str) -> None:
        got = self._http(self.calls.add(url, self.package().workers_api))
        if got.status not in (200, 201, 202):
            raise RouterError(f"{self.host.name}: router refused to add {url}: {got.status} {got.why()}")
        self.wait_members({url})

    def remove(self, url: str, settle: bool = True) -> float:
        """Take ``url`` out; returns when the router stopped sending it new requests (monotonic).

        ``settle``: and when it left the worker list. A roll passes False and calls ``settled()``
        before it adds the worker back: smg lists a removed worker, unhealthy and sent nothing new,
        for its 5 s drain settle (smg 1.13.0), and those seconds can pass while the replica drains and
        redeploys instead of before (``add`` of a URL still listed would be refused as a duplicate)."""
        if self.package().workers_api:
            ids = [w.id for w in self.workers() if w.url == url]
            if not ids:
                return time.monotonic()
            got = self._http(self.calls.remove(url, ids[0], True))
        else:
            got = self._http(self.calls.remove(url, "", False))
        if got.status not in (200, 202, 204):
            raise RouterError(f"{self.host.name}: router refused to remove {url}: {got.status} {got.why()}")
        if settle:
            return self.wait_members(set(), absent=frozenset({url}))
        self.leaving.add(url)
        return self.wait_members(set(), absent=frozenset({url}), out_only=True)

    def settled(self) -> None:
        """Wait until every worker removed with ``settle=False`` has left the worker list."""
        if self.leaving:
            self.wait_members(set(), absent=frozenset(self.leaving))
            self.leaving.clear()

    def healthy(self, url: str) -> bool:
        """Does the worker answer GET /health 200 from the router host (where the router reaches it)?"""
        return self._http(self.calls.health(url)).status == 200

    def drain(self, url: str, timeout: float) -> float:
        """Wait (DrainWait) until the removed worker has nothing in flight; returns the seconds it took."""
        wait = DrainWait(url, timeout, time.monotonic())
        self._poll(self.calls.watch_loads(url),
                   lambda line, arrived: wait.observe(answer_of(HttpAnswer, line, self.host.name, "poll request"),
                                                      arrived))
        assert wait.seconds is not None
        return wait.seconds

    def end_to_end(self) -> EndToEnd:
        """One /generate through the router; the run is up only when it answers."""
        got = self._http(self.calls.end_to_end())
        if got.status != 200:
            raise RouterError(f"{self.host.name}: a request through the router ({self.url}/generate) failed: "
                              f"{got.status} {got.why(300)}")
        try:
            answer = parse_json(got.body)
            text = answer["text"]
        except (ValueError, KeyError, TypeError):
            raise RemoteOutputError(f"{self.host.name}: the router's /generate answer has no text: "
                                    f"{got.body[:200]!r}") from None
        return EndToEnd(text=str(text)[:80])
