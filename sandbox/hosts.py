"""Start and stop the sandbox's simulated GPU hosts (SIMULATION ONLY, a TEST DOUBLE).

Each simulated host is a real OpenSSH server on its own loopback address, logging in as its own
Unix user, with a HOME that carries the stand-ins: ``~/bin/nvidia-smi`` (sim_nvidia_smi.py),
``~/pylib/sglang`` (the stand-in SGLang, with ``~/pylib/torch`` and ``~/pylib/safetensors`` for the drafter swap's sender), ``~/dev/nvidia*`` (files standing in for the GPU device
nodes), ``~/.sim/config.json``, a synthetic speculators-format drafter and a base-model stub.

Why a Unix user per host: the hosts share this machine's process table. "Kill stale python3" run
on a host that logged in as root would kill the test runner and every other host's servers
(as it did when this sandbox shared one process table). A host's user sees and signals only its own processes.

Why its own 127.0.0.x address: the hosts share one network stack; two servers on port 30000 must
not collide unless they are on the same host.

Needs root (useradd, sshd), /usr/sbin/sshd, ssh, ssh-keygen, fuser; see
``sandbox_unavailable_reason``. ``stop_sandbox`` works from another process: it reads
``<root>/sandbox.json``.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import os
import pwd
import re
import shutil
import signal
import socket
import stat
import subprocess
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import yaml

from deploy.base.errors import DeployError, ExitCode
from deploy.remote import host_ops as proc  # the product's /proc reader (not the oracle of any test)
from sandbox import drafter as drafter_mod

SSHD = "/usr/sbin/sshd"
#: the Unix user name prefixes a sandbox may use: "dsb-" for the demo and the tests' first slot,
#: "dsbN-" for their slot N (tests/conftest.py SLOTS: four integration workers, each its own sandbox)
USER_PREFIXES = ("dsb-", "dsb1-", "dsb2-", "dsb3-")
USER_PREFIX = USER_PREFIXES[0]
GECOS_MARK = "deployctl-sandbox"
FIRST_ADDRESS_OCTET = 10
GPU_TOTAL_MIB = 143771  # NVIDIA H200
GPU_NAME = "NVIDIA H200"
# HGX H200 bus ids of GPUs 0-7 (more GPUs continue upwards).
PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
DRAFTER_REL = "drafters/kimi-k25-eagle3"
BASE_MODEL_REL = "models/Kimi-K2.5"
STATE_FILE = "sandbox.json"
PORT_ATTEMPTS = 5
SSHD_START_TIMEOUT_S = 10.0
PROCESS_EXIT_TIMEOUT_S = 5.0

_PACKAGE_DIR = Path(__file__).resolve().parent
_SIM_NVIDIA_SMI = _PACKAGE_DIR / "sim_nvidia_smi.py"
_SIM_SGLANG = _PACKAGE_DIR / "sim_sglang" / "sglang"
#: what the stand-in SGLang's python has besides sglang, for the drafter swap's sender (issue 41):
#: the product's one payload path imports torch and safetensors.torch, as on a GPU host
_SIM_SIBLINGS = (_PACKAGE_DIR / "sim_sglang" / "torch", _PACKAGE_DIR / "sim_sglang" / "safetensors")
_SIM_NETWORK = _PACKAGE_DIR / "sim_network.c"
#: the stand-in packages compiled once per sandbox, under its root: every home copies them from there
PYLIB_TEMPLATE = "pylib-template"
#: the PATH sshd gives the hosts' users (before their dotfile puts ~/bin first): which python3 they run
HOST_PATH = "/usr/local/bin:/usr/bin:/bin"
#: the compiled sim_network.c, under the sandbox root (absent: no C compiler, hosts share one stack)
NETWORK_SHIM = "sim_network.so"
_SIM_NVIDIA_SMI_FAST = _PACKAGE_DIR / "sim_nvidia_smi_fast.c"
#: the compiled sim_nvidia_smi_fast.c, under the sandbox root (absent: no C compiler, the Python stand-in
#: answers every call)
NVIDIA_SMI_FAST = "sim-nvidia-smi"
#: the abridged upstream model sources the doctor's tests read (one copy: the sandbox installs them
#: under a SIMULATED header instead of keeping its own copies, issue 37)
_MODEL_SOURCES = _PACKAGE_DIR.parent / "tests" / "facts" / "doctor" / "models"
#: kimi_k25 gains set_eagle3_layers_to_capture in SGLang 0.5.10 (PR #19689)
_KIMI_HOOK_SINCE = (0, 5, 10)


def kimi_k25_source(version: tuple[int, ...]) -> str:
    """The stand-in's srt/models/kimi_k25.py for SGLang ``version``: upstream's abridged source, marked."""
    hook = version >= _KIMI_HOOK_SINCE
    name = "kimi_k25_0.5.10.py" if hook else "kimi_k25_0.5.9.py"
    body = (_MODEL_SOURCES / name).read_text().split("\n", 1)[1]  # its first line says where it was abridged from
    return (f"# SIMULATED stand-in (deployctl sandbox TEST DOUBLE) shaped like sglang "
            f"{'0.5.10+' if hook else '0.5.9'}'s srt/models/kimi_k25.py: "
            f"{'has the capture hook (PR #19689).' if hook else 'no EAGLE-3 capture hook.'}\n{body}")
_sshd_children: dict[int, subprocess.Popen] = {}


class SandboxError(DeployError):
    """The sandbox could not be started or stopped; the message says what and where."""

    exit_code = ExitCode.FAILED


@dataclass(frozen=True)
class SandboxHost:
    name: str
    address: str
    port: int
    user: str
    home: Path
    identity_file: Path
    gpu_glob: str
    gpu_count: int
    state_dir: Path
    sim_dir: Path

    @property
    def drafter_dir(self) -> Path:
        return self.home / DRAFTER_REL

    @property
    def base_model_dir(self) -> Path:
        return self.home / BASE_MODEL_REL


@dataclass
class Sandbox:
    root: Path
    hosts: list[SandboxHost]
    known_hosts: Path
    config_path: Path

    def host(self, name: str) -> SandboxHost:
        for h in self.hosts:
            if h.name == name:
                return h
        raise KeyError(f"no sandbox host named {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    @property
    def own_network(self) -> bool:
        """Does each host have its own network stack (sim_network.c compiled and preloaded)?"""
        return _shim(self.root) is not None

    def ssh_argv(self, name: str, command: str, *, multiplex: bool = True) -> list[str]:
        """A real ``ssh`` command line for ``command`` on host ``name``, host key checking on.

        ``multiplex`` reuses one connection per host (ControlMaster under the root): a fresh
        handshake costs ~0.3 s here, a multiplexed command ~0.01 s. A test that must see a new
        handshake (host key checks, changed options) passes ``multiplex=False``.
        """
        h = self.host(name)
        argv = [
            "ssh", "-F", "/dev/null",
            "-o", "BatchMode=yes",
            "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={self.known_hosts}",
            "-o", "GlobalKnownHostsFile=/dev/null",
            "-o", "IdentitiesOnly=yes",
            "-o", "ConnectTimeout=10",
            "-o", "LogLevel=ERROR",
            "-i", str(h.identity_file),
            "-p", str(h.port),
        ]
        mux_dir = self.root / "mux"
        if multiplex and len(str(mux_dir)) + 42 < 104 and mux_dir.is_dir():  # AF_UNIX path limit
            argv += ["-o", "ControlMaster=auto", "-o", f"ControlPath={mux_dir}/%C",
                     "-o", "ControlPersist=60"]
        else:
            argv += ["-o", "ControlMaster=no", "-o", "ControlPath=none"]
        return argv + [f"{h.user}@{h.address}", command]

    def sshd_log(self, name: str) -> Path:
        """Host ``name``'s sshd log (sshd -e: everything it logs at the sandbox's LogLevel)."""
        return self.root / "sshd" / self.host(name).name / "sshd.log"

    def run(self, name: str, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
        """Run ``command`` on host ``name`` over real ssh; never raises on a non-zero exit."""
        return subprocess.run(self.ssh_argv(name, command), stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=timeout)

    def stop(self, remove_root: bool = False) -> None:
        stop_sandbox(self.root, remove_root=remove_root)

    def reset(self, names: Sequence[str] | None = None) -> None:
        """Put hosts back as start left them: kill all their user's processes, rebuild HOME.

        Tests call this between cases. It kills the user's ssh sessions too, so call it when no
        command is running on the host.
        """
        state = _read_state(self.root)
        if state is None:
            raise SandboxError(f"no sandbox recorded at {self.root}/{STATE_FILE}")
        for name in names or [h.name for h in self.hosts]:
            h = self.host(name)
            _kill_user_processes(h.user)
            _build_home(h.name, h.home, h.gpu_count, state["sglang_version"],
                        self.root / "drafter-template", h.address, _shim(self.root), state.get("sim_env"))
            pw = pwd.getpwnam(h.user)
            _chown_tree(h.home, pw.pw_uid, pw.pw_gid)

    def set_sglang_version(self, name: str, version: str) -> None:
        """Make host ``name``'s stand-in SGLang report and behave as ``version`` (until reset):
        its config, its package metadata and its version-dependent model sources."""
        _install_sglang_version(self.host(name).home, version)
        config_path = self.host(name).sim_dir / "config.json"
        config = json.loads(config_path.read_text())
        config["sglang_version"] = version
        tmp = config_path.with_name("config.json.tmp")
        tmp.write_text(json.dumps(config, indent=2) + "\n")
        st = config_path.stat()
        os.chown(tmp, st.st_uid, st.st_gid)
        os.replace(tmp, config_path)

    @classmethod
    def load(cls, root: Path) -> "Sandbox":
        """The sandbox recorded in ``root/sandbox.json`` (started by any process)."""
        state = _read_state(Path(root).resolve())
        if state is None:
            raise SandboxError(f"no sandbox recorded at {root}/{STATE_FILE}; start one first")
        return _sandbox_from_state(state)


# --------------------------------------------------------------------------------------------
# preconditions


def sandbox_unavailable_reason() -> str | None:
    """Why the sandbox cannot run on this machine, or None when it can."""
    if os.geteuid() != 0:
        return "the sandbox needs root: it creates one Unix user per simulated host and runs sshd"
    if not os.access(SSHD, os.X_OK):
        return f"{SSHD} not found (install openssh-server)"
    for tool in ("ssh", "ssh-keygen", "useradd", "userdel", "fuser", "pkill", "pgrep"):
        if shutil.which(tool) is None:
            return f"`{tool}` not found on PATH"
    return None


def _check_traversable(root: Path) -> None:
    """Every existing ancestor of root must let other users (the dsb-* users) pass through."""
    for p in [root, *root.parents]:
        if not p.exists():
            continue
        mode = p.stat().st_mode
        if not mode & stat.S_IXOTH:
            raise SandboxError(
                f"sandbox root {root}: {p} is not searchable by other users (mode "
                f"{stat.S_IMODE(mode):o}); the sandbox's per-host users must reach their homes "
                f"under it. Use a root under /var/tmp, or `chmod o+x {p}`.")


def _check_names(names: Sequence[str], user_prefix: str = USER_PREFIX) -> None:
    if not names:
        raise SandboxError("a sandbox needs at least one host name")
    if len(set(names)) != len(names):
        raise SandboxError(f"host names must be unique: {list(names)}")
    for name in names:
        ok = name[:1].isalpha() and all(c.isalnum() or c == "-" for c in name) and name.islower()
        if not ok or len(user_prefix + name) > 32:
            raise SandboxError(f"host name {name!r}: use lower-case letters, digits and '-', starting "
                               f"with a letter ({user_prefix}<name> becomes a Unix user name)")


# --------------------------------------------------------------------------------------------
# state file


def _read_state(root: Path) -> dict | None:
    try:
        return json.loads((root / STATE_FILE).read_text())
    except FileNotFoundError:
        return None
    except ValueError as exc:
        raise SandboxError(f"{root / STATE_FILE} is not valid JSON ({exc}); remove it and any "
                           f"{USER_PREFIX}* users by hand") from None


def _write_state(root: Path, state: dict) -> None:
    tmp = root / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    os.replace(tmp, root / STATE_FILE)


def _sandbox_from_state(state: dict) -> Sandbox:
    root = Path(state["root"])
    hosts = [
        SandboxHost(
            name=h["name"], address=h["address"], port=int(h["port"]), user=h["user"],
            home=Path(h["home"]), identity_file=Path(state["client_key"]),
            gpu_glob=h["gpu_glob"], gpu_count=int(h["gpu_count"]),
            state_dir=Path(h["state_dir"]), sim_dir=Path(h["sim_dir"]))
        for h in state["hosts"] if h.get("port")
    ]
    return Sandbox(root=root, hosts=hosts, known_hosts=Path(state["known_hosts"]),
                   config_path=Path(state["config_path"]))


# --------------------------------------------------------------------------------------------
# processes


def _pid_alive(pid: int) -> bool:
    child = _sshd_children.get(pid)
    if child is not None:
        return child.poll() is None
    return proc.alive(pid)


def _cmdline(pid: int) -> str:
    return proc.cmdline(pid)


def _children_of(pid: int) -> list[int]:
    return [child for child in proc.all_pids() if proc.parent_pid(child) == pid]


def _wait_gone(pids: list[int], timeout: float) -> list[int]:
    deadline = time.monotonic() + timeout
    alive = [p for p in pids if _pid_alive(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [p for p in alive if _pid_alive(p)]
    return alive


def _stop_sshd(pid: int, config_path: str) -> None:
    """SIGTERM, then SIGKILL, our sshd and its per-connection monitors (only if it is ours)."""
    if not _pid_alive(pid) or config_path not in _cmdline(pid):
        _sshd_children.pop(pid, None)
        return  # gone, or the pid now belongs to someone else
    tree = [pid, *_children_of(pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in tree:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
        tree = _wait_gone(tree, PROCESS_EXIT_TIMEOUT_S if sig == signal.SIGTERM else 2.0)
        if not tree:
            break
    child = _sshd_children.pop(pid, None)
    if child is not None:
        try:
            child.wait(1)
        except subprocess.TimeoutExpired:
            pass


def _user_exists(user: str) -> bool:
    try:
        pwd.getpwnam(user)
        return True
    except KeyError:
        return False


def _live_pids_of_uid(uid: int) -> list[int]:
    """Processes of uid that still run (zombies wait for PID 1, which may reap slowly here)."""
    return [pid for pid in proc.all_pids() if proc.real_uid(pid) == uid and proc.alive(pid)]


def _kill_user_processes(user: str) -> None:
    """SIGKILL every process of a sandbox user (those users are ours) and wait until none runs."""
    try:
        uid = pwd.getpwnam(user).pw_uid
    except KeyError:
        return
    # By PID from our own /proc scan, not `pkill -u` (a second scan of /proc in a process of its own:
    # about 10 ms of CPU per call, ~450 resets a suite run); a process forked between the scan and
    # the kill is found by the next scan.
    deadline = time.monotonic() + PROCESS_EXIT_TIMEOUT_S
    left = _live_pids_of_uid(uid)
    while left:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        left = _live_pids_of_uid(uid)
        if left and time.monotonic() > deadline:
            raise SandboxError(f"processes of sandbox user {user} survived SIGKILL: {left}")
        if left:
            time.sleep(0.05)


def _remove_user(user: str) -> None:
    if not _user_exists(user):
        return
    _kill_user_processes(user)
    deadline = time.monotonic() + PROCESS_EXIT_TIMEOUT_S
    while True:
        res = subprocess.run(["userdel", user], capture_output=True, text=True)
        if res.returncode == 0 or not _user_exists(user):
            break
        if time.monotonic() > deadline:
            raise SandboxError(f"userdel {user} failed: {res.stderr.strip()}")
        _kill_user_processes(user)
        time.sleep(0.05)
    try:
        os.unlink(f"/var/mail/{user}")
    except OSError:
        pass


def _sandbox_users(root: Path | None = None) -> list[pwd.struct_passwd]:
    """Users this module created (GECOS marked), optionally only those of one root."""
    out = []
    for pw in pwd.getpwall():
        if not (pw.pw_name.startswith(USER_PREFIXES) and pw.pw_gecos.startswith(GECOS_MARK)):
            continue
        if root is None or pw.pw_gecos == _gecos(root):
            out.append(pw)
    return out


def _gecos(root: Path) -> str:
    return f"{GECOS_MARK} root={root}"


# --------------------------------------------------------------------------------------------
# stop


def stop_sandbox(root: Path, *, remove_root: bool = False) -> None:
    """Stop every sshd recorded under root, kill the sandbox users' processes, delete the users.

    Idempotent, and usable from a process other than the one that started the sandbox.
    """
    root = Path(root).resolve()
    state = _read_state(root)
    users: list[str] = []
    if state is not None:
        for h in state.get("hosts", []):
            if h.get("sshd_pid"):
                _stop_sshd(int(h["sshd_pid"]), h["sshd_config"])
            users.append(h["user"])
    # Users created before a crash could record them in sandbox.json carry the root in GECOS.
    users += [pw.pw_name for pw in _sandbox_users(root) if pw.pw_name not in users]
    for user in users:
        _remove_user(user)
    if state is not None:
        state["stopped"] = time.time()
        for h in state.get("hosts", []):
            h["sshd_pid"] = None
        os.replace(_write_stopped(root, state), root / "sandbox.stopped.json")
        (root / STATE_FILE).unlink(missing_ok=True)
    if remove_root and root.exists():
        shutil.rmtree(root)


def _write_stopped(root: Path, state: dict) -> Path:
    tmp = root / "sandbox.stopped.json.tmp"
    tmp.write_text(json.dumps(state, indent=2) + "\n")
    return tmp


# --------------------------------------------------------------------------------------------
# start


def _run_checked(argv: list[str], what: str) -> subprocess.CompletedProcess:
    res = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if res.returncode != 0:
        raise SandboxError(f"{what} failed (exit {res.returncode}): {' '.join(argv)}\n"
                           f"{(res.stderr or res.stdout).strip()}")
    return res


def _keygen(path: Path, comment: str) -> str:
    for p in (path, path.with_name(path.name + ".pub")):
        p.unlink(missing_ok=True)
    _run_checked(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                 f"ssh-keygen for {path}")
    return path.with_name(path.name + ".pub").read_text().strip()


def _free_port(address: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((address, 0))
        return s.getsockname()[1]


def _live_conflicts(addresses: set[str], users: set[str], root: Path) -> list[str]:
    """Other running sandboxes that hold one of our addresses or user names."""
    conflicts = []
    roots = {pw.pw_gecos.split("root=", 1)[1] for pw in _sandbox_users() if "root=" in pw.pw_gecos}
    for other in sorted(roots - {str(root)}):
        try:
            state = _read_state(Path(other))
        except SandboxError:
            state = None
        for h in (state or {}).get("hosts", []):
            pid = h.get("sshd_pid")
            if pid and _pid_alive(int(pid)) and (h["address"] in addresses or h["user"] in users):
                conflicts.append(f"{h['user']}@{h['address']} of the sandbox at {other} "
                                 f"(stop it: python -m sandbox stop --root {other})")
    return conflicts


def _uuid(name: str, index: int) -> str:
    d = hashlib.sha256(f"deployctl-sandbox/{name}/{index}".encode()).hexdigest()
    return f"GPU-{d[0:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}"


def _bus_id(index: int) -> str:
    bus = PCI_BUSES[index] if index < len(PCI_BUSES) else 0xE0 + index
    return f"00000000:{bus:02X}:00.0"


def _shim(root: Path) -> Path | None:
    shim = root / NETWORK_SHIM
    return shim if shim.is_file() else None


def _compile(source: Path, output: Path, *flags: str, libraries: tuple[str, ...] = ()) -> Path | None:
    """``source`` compiled with the system C compiler into ``output`` (replaced), ``libraries`` linked
    after it; None without a compiler."""
    output.unlink(missing_ok=True)
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    result = subprocess.run([compiler, *flags, "-o", str(output), str(source), *libraries], capture_output=True,
                            text=True, timeout=120)
    if result.returncode != 0:
        raise SandboxError(f"compiling {source} failed: {result.stderr[-500:]}")
    output.chmod(0o755)
    return output


def _build_network_shim(root: Path) -> Path | None:
    """Compile sim_network.c (each host's own network stack); None without a C compiler (tests that
    need a host's own stack, e.g. serve_host 0.0.0.0 on three hosts, skip)."""
    return _compile(_SIM_NETWORK, root / NETWORK_SHIM, "-shared", "-fPIC", "-O2", libraries=("-ldl",))


#: -O0: compiled at every sandbox start (eight in a suite run) in 0.09 s instead of -O2's 0.36 s, and a
#: call takes as long either way (the exec and the /proc scan are the kernel's)
NVIDIA_SMI_FAST_FLAGS = ("-O0",)


def _build_nvidia_smi_fast(root: Path) -> Path | None:
    """Compile sim_nvidia_smi_fast.c (the two GPU queries deployctl sends, answered as the Python
    stand-in answers them, 2.8 ms of CPU a call instead of 12.4; anything else it hands to the Python
    stand-in); None without a C compiler (the Python stand-in then answers every call)."""
    return _compile(_SIM_NVIDIA_SMI_FAST, root / NVIDIA_SMI_FAST, *NVIDIA_SMI_FAST_FLAGS)


def nvidia_smi_launcher(lib: Path) -> str:
    """The Python stand-in's launcher: ~/bin/nvidia-smi without a C compiler, else the script the C fast
    path execs for every call it does not answer (``lib``: where sim_nvidia_smi.py lies)."""
    return ("#!/usr/bin/python3 -IS\n"
            f"# SIMULATED nvidia-smi (deployctl sandbox test double): {lib / 'sim_nvidia_smi.py'}\n"
            f"import sys\nsys.path.insert(0, {str(lib)!r})\n"
            "import sim_nvidia_smi\nsys.exit(sim_nvidia_smi.main())\n")


def _network_env(address: str, shim: Path | None) -> dict[str, str]:
    return {"SANDBOX_OWN_ADDRESS": address, "LD_PRELOAD": str(shim)} if shim is not None else {}


def _dotfile(home: Path, sim_dir: Path, network: dict[str, str] | None = None) -> str:
    # Debian's /etc/profile resets PATH for login shells and bash reads ~/.bashrc even for
    # `ssh host cmd`, so the stand-ins must come first from the host's own dotfiles (reference 8).
    return f"""# deployctl sandbox (SIMULATION): this host's stand-ins come first.
case ":$PATH:" in *":{home}/bin:"*) ;; *) PATH="{home}/bin:$PATH" ;; esac
export PATH
case ":${{PYTHONPATH:-}}:" in *":{home}/pylib:"*) ;; *) PYTHONPATH="{home}/pylib${{PYTHONPATH:+:$PYTHONPATH}}" ;; esac
export PYTHONPATH
export SGLANG_SIM_CONFIG="{sim_dir}/config.json"
export NVIDIA_SMI_SIM_CONFIG="{sim_dir}/config.json"
""" + "".join(f'export {k}="{v}"\n' for k, v in (network or {}).items())


def _chown_tree(path: Path, uid: int, gid: int) -> None:
    os.chown(path, uid, gid)
    for dirpath, dirnames, filenames in os.walk(path):
        for n in dirnames + filenames:
            os.chown(os.path.join(dirpath, n), uid, gid, follow_symlinks=False)


def _build_pylib_template(root: Path) -> Path:
    """The stand-in packages (sglang, torch, safetensors) with their bytecode, as ``pip install`` leaves
    a package: compiled once here by the hosts' python3, copied into every home (mtimes kept, so the
    bytecode stays valid). A reset rebuilds a home, and without the bytecode each host's first import
    after it compiled the stand-in again (launch_server.py alone about 20 ms, 2026-12-06). A python3
    of another version ignores or rewrites it, as it would any stale cache."""
    template = root / PYLIB_TEMPLATE
    if template.exists():
        shutil.rmtree(template)
    template.mkdir()
    for package in (_SIM_SGLANG, *_SIM_SIBLINGS):
        shutil.copytree(package, template / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    python = shutil.which("python3", path=HOST_PATH)
    if python is not None:
        subprocess.run([python, "-I", "-m", "compileall", "-q", str(template)], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=120)
    return template


def _build_home(name: str, home: Path, gpus: int, sglang_version: str, drafter_cache: Path,
                address: str, shim: Path | None, sim_env: dict[str, str] | None = None) -> None:
    if home.exists():
        shutil.rmtree(home)
    for sub in ("bin", "pylib", "dev", ".sim/alloc", "drafters", "models"):
        (home / sub).mkdir(parents=True, exist_ok=True)
    home.chmod(0o755)
    sim_dir = home / ".sim"
    # this host's own network stack (sim_network.c): 0.0.0.0 and 127.0.0.1 are its address
    dotfile = _dotfile(home, sim_dir, {**_network_env(address, shim), **(sim_env or {})})
    for rc in (".bashrc", ".profile", ".bash_profile"):
        (home / rc).write_text(dotfile)
    for i in range(gpus):
        (home / "dev" / f"nvidia{i}").touch(mode=0o666)
    (home / "dev" / "nvidiactl").touch(mode=0o666)
    # the stand-in as a module beside a three-line launcher: a script is compiled on every start, a
    # module once (its bytecode cached in .sim/lib/__pycache__), and -IS skips site; about 6 of the
    # stand-in's 21 ms of CPU per call, and the suite's hosts call it some 2,500 times per run
    (sim_dir / "lib").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_SIM_NVIDIA_SMI, sim_dir / "lib" / "sim_nvidia_smi.py")
    launcher = nvidia_smi_launcher(sim_dir / "lib")
    # the C fast path answers deployctl's two queries and execs this launcher for everything else
    (sim_dir / "lib" / "sim_nvidia_smi_main.py").write_text(launcher)
    smi = home / "bin" / "nvidia-smi"
    fast = drafter_cache.parent / NVIDIA_SMI_FAST  # built by start_sandbox under the root, as the template
    if fast.is_file():
        shutil.copyfile(fast, smi)
    else:
        smi.write_text(launcher)
    smi.chmod(0o755)
    template = drafter_cache.parent / PYLIB_TEMPLATE  # both built by start_sandbox under the root
    for package in (_SIM_SGLANG, *_SIM_SIBLINGS):
        if (template / package.name).is_dir():
            shutil.copytree(template / package.name, home / "pylib" / package.name)
        else:  # a sandbox started before the template existed
            shutil.copytree(package, home / "pylib" / package.name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    _install_sglang_version(home, sglang_version)
    config = {
        "simulated": True,
        "host": name,
        "address": address,
        "gpu_count": gpus,
        "gpu_dir": str(home / "dev"),
        "gpu_total_mib": GPU_TOTAL_MIB,
        "gpu_name": GPU_NAME,
        "uuids": [_uuid(name, i) for i in range(gpus)],
        "pci_bus_ids": [_bus_id(i) for i in range(gpus)],
        "alloc_dir": str(sim_dir / "alloc"),
        "driver_failed_flag": str(sim_dir / "driver_failed"),
        "sglang_version": sglang_version,
    }
    (sim_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    shutil.copytree(drafter_cache, home / DRAFTER_REL)
    drafter_mod.write_base_model(home / BASE_MODEL_REL)


def _install_sglang_version(home: Path, version: str) -> None:
    """Package metadata (``importlib.metadata.version("sglang")`` reads it) and the model sources
    whose EAGLE-3 capture hook depends on the version, as a pip install of that version has them."""
    pylib = home / "pylib"
    for old in pylib.glob("sglang-*.dist-info"):
        shutil.rmtree(old)
    info = pylib / f"sglang-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n"
        "Summary: SIMULATED SGLang stand-in (deployctl sandbox TEST DOUBLE)\n")
    (info / "top_level.txt").write_text("sglang\n")
    numbers = tuple(int(x) for x in re.findall(r"\d+", version)[:3])
    (pylib / "sglang" / "srt" / "models" / "kimi_k25.py").write_text(kimi_k25_source(numbers))
    if home.exists():
        st = home.stat()
        _chown_tree(pylib, st.st_uid, st.st_gid)


#: how every sandbox sshd authenticates and what it leaves out (the test hosts' and the fleet-scale
#: benchmark's, tests/benchmarks/bench_fleet_scale.py): keys only, no PAM, no forwarding
SSHD_HARDENING = """PermitRootLogin no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PermitUserEnvironment no
UseDNS no
X11Forwarding no
PrintMotd no
PrintLastLog no
"""


def login_env(home: Path | str, address: str, shim: Path) -> str:
    """The one SetEnv line of a sandbox user's sessions: its stand-ins first on PATH and PYTHONPATH,
    their config, the host's own network stack (sim_network.c)."""
    return " ".join([
        f"PATH={home}/bin:/usr/local/bin:/usr/bin:/bin",
        f"PYTHONPATH={home}/pylib",
        f"SGLANG_SIM_CONFIG={home}/.sim/config.json",
        f"NVIDIA_SMI_SIM_CONFIG={home}/.sim/config.json",
        *(f"{k}={v}" for k, v in _network_env(address, shim).items()),
    ])


def _sshd_config(root: Path, host: dict, host_key: Path, authorized_keys: Path) -> str:
    return f"""# deployctl sandbox (SIMULATION) host {host['name']}
ListenAddress {host['address']}:{host['port']}
HostKey {host_key}
PidFile {root}/sshd/{host['name']}/sshd.pid
AuthorizedKeysFile {authorized_keys}
AllowUsers {host['user']}
{SSHD_HARDENING}LogLevel {host.get('log_level', 'INFO')}
MaxStartups 64:30:128
MaxSessions 64
LoginGraceTime 30
Subsystem sftp internal-sftp
# sshd honours only the first SetEnv line: every variable goes on this one.
SetEnv {login_env(host["home"], host["address"], _shim(root))}
"""


def _wait_for_banner(proc: subprocess.Popen, address: str, port: int, log: Path) -> str | None:
    """None when the port answers with an SSH banner; else why not ('bind' or 'exit'/'timeout')."""
    deadline = time.monotonic() + SSHD_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            text = log.read_text(errors="replace") if log.exists() else ""
            return "bind" if "Address already in use" in text else "exit"
        try:
            with socket.create_connection((address, port), timeout=0.5) as s:
                s.settimeout(2.0)
                if s.recv(64).startswith(b"SSH-"):
                    return None
        except OSError:
            pass
        time.sleep(0.05)
    return "timeout"


def _log_tail(log: Path, lines: int = 15) -> str:
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _start_sshd(root: Path, host: dict, host_key: Path, authorized_keys: Path) -> subprocess.Popen:
    sshd_dir = root / "sshd" / host["name"]
    config_path = sshd_dir / "sshd_config"
    log = sshd_dir / "sshd.log"
    why = "never tried"
    for _attempt in range(PORT_ATTEMPTS):
        host["port"] = _free_port(host["address"])
        config_path.write_text(_sshd_config(root, host, host_key, authorized_keys))
        with open(log, "ab") as logf:
            proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config_path)],
                                    stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT,
                                    start_new_session=True)
        _sshd_children[proc.pid] = proc
        why = _wait_for_banner(proc, host["address"], host["port"], log)
        if why is None:
            return proc
        _stop_sshd(proc.pid, str(config_path))
        if why != "bind":
            break  # a port race is worth another port; anything else is not
    raise SandboxError(f"sshd for sandbox host {host['name']} ({host['address']}) did not come up "
                       f"({why}); log {log}:\n{_log_tail(log)}")


def start_sandbox(
    root: Path,
    names: Sequence[str] = ("sb1",),
    gpus: int = 8,
    sglang_version: str = "0.5.11",
    *,
    address_base: int = FIRST_ADDRESS_OCTET,
    user_prefix: str = USER_PREFIX,
    stop_at_exit: bool = False,
    log_level: str = "INFO",
    sim_env: dict[str, str] | None = None,
) -> Sandbox:
    """Start one simulated GPU host per name under ``root`` and write ``root/deployctl.yaml``.

    Host i listens on 127.0.0.(address_base + i) and logs in as ``user_prefix + name`` (one of
    USER_PREFIXES: sandboxes on other addresses and prefixes run side by side). Whatever is recorded under ``root`` from an
    earlier run (a crashed test session) is stopped first. With ``stop_at_exit`` the sandbox is
    also stopped when this Python process exits normally. ``log_level`` is sshd's LogLevel
    (VERBOSE logs each forwarded direct-tcpip channel, which the jump-host tests count).
    ``sim_env``: stand-in settings (``SGLANG_SIM_*``) exported by every host's dotfiles, so every
    command on the host sees them (the tests: a 0.2 s ``import sglang`` for bench_serving's rounds
    and the swap sender; without it, the stand-ins' faithful defaults).
    """
    if log_level not in ("INFO", "VERBOSE", "DEBUG", "DEBUG1", "DEBUG2", "DEBUG3"):
        raise SandboxError(f"log_level {log_level!r}: expected INFO, VERBOSE or DEBUG[1-3]")
    reason = sandbox_unavailable_reason()
    if reason:
        raise SandboxError(f"cannot start the sandbox: {reason}")
    if user_prefix not in USER_PREFIXES:
        raise SandboxError(f"user_prefix {user_prefix!r}: expected one of {', '.join(USER_PREFIXES)}")
    names = list(names)
    _check_names(names, user_prefix)
    for key, value in (sim_env or {}).items():
        if not (re.fullmatch(r"SGLANG_SIM_[A-Z_]+", key) and re.fullmatch(r"[0-9.]+", value)):
            raise SandboxError(f"sim_env {key}={value!r}: expected SGLANG_SIM_<NAME>=<number>")
    if gpus < 1:
        raise SandboxError(f"gpus must be >= 1, got {gpus}")
    if not (1 <= address_base and address_base + len(names) <= 255):
        raise SandboxError(f"address_base {address_base}: 127.0.0.x addresses run out")
    root = Path(root).absolute()
    if any(c in str(root) for c in ":,\n"):
        raise SandboxError(f"sandbox root {root}: ':' ',' and newlines are not allowed in the path")
    _check_traversable(root)
    root.mkdir(parents=True, exist_ok=True)
    root = root.resolve()
    root.chmod(0o755)
    _check_traversable(root)

    stop_sandbox(root)  # whatever an earlier (crashed) run left under this root
    addresses = {f"127.0.0.{address_base + i}" for i in range(len(names))}
    users = {user_prefix + n for n in names}
    conflicts = _live_conflicts(addresses, users, root)
    if conflicts:
        raise SandboxError("another sandbox is running on the same addresses or users: "
                           + "; ".join(conflicts))
    for pw in _sandbox_users():  # dead leftovers of other roots with our user names
        if pw.pw_name in users:
            _remove_user(pw.pw_name)
    for user in users:
        if _user_exists(user):
            raise SandboxError(f"user {user} exists and was not created by the sandbox; "
                               "choose other host names")

    for sub in ("hosts", "sshd"):
        (root / sub).mkdir(exist_ok=True)
        (root / sub).chmod(0o755)
    if (root / "mux").exists():
        shutil.rmtree(root / "mux")
    (root / "mux").mkdir(mode=0o700)
    client_key = root / "client_key"
    client_pub = _keygen(client_key, "deployctl-sandbox-client")
    authorized_keys = root / "authorized_keys"
    authorized_keys.write_text(client_pub + "\n")
    authorized_keys.chmod(0o644)
    known_hosts = root / "known_hosts"
    config_path = root / "deployctl.yaml"
    shim = _build_network_shim(root)
    _build_nvidia_smi_fast(root)
    drafter_cache = root / "drafter-template"
    if drafter_cache.exists():
        shutil.rmtree(drafter_cache)
    drafter_mod.write_eagle3_drafter(drafter_cache, layout="speculators")
    _build_pylib_template(root)

    state: dict = {
        "format": 1, "simulated": True, "root": str(root), "created": time.time(),
        "instance": uuid.uuid4().hex,
        "sglang_version": sglang_version, "gpus": gpus, "sim_env": dict(sim_env or {}), "client_key": str(client_key),
        "known_hosts": str(known_hosts), "config_path": str(config_path), "hosts": [],
    }
    if stop_at_exit:
        atexit.register(_stop_at_exit, root, state["instance"])
    try:
        known_lines = []
        for i, name in enumerate(names):
            user = user_prefix + name
            home = root / "hosts" / name
            host = {"name": name, "address": f"127.0.0.{address_base + i}", "port": None,
                    "user": user, "home": str(home), "gpu_count": gpus,
                    "gpu_glob": f"{home}/dev/nvidia*", "state_dir": str(home / ".deployctl"),
                    "sim_dir": str(home / ".sim"), "sshd_pid": None,
                    "sshd_config": str(root / "sshd" / name / "sshd_config"),
                    "sshd_log": str(root / "sshd" / name / "sshd.log"), "log_level": log_level}
            state["hosts"].append(host)
            _run_checked(["useradd", "-M", "-U", "-s", "/bin/bash", "-d", str(home), "-p", "*",
                          "-c", _gecos(root), user], f"useradd {user}")
            _write_state(root, state)  # recorded before anything else can fail
            pw = pwd.getpwnam(user)
            host["uid"] = pw.pw_uid
            _build_home(name, home, gpus, sglang_version, drafter_cache, host["address"], shim, sim_env)
            _chown_tree(home, pw.pw_uid, pw.pw_gid)
            sshd_dir = root / "sshd" / name
            sshd_dir.mkdir(exist_ok=True)
            (sshd_dir / "sshd.log").unlink(missing_ok=True)
            host_pub = _keygen(sshd_dir / "ssh_host_ed25519_key", f"sandbox-{name}")
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation dir
            proc = _start_sshd(root, host, sshd_dir / "ssh_host_ed25519_key", authorized_keys)
            host["sshd_pid"] = proc.pid
            _write_state(root, state)
            key_type, key_b64 = host_pub.split()[:2]
            known_lines.append(f"[{host['address']}]:{host['port']} {key_type} {key_b64}\n")
            known_hosts.write_text("".join(known_lines))
        known_hosts.chmod(0o644)
        _write_deployctl_yaml(config_path, state)
        sandbox = _sandbox_from_state(state)
        for h in sandbox.hosts:
            _self_check(sandbox, h)
    except BaseException:
        stop_sandbox(root)
        raise
    return sandbox


def _self_check(sandbox: Sandbox, host: SandboxHost) -> None:
    """Log in once the way tests and deployctl will; a broken host fails here, not later."""
    try:
        res = sandbox.run(host.name, "id -un; command -v nvidia-smi", timeout=20)
    except subprocess.TimeoutExpired:
        raise SandboxError(f"sandbox host {host.name}: ssh login timed out") from None
    want = f"{host.user}\n{host.home}/bin/nvidia-smi"
    if res.returncode != 0 or res.stdout.strip() != want:
        log = sandbox.root / "sshd" / host.name / "sshd.log"
        raise SandboxError(f"sandbox host {host.name}: ssh self-check failed (exit {res.returncode}); "
                           f"stdout {res.stdout.strip()!r}, stderr {res.stderr.strip()!r}; "
                           f"sshd log {log}:\n{_log_tail(log)}")


def _stop_at_exit(root: Path, instance: str) -> None:
    """Stop the sandbox this process started, unless it is already stopped.

    The instance check matters: once this process stopped its sandbox, another process (the next
    test session) may have started a new one under the same root.
    """
    try:
        state = _read_state(root)
        if state is not None and state.get("instance") == instance:
            stop_sandbox(root)
    except Exception:  # noqa: BLE001 - at interpreter exit there is nobody left to tell
        pass


def deployctl_config(state: dict) -> dict:
    """The deployctl YAML config (as a dict) that points at the sandbox hosts."""
    hosts = state["hosts"]
    return {
        "ssh": {
            # the sandbox describes its hosts completely; the machine's ~/.ssh/config must not
            # redirect them (tests of ssh_config handling set their own file)
            "config_file": "none",
            "known_hosts": state["known_hosts"],
            "host_key_policy": "reject",
            "connect_timeout_s": 10,
            "command_timeout_s": 120,
            "max_parallel": 8,
        },
        "hosts": [
            {
                "name": h["name"],
                "address": h["address"],
                "port": h["port"],
                "user": h["user"],
                "identity_file": state["client_key"],
                "gpus": h["gpu_count"],
                "gpu_devices": h["gpu_glob"],
                "python": "python3",
                # the default form, resolved on the host: a sandbox root under /tmp (a clone
                # there) must not trip the "never /tmp" guard meant for real hosts
                "state_dir": "~/.deployctl",
                "groups": ["sandbox"],
            }
            for h in hosts
        ],
        "runs": [
            {
                "name": "sandbox",
                "group": "sandbox",
                "base_model": f"~/{BASE_MODEL_REL}",
                "drafter": f"~/{DRAFTER_REL}",
                "tp_size": min(8, int(state["gpus"])),
                "serve_host": None,
                "port": 30000,
                "draft_tokens": 16,
                "eagle_topk": 1,
                "extra_args": ["--mem-fraction-static", "0.85"],
                "env": {},
            }
        ],
    }


class _Quoted(str):
    """A YAML string written in double quotes ('~/x' and globs read better quoted)."""


class _ConfigDumper(yaml.SafeDumper):
    pass


def _represent_list(dumper: yaml.SafeDumper, data: list):
    flow = all(isinstance(x, (str, int, float, bool)) or x is None for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_ConfigDumper.add_representer(list, _represent_list)
_ConfigDumper.add_representer(
    _Quoted, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", str(s), style='"'))


def _write_deployctl_yaml(path: Path, state: dict) -> None:
    header = ("# deployctl config for the SANDBOX (simulated GPU hosts on this machine; test double).\n"
              f"# Written by sandbox.start_sandbox; stop with: python -m sandbox stop "
              f"--root {state['root']}\n")
    config = deployctl_config(state)
    for h in config["hosts"]:
        h["gpu_devices"] = _Quoted(h["gpu_devices"])
    for run in config["runs"]:
        run["base_model"] = _Quoted(run["base_model"])
        run["drafter"] = _Quoted(run["drafter"])
        run["extra_args"] = [_Quoted(a) for a in run["extra_args"]]
    body = yaml.dump(config, Dumper=_ConfigDumper, sort_keys=False, default_flow_style=False)
    path.write_text(header + body)


def sandbox_status(root: Path) -> dict:
    """What is recorded under root and whether each host's sshd is alive."""
    root = Path(root).resolve()
    state = _read_state(root)
    if state is None:
        return {"root": str(root), "running": False, "hosts": []}
    hosts = []
    for h in state["hosts"]:
        pid = h.get("sshd_pid")
        alive = bool(pid) and _pid_alive(int(pid)) and h["sshd_config"] in _cmdline(int(pid))
        hosts.append({"name": h["name"], "address": h["address"], "port": h["port"], "user": h["user"],
                      "home": h["home"], "sshd_pid": pid, "sshd_alive": alive,
                      "user_exists": _user_exists(h["user"])})
    return {"root": str(root), "running": any(h["sshd_alive"] for h in hosts),
            "config_path": state["config_path"], "sglang_version": state.get("sglang_version"),
            "hosts": hosts}
