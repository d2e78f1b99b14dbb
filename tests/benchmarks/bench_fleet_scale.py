"""Benchmark: deployctl's own CPU per extra host (issue 37's fleet-scale goals).

    python tests/benchmarks/bench_fleet_scale.py [--hosts 1 12 100] [--repeat 3] [--fleet]
    python tests/benchmarks/bench_fleet_scale.py --reach [--hosts 1 12 100] [--deploy-hosts 1 12 24]

Not collected by pytest (bench_*.py). Every figure is the median of ``--repeat`` fresh interpreters'
user+system CPU (``resource.getrusage(RUSAGE_CHILDREN)`` of the ``deployctl`` child only: the hosts'
sshd, shells and stand-ins are other processes and do not count). Prints Markdown tables and the CPU
per extra host between the smallest and the largest count. With ``--reach`` each repeat runs every host
count in turn, so the counts share the machine's drift.

Without ``--reach``: `plan` reads no host (ssh_config off here), so it needs no sandbox: for each host
count it writes a config of that many hosts in one group and runs ``deployctl plan`` (``--fleet``:
behind a router on the first host, ``up --dry-run``: the run-level phases too).

``--reach`` (needs root, sshd, fuser, like the sandbox): the verbs that reach hosts, against hosts
that answer cheaply: real OpenSSH sshds listening on 127.0.2.1 ... 127.0.2.N (a range no test
sandbox uses; 16 addresses per sshd, its limit), one Unix user ``dsbscale-hK`` per host with the sandbox's own home (stand-in
nvidia-smi, SGLang, GPU files, its own network stack through sim_network.c), one known_hosts line
per address, host key checking on. `status`, `gpu-status` and `doctor` run against ``--hosts``
counts of hosts where nothing is deployed; `up`, `status`, `gpu-status`, a no-op `restart` and
`down` against ``--deploy-hosts`` counts (each `up` starts one stand-in SGLang per host: 100 of them
do not fit beside other work on a 2-core machine). The users, their processes and the sshds are
removed at the end (and at start, whatever an interrupted run left).
"""

from __future__ import annotations

import argparse
import atexit
import os
import pwd
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from sandbox import drafter as drafter_mod  # noqa: E402
from sandbox import hosts as sb  # noqa: E402  (the sandbox's own home, keys and process handling)
from tests.conftest import HOST_SIM_ENV  # noqa: E402
from tests.integration.helpers import TEST_LAUNCH_ENV  # noqa: E402

SCALE_ROOT = Path("/var/tmp/deployctl-bench-scale")
SCALE_USER_PREFIX = "dsbscale-"
SCALE_GECOS = "deployctl-bench-scale"
#: 127.0.2.0/24: none of the test sandboxes' slots (127.0.0.10-122) nor the demo (127.0.0.20)
SCALE_NET = "127.0.2."


def config(n: int, fleet: bool) -> str:
    hosts = "\n".join(f"  - {{name: h{i}, address: 10.0.{i // 250}.{i % 250 + 1}, groups: [g]}}" for i in range(n))
    router = "    router: {host: h0}\n    serve_host: 0.0.0.0\n" if fleet else ""
    return (f"ssh:\n  config_file: none\nhosts:\n{hosts}\nruns:\n  - name: r\n    group: g\n"
            f"    base_model: /m\n    drafter: /d\n{router}")


#: deployctl's local state (history, local locks) of the benchmark's runs: never the user's own history
STATE_HOME = tempfile.mkdtemp(prefix="deployctl-bench-scale-state-")
atexit.register(shutil.rmtree, STATE_HOME, ignore_errors=True)  # every run left one behind in /tmp


def child_env() -> dict[str, str]:
    """deployctl's environment: its modules' bytecode cached as an installed deployctl's is. Under
    PYTHONDONTWRITEBYTECODE (set on this project's machines) every start compiled its ~125 modules
    again: 250 ms or more of each figure, the same for 1 and 100 hosts but as noisy as it is long
    (the tests cache it the same way: tests/conftest.py)."""
    env = os.environ | {"COLUMNS": "120", "XDG_STATE_HOME": STATE_HOME}
    if env.pop("PYTHONDONTWRITEBYTECODE", None) and "PYTHONPYCACHEPREFIX" not in env:
        env["PYTHONPYCACHEPREFIX"] = str(REPO / ".pycache")
    return env


def cpu_of(argv: list[str], ok: tuple[int, ...] = (0,)) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=child_env())
    if done.returncode not in ok:
        raise SystemExit(f"{' '.join(argv[2:])}: exit {done.returncode}\n{done.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


# --------------------------------------------------------------------------------------------
# hosts that answer cheaply: one sshd per 16 addresses, one sandbox user and home per host


def _scale_users() -> list[str]:
    return [pw.pw_name for pw in pwd.getpwall()
            if pw.pw_name.startswith(SCALE_USER_PREFIX) and pw.pw_gecos == SCALE_GECOS]


def stop_scale_hosts() -> None:
    """Stop the sshds this benchmark started (their pid files) and remove the dsbscale-* users it made."""
    for pid_file in sorted(SCALE_ROOT.glob("sshd-*.pid")):
        pid = int(pid_file.read_text().split()[0])
        sb._stop_sshd(pid, str(pid_file.with_suffix(".config")))  # only when that pid runs this config
        pid_file.unlink(missing_ok=True)
    for user in _scale_users():
        sb._remove_user(user)  # SIGKILLs that user's processes first: only our users carry the mark


def start_scale_hosts(n: int) -> dict:
    """N simulated GPU hosts behind sshds of 16 addresses each; returns the sandbox-shaped state for its config."""
    reason = sb.sandbox_unavailable_reason()
    if reason:
        raise SystemExit(f"--reach: {reason}")
    stop_scale_hosts()
    if SCALE_ROOT.exists():
        shutil.rmtree(SCALE_ROOT)
    (SCALE_ROOT / "hosts").mkdir(parents=True)
    for d in (SCALE_ROOT, SCALE_ROOT / "hosts"):
        d.chmod(0o755)
    client_key = SCALE_ROOT / "client_key"
    authorized_keys = SCALE_ROOT / "authorized_keys"
    authorized_keys.write_text(sb._keygen(client_key, "deployctl-bench-scale-client") + "\n")
    authorized_keys.chmod(0o644)
    host_key = SCALE_ROOT / "ssh_host_ed25519_key"
    key_type, key_b64 = sb._keygen(host_key, "deployctl-bench-scale").split()[:2]
    shim = sb._build_network_shim(SCALE_ROOT)
    template = SCALE_ROOT / "drafter-template"
    drafter_mod.write_eagle3_drafter(template, layout="speculators")
    port = sb._free_port(f"{SCALE_NET}1")
    hosts, listen, match = [], [], []
    for i in range(1, n + 1):
        name, address = f"h{i}", f"{SCALE_NET}{i}"
        user, home = SCALE_USER_PREFIX + name, SCALE_ROOT / "hosts" / name
        sb._run_checked(["useradd", "-M", "-U", "-s", "/bin/bash", "-d", str(home), "-p", "*",
                         "-c", SCALE_GECOS, user], f"useradd {user}")
        sb._build_home(name, home, 8, "0.5.11", template, address, shim, HOST_SIM_ENV)
        pw = pwd.getpwnam(user)
        sb._chown_tree(home, pw.pw_uid, pw.pw_gid)
        hosts.append({"name": name, "address": address, "port": port, "user": user,
                      "gpu_count": 8, "gpu_glob": f"{home}/dev/nvidia*"})
        listen.append(f"ListenAddress {address}:{port}\n")
        match.append(f"Match User {user}\n    SetEnv {sb.login_env(home, address, shim)}\n")
    (SCALE_ROOT / "known_hosts").write_text(
        "".join(f"[{h['address']}]:{port} {key_type} {key_b64}\n" for h in hosts))
    (SCALE_ROOT / "known_hosts").chmod(0o644)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
    # sshd listens on at most 16 sockets (MAX_LISTEN_SOCKS, OpenSSH 9.2): one sshd per 16 hosts
    for first in range(0, n, 16):
        group = f"sshd-{first // 16}"
        config = SCALE_ROOT / f"{group}.config"
        config.write_text("# deployctl bench_fleet_scale (SIMULATION): one address per host\n"
                          + "".join(listen[first:first + 16]) + f"""HostKey {host_key}
PidFile {SCALE_ROOT}/{group}.sshd-pid
AuthorizedKeysFile {authorized_keys}
AllowUsers {SCALE_USER_PREFIX}*
{sb.SSHD_HARDENING}LogLevel ERROR
MaxStartups 256:30:512
MaxSessions 64
Subsystem sftp internal-sftp
""" + "".join(match[first:first + 16]))
        log = SCALE_ROOT / f"{group}.log"
        with open(log, "ab") as logf:
            proc = subprocess.Popen([sb.SSHD, "-D", "-e", "-f", str(config)], stdin=subprocess.DEVNULL,
                                    stdout=logf, stderr=subprocess.STDOUT, start_new_session=True)
        sb._sshd_children[proc.pid] = proc
        (SCALE_ROOT / f"{group}.pid").write_text(f"{proc.pid}\n")
        for h in hosts[first:first + 16]:
            why = sb._wait_for_banner(proc, h["address"], port, log)
            if why is not None:
                raise SystemExit(f"sshd on {h['address']}:{port}: {why}\n{sb._log_tail(log)}")
    return {"known_hosts": str(SCALE_ROOT / "known_hosts"), "client_key": str(client_key),
            "gpus": 8, "hosts": hosts}


def reach_config(state: dict, n: int) -> Path:
    """The sandbox's deployctl config for the first n hosts, its servers quick to load (the tests')."""
    config = sb.deployctl_config(dict(state, hosts=state["hosts"][:n]))
    config["runs"][0]["env"] = dict(TEST_LAUNCH_ENV)
    path = SCALE_ROOT / f"deployctl-{n}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def table(title: str, rows: dict[str, list[tuple[int, float]]], goals: dict[str, int], repeat: int) -> None:
    counts = sorted({n for series in rows.values() for n, _ in series})
    print(f"\n{title} (median of {repeat})\n")
    print("| verb | " + " | ".join(f"{n} host{'s' if n > 1 else ''}" for n in counts)
          + " | per extra host | goal |")
    print("|---|" + "---:|" * (len(counts) + 2))
    for verb, series in rows.items():
        cpu = dict(series)
        (n0, c0), (n1, c1) = series[0], series[-1]
        print(f"| `{verb}` | " + " | ".join(f"{cpu[n] * 1000:,.0f} ms" for n in counts)
              + f" | **{(c1 - c0) / (n1 - n0) * 1000:.1f} ms** | {goals[verb]} ms |")


def main_reach(args: argparse.Namespace) -> int:
    deployctl = [sys.executable, "-m", "deploy"]
    goals = {"status": 15, "gpu-status": 15, "doctor": 50, "up": 50, "restart": 50, "down": 50}
    try:
        state = start_scale_hosts(max(args.hosts + args.deploy_hosts))
        # Each repeat measures every host count in turn (1, 12, 100, 1, 12, 100, ...), never all of one
        # count first: this machine's CPU per run drifts by tens of ms over minutes, and a figure per
        # extra host is a difference of two counts, so they must share the drift (measured a block per
        # count, `status` on deployed hosts read 11.6 and 17.2 ms per host on two days, same code).
        configs = {n: str(reach_config(state, n)) for n in {*args.hosts, *args.deploy_hosts}}
        quiet_verbs = {"status": ["status"], "gpu-status": ["gpu-status"], "doctor": ["doctor"]}
        quiet_samples: dict[tuple[str, int], list[float]] = {(v, n): [] for v in quiet_verbs for n in args.hosts}
        for _ in range(args.repeat):
            for n in args.hosts:
                # status exits 0 with nothing deployed ("not deployed" per host); the doctor may find
                # nothing on a fresh sandbox host (the tests assert it passes)
                for verb, argv in quiet_verbs.items():
                    quiet_samples[verb, n].append(cpu_of([*deployctl, "-c", configs[n], *argv]))
        quiet = {v: [(n, statistics.median(quiet_samples[v, n])) for n in args.hosts] for v in quiet_verbs}
        table("nothing deployed", quiet, goals, args.repeat)
        cycle = ("up", "status", "gpu-status", "restart", "down")
        samples: dict[tuple[str, int], list[float]] = {(v, n): [] for v in cycle for n in args.deploy_hosts}
        for _ in range(args.repeat):
            for n in args.deploy_hosts:
                for verb in cycle:
                    samples[verb, n].append(cpu_of([*deployctl, "-c", configs[n], verb]))
        deployed = {v: [(n, statistics.median(samples[v, n])) for n in args.deploy_hosts] for v in cycle}
        table("deployed (`up`, `status`, `gpu-status`, a no-op `restart`, `down`, in that order)",
              deployed, goals, args.repeat)
    finally:
        if not args.keep:
            stop_scale_hosts()
    return 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hosts", type=int, nargs="+", default=[1, 12, 100])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--fleet", action="store_true")
    parser.add_argument("--reach", action="store_true", help="the verbs that reach hosts (needs root)")
    parser.add_argument("--deploy-hosts", type=int, nargs="+", default=[1, 12, 24])
    parser.add_argument("--keep", action="store_true", help="--reach: leave the hosts up afterwards")
    parser.add_argument("--stop", action="store_true", help="remove what an earlier --keep left")
    args = parser.parse_args()
    if args.stop:
        stop_scale_hosts()
        return 0
    if args.reach:
        return main_reach(args)
    deployctl = [sys.executable, "-m", "deploy"]
    verb = ["up", "--dry-run"] if args.fleet else ["plan"]
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for n in args.hosts:
            path = Path(scratch) / f"c{n}.yaml"
            path.write_text(config(n, args.fleet))
            rows.append((n, statistics.median(cpu_of([*deployctl, "-c", str(path), *verb])
                                              for _ in range(args.repeat))))
    print(f"| hosts | `{' '.join(verb)}` CPU (median of {args.repeat}) |\n|---:|---:|")
    for n, cpu in rows:
        print(f"| {n} | {cpu * 1000:.0f} ms |")
    (n0, c0), (n1, c1) = rows[0], rows[-1]
    print(f"\nper extra host: {(c1 - c0) / (n1 - n0) * 1000:.1f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
