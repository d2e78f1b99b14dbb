#!/usr/bin/env python3
"""Gather the facts ``deployctl doctor`` judges, as ONE JSON document on stdout. Reads, never writes.

Runs on the GPU host, standard library only, Python 3.8+. It is sent inline (``python3 -c``), so
a doctor run leaves no file behind, even on a host that has never seen deployctl. Two modes:

* ``host SPEC_JSON`` under the host's python: nvidia-smi's raw output, the gpu_devices glob, who
  listens on the serve port (/proc/net/tcp{,6} and /proc/*/fd socket inodes), whether serve_host
  is an address of this host, the state/logs directories (writable, free space), the base model's
  and the drafter's config.json and the drafter's safetensors headers (names and shapes only).
* ``sglang SPEC_JSON`` under the run's sglang_python: the installed SGLang's version from its
  package metadata and, in its own model sources (sglang/srt/models/*.py), whether the base
  model's architecture class has ``set_eagle3_layers_to_capture``. It never imports sglang or
  torch: ``import sglang`` costs seconds and hundreds of MiB on a real install, and
  ``importlib.util.find_spec`` does not execute a top-level package's ``__init__``.

Every fact that cannot be read is reported with the reason (``error``), never left out: the
checks treat "cannot tell" as a warning, not as a pass. Parsing and verdicts live in deployctl.
"""

import errno, glob, json, os, re, sys  # noqa: E401
import stat as stat_module

if __package__:  # imported locally, as deploy.remote.doctor_facts
    import shutil, socket, subprocess  # noqa: E401
    from . import host_ops, package_metadata, sglang_cli
    from .state_files import loads_json
    from .listeners import listeners, socket_owners
    from .fixer.errors import FixError
    from .fixer.header import read_header as read_safetensors_header
elif sys.argv[1:2] == ["sglang"]:  # inline, each mode imports (so compiles: facts/inline.py) what it runs
    import package_metadata  # type: ignore[no-redef]
    import sglang_cli  # type: ignore[no-redef]
    from state_files import loads_json  # type: ignore[no-redef]
else:  # host mode: the fixer's modules travel as the package "fixer", and host_ops
    import shutil, socket, subprocess  # noqa: E401
    import host_ops  # type: ignore[no-redef]
    from state_files import loads_json  # type: ignore[no-redef]
    from listeners import listeners, socket_owners  # type: ignore[no-redef]
    from fixer.errors import FixError  # type: ignore[no-redef]
    from fixer.header import read_header as read_safetensors_header  # type: ignore[no-redef]

SCHEMA = 1
MAX_JSON_BYTES = 4 << 20
MAX_OUTPUT_CHARS = 65536
GPU_QUERY = ["--query-gpu=index,uuid,memory.used,memory.total,utilization.gpu",
             "--format=csv,noheader,nounits"]
HOOK = "set_eagle3_layers_to_capture"
#: SGLang's variables the doctor judges (srt/environ.py). Only these names are reported, never the
#: rest of the environment (it may hold tokens); each value is cut at 200 characters.
SERVER_ENV_NAMES = ("SGLANG_SIMULATE_ACC_LEN", "SGLANG_ENABLE_SPEC_V2")
#: files a quantized checkpoint may declare its method in besides config.json's quantization_config
#: (SGLang 0.5.23 get_config_filenames: awq/gptq quantize_config.json or quant_config.json, modelopt
#: hf_quant_config.json, auto-round quantization_config.json, modelslim quant_model_description.json)
QUANT_FILES = ("hf_quant_config.json", "quant_config.json", "quant_model_description.json",
               "quantization_config.json", "quantize_config.json")


def _error(exc):
    return "%s: %s" % (type(exc).__name__, exc)


def open_regular(path):
    """A binary file object for the regular file ``path``; OSError naming it for anything else.

    stat first and O_NONBLOCK (HOSTILE, issue 22): a FIFO as a drafter's file held doctor/up for
    75 s, then failed naming the helper instead of the file.
    """
    if not stat_module.S_ISREG(os.stat(path).st_mode):  # a socket would fail the open with ENXIO
        raise OSError(errno.EINVAL, "not a regular file (a FIFO, device, socket or directory)", path)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        if not stat_module.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(errno.EINVAL, "not a regular file (a FIFO, device, socket or directory)", path)
    except BaseException:
        os.close(fd)
        raise
    return os.fdopen(fd, "rb")


def _python():
    return {"executable": sys.executable, "version": "%d.%d.%d" % sys.version_info[:3]}


# ---------------------------------------------------------------------------------------------
# host mode

def nvidia_smi(program):
    found = shutil.which(program)
    if found is None:
        return {"found": False, "exit_code": None, "stdout": "", "stderr": "",
                "error": "%s not found on PATH" % program}
    # bounded in bytes and time (host_ops.run_bounded): a 60 MB answer is refused, not shipped
    done = host_ops.run_bounded([found] + GPU_QUERY, 20.0)
    if done["exit_code"] in (124, 125, 127):
        return {"found": True, "exit_code": None, "stdout": "", "stderr": "", "error": done["stderr"]}
    return {"found": True, "exit_code": done["exit_code"], "stdout": done["stdout"][:MAX_OUTPUT_CHARS],
            "stderr": done["stderr"][-2000:], "error": None}


#: the compute-apps query deployctl parses (deploy/facts/gpus.py COMPUTE_APPS_COMMAND: the same fields, order)
APPS_QUERY = ["--query-compute-apps=gpu_uuid,pid,used_memory,process_name", "--format=csv,noheader,nounits"]
MAX_HOLDERS = 256


def recorded_server(pidfile, record):
    """The PID file's process (alive: a live process whose command line says sglang, host_ops'
    rule) and the run its deployment record names."""
    pid = read_pid(pidfile)["pid"]
    running = pid is not None and host_ops.alive(pid) and "sglang" in host_ops.cmdline(pid)
    document, _ = read_json(record)
    run = document.get("run") if isinstance(document, dict) else None
    return {"pid": pid, "alive": running, "cmdline": _cmdline(pid) if running else None,
            "run": run if isinstance(run, str) else None}


def device_holders(pattern):
    """Every process this user can see holding one of the GPU device files open (what free-gpus' fuser finds):
    pid, uid, user, session, command line. Issue 39: the doctor names each before anything is stopped."""
    devices = set(os.path.realpath(p) for p in glob.glob(os.path.expanduser(pattern))[:1024])
    found = []
    if not devices:
        return found
    try:
        pids = sorted(int(name) for name in os.listdir("/proc") if name.isdigit())
    except OSError:
        return found
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue  # gone, or another user's (not readable): fuser cannot see it either
        held = False
        for fd in fds:
            try:
                if os.readlink("/proc/%d/fd/%s" % (pid, fd)) in devices:
                    held = True
                    break
            except OSError:
                continue
        if not held:
            continue
        uid = host_ops._uid(pid)
        try:
            import pwd
            user = pwd.getpwuid(uid).pw_name if uid is not None else None
        except (KeyError, ImportError):
            user = None
        found.append({"pid": pid, "uid": uid, "user": user, "session": _session(pid), "cmdline": _cmdline(pid)})
        if len(found) >= MAX_HOLDERS:
            break
    return found


def gpu_holders(program, pidfile, record, devices=None):
    """What wait-gpus-free will need and stop-stale/free-gpus would end, read before anything is stopped:
    the compute-apps answer (raw; deployctl parses it strictly) and, per listed pid, whether this user
    can end it (same uid, or root), its session and command line; plus the PID file's server."""
    found = shutil.which(program)
    facts = {"apps": {"exit_code": None, "stdout": "", "stderr": "", "error": None}, "processes": {},
             "uid": os.getuid(), "server": recorded_server(pidfile, record),
             "device_holders": device_holders(devices) if devices else []}
    if found is None:
        facts["apps"]["error"] = "%s not found on PATH" % program
        return facts
    try:
        proc = subprocess.run([found] + APPS_QUERY, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              timeout=20, universal_newlines=True)
    except (OSError, subprocess.SubprocessError) as exc:
        facts["apps"]["error"] = _error(exc)
        return facts
    facts["apps"].update(exit_code=proc.returncode, stdout=proc.stdout[:MAX_OUTPUT_CHARS], stderr=proc.stderr[-2000:])
    pids = []
    for line in proc.stdout.splitlines()[:MAX_HOLDERS]:
        parts = [p.strip() for p in line.split(",", 3)]
        if len(parts) == 4 and parts[1].isdigit():
            pids.append(int(parts[1]))
    for pid in sorted(set(pids)):
        uid = host_ops._uid(pid)
        facts["processes"][str(pid)] = {
            "visible": uid is not None, "uid": uid, "session": _session(pid),
            "cmdline": _cmdline(pid) if uid is not None else None}
    return facts


def gpu_devices(pattern):
    expanded = os.path.expanduser(pattern)
    return {"pattern": pattern, "expanded": expanded, "matches": sorted(glob.glob(expanded))[:1024]}


def _cmdline(pid):
    """The process's command line (host_ops' /proc reader), None when it cannot be read."""
    if host_ops._read("/proc/%d/cmdline" % pid) is None:
        return None
    return host_ops.cmdline(pid)[:500]


def _session(pid):
    """The process's session id (host_ops' /proc/PID/stat parser), None when it is gone."""
    try:
        stat = host_ops._stat(pid)
    except (IndexError, ValueError):
        return None
    return stat[2] if stat is not None else None


def read_pid(path):
    try:
        with open_regular(path) as handle:
            text = handle.read(64).decode("utf-8", "replace").strip()
    except OSError as exc:
        return {"pid": None, "alive": False, "error": None if not os.path.exists(path) else _error(exc)}
    if not re.match(r"^\d+$", text):
        return {"pid": None, "alive": False, "error": "PID file holds %r" % text[:40]}
    pid = int(text)
    return {"pid": pid, "alive": os.path.exists("/proc/%d" % pid), "error": None}


def port_facts(port, pidfile):
    found, errors = listeners(port)
    owners = socket_owners([f["inode"] for f in found])
    for entry in found:
        entry["holders"] = [{"pid": pid, "session": _session(pid), "cmdline": _cmdline(pid)}
                            for pid, inodes in sorted(owners.items()) if entry["inode"] in inodes]
    return {"port": port, "listeners": found, "errors": errors, "server": read_pid(pidfile), "uid": os.getuid()}


def bind_check(address, port=0):
    """Can a socket bind ``address``? EADDRNOTAVAIL: not an address of this host. With ``port``:
    ``port_free``, would a bind of that port on it succeed now (None: not decided)."""
    if not address:
        return {"address": address, "bindable": False, "error": "empty address"}
    try:
        infos = socket.getaddrinfo(address, 0, 0, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError, ValueError) as exc:
        return {"address": address, "bindable": False, "error": _error(exc)}
    last = None
    for family, kind, proto, _, sockaddr in infos:
        try:
            sock = socket.socket(family, kind, proto)
        except OSError as exc:
            last = exc
            continue
        try:
            sock.bind(sockaddr)
            return {"address": address, "bindable": True, "error": None, "port_free": _port_free(family, sockaddr, port)}
        except OSError as exc:
            last = exc
        finally:
            sock.close()
    return {"address": address, "bindable": False, "error": _error(last) if last else "no address"}


def _port_free(family, sockaddr, port):
    """Would SGLang's own bind of (address, port) succeed now? (uvicorn sets SO_REUSEADDR.) The
    kernel's answer, for the address the server binds: /proc/net/tcp lists every listener of the
    port, and which of them clash with a wildcard is the kernel's rule to apply, not ours."""
    if not port:
        return None
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((sockaddr[0], port) + tuple(sockaddr[2:]))
        return True
    except OSError as exc:
        return False if exc.errno == errno.EADDRINUSE else None
    finally:
        sock.close()


def directory(path):
    """Would ``mkdir -p path`` and writing into it work, and how much space is free there?"""
    expanded = os.path.expanduser(path)
    facts = {"path": path, "expanded": expanded, "exists": os.path.lexists(expanded),
             "is_dir": os.path.isdir(expanded), "writable": False, "free_mib": None, "checked": expanded,
             "error": None}
    if facts["exists"] and not facts["is_dir"]:
        facts["error"] = "exists but is not a directory"
        return facts
    probe = expanded
    while not os.path.isdir(probe):  # the nearest existing ancestor is what mkdir -p writes into
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    facts["checked"] = probe
    facts["writable"] = os.access(probe, os.W_OK | os.X_OK)
    try:
        st = os.statvfs(probe)
        facts["free_mib"] = st.f_bavail * st.f_frsize // (1 << 20)
    except OSError as exc:
        facts["error"] = _error(exc)
    return facts


def read_json(path):
    try:
        with open_regular(path) as handle:
            raw = handle.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        return None, _error(exc)
    if len(raw) > MAX_JSON_BYTES:
        return None, "larger than %d bytes" % MAX_JSON_BYTES
    try:
        value = loads_json(raw.decode("utf-8"))
    except (ValueError, UnicodeError) as exc:
        return None, "not valid JSON: %s" % exc
    if not isinstance(value, dict):
        return None, "not a JSON object"
    return value, None


def read_header(path):
    """name -> shape, read and validated by the key fixer's own header reader (fixer/header.py)."""
    if os.path.exists(path) and not os.path.isfile(path):
        raise ValueError("%s is not a regular file (a FIFO, device, socket or directory)" % path)
    try:
        return read_safetensors_header(path, os.path.basename(path)).shapes()
    except FixError as exc:
        raise ValueError(exc.message)


def model_dir(path, tensors):
    expanded = os.path.expanduser(path)
    facts = {"path": path, "expanded": expanded, "exists": os.path.isdir(expanded),
             "readable": os.path.isdir(expanded) and os.access(expanded, os.R_OK | os.X_OK),
             "config": None, "config_error": None, "quant_files": []}
    if not facts["readable"]:
        return facts
    facts["config"], facts["config_error"] = read_json(os.path.join(expanded, "config.json"))
    facts["quant_files"] = [n for n in QUANT_FILES if os.path.isfile(os.path.join(expanded, n))]
    if tensors:
        facts["files"], facts["files_error"] = {}, None
        index, index_error = read_json(os.path.join(expanded, "model.safetensors.index.json"))
        try:
            if index is not None:
                names = sorted(set(str(v) for v in (index.get("weight_map") or {}).values()))
            else:
                names = sorted(n for n in os.listdir(expanded) if n.endswith(".safetensors"))
            for name in names:
                try:
                    facts["files"][name] = read_header(os.path.join(expanded, name))
                except (OSError, ValueError) as exc:
                    facts["files"][name] = None
                    facts["files_error"] = "%s: %s" % (name, _error(exc))
        except OSError as exc:
            facts["files_error"] = _error(exc)
    return facts


#: deploy/facts/helpers.py MAX_HASHED_BYTES
MAX_HASHED_BYTES = 128 << 20


def sha256_of(path):
    import hashlib

    try:
        with open_regular(os.path.expanduser(path)) as handle:
            digest = hashlib.sha256()
            total = 0
            for block in iter(lambda: handle.read(1 << 20), b""):
                total += len(block)
                if total > MAX_HASHED_BYTES:  # a helper is a few hundred KB; never hash a growing file whole
                    return None
                digest.update(block)
            return digest.hexdigest()
    except OSError:
        return None


def read_record(path):
    """A deployment record (deployment.json, last-good.json): its JSON text, or None when absent."""
    try:
        with open_regular(os.path.expanduser(path)) as handle:
            return handle.read(1 << 20).decode("utf-8", "replace")
    except OSError as exc:
        if exc.errno == errno.EINVAL:  # not a regular file: say so (the parser names the file)
            return "(not a regular file: %s)" % path
        return None


def server_state(spec):
    """The PID file's server exactly as ``host_ops.py server-state`` reports it (the same code)."""
    import argparse

    args = argparse.Namespace(pidfile=os.path.expanduser(spec["pidfile"]), record=os.path.expanduser(spec["record"]),
                              url=spec["health_url"], timeout=3.0)
    return host_ops.cmd_server_state(args)


def run_state(spec):
    """What the run's later steps would otherwise read with one command each: the installed helpers'
    sha256 (ensure-helper), the server (converge), the last good record (record-good, regression-gate)."""
    state = {"helpers": dict((name, sha256_of(path)) for name, path in sorted(spec["helpers"].items())),
             "server": server_state(spec["server"]), "last_good": read_record(spec["last_good"])}
    if "quarantine" in spec:  # the quarantine step's record (deploy/facts/quarantine.py)
        state["quarantine"] = {"text": read_record(spec["quarantine"])}
    return state


def start_sglang_part(spec, program):
    """Start the SGLang facts under the run's sglang_python (a second interpreter, same exec channel);
    it runs while this one gathers the host facts. Returns the process, or the failure document."""
    argv = [spec["python"], "-c", BOOT, program, "sglang", json.dumps(spec["spec"])]
    env = dict(os.environ, **spec["env"]) if spec.get("env") else None
    try:
        return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    except OSError as exc:
        return {"exit_code": 127, "stdout": "", "stderr": "%s: not found (%s)" % (spec["python"], _error(exc))}


def finish_sglang_part(proc, spec):
    if isinstance(proc, dict):
        return proc
    try:
        out, err = proc.communicate(timeout=float(spec.get("timeout_s", 60)))
        code = proc.returncode
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        code = 124
    return {"exit_code": code, "stdout": out.decode("utf-8", "replace")[-(1 << 20):],
            "stderr": err.decode("utf-8", "replace")[-4000:]}


def server_env():
    """SERVER_ENV_NAMES as this process has them. The doctor runs over the same SSH exec channel
    as the launch (the same shell startup files, sshd's SetEnv, /etc/environment), so the server
    starts with these values unless the run's env file (sourced at launch) overrides them."""
    return dict((name, os.environ[name][:200]) for name in SERVER_ENV_NAMES if name in os.environ)


#: for each argument, print it when ``command -v`` does not find it (the shell's own lookup, as the
#: launch script's ``setsid nohup PYTHON`` does it)
_LOOKUP = 'for c in "$@"; do command -v "$c" >/dev/null 2>&1 || printf "%s\\n" "$c"; done'


def launch_env(spec):
    """The launch script's preamble under the run's env, without starting anything: which of its
    commands (setsid, nohup, sglang_python) the shell cannot find. ``PATH: ...:$PATH`` written
    literally left the launch unable to find them, seen only after the stop (issue 31)."""
    env = dict(os.environ, **spec["env"])
    result = host_ops.run_bounded(["/bin/sh", "-c", _LOOKUP, "sh"] + list(spec["commands"]), 10.0, 1 << 16, env=env)
    facts = {"names": sorted(spec["env"]), "missing": [], "error": None}
    if result["exit_code"] != 0:
        facts["error"] = "/bin/sh exit %s: %s" % (result["exit_code"], result["stderr"][-300:])
    else:
        facts["missing"] = [line for line in result["stdout"].splitlines() if line][:16]
    return facts


def host_facts(spec):
    return {
        "server_env": server_env(),
        "schema": SCHEMA, "mode": "host", "python": _python(),
        "nvidia_smi": nvidia_smi(spec.get("nvidia_smi", "nvidia-smi")),
        "gpu_devices": gpu_devices(spec["gpu_devices"]),
        "port": port_facts(int(spec["port"]), os.path.expanduser(spec["pidfile"])),
        "serve_host": bind_check(spec["serve_host"], int(spec["port"])),
        "dirs": dict((role, directory(path)) for role, path in sorted(spec["dirs"].items())),
        "base_model": model_dir(spec["base_model"], tensors=False),
        "drafter": model_dir(spec["drafter"], tensors=True),
        "gpu_holders": gpu_holders(spec.get("nvidia_smi", "nvidia-smi"), os.path.expanduser(spec["pidfile"]),
                                   os.path.join(os.path.dirname(os.path.expanduser(spec["pidfile"])), "deployment.json"),
                                   spec["gpu_devices"]),
        "launch_env": launch_env(spec["launch_env"]) if "launch_env" in spec else None,
    }


def host_and_run_facts(spec, program):
    sglang = start_sglang_part(spec["sglang"], program) if "sglang" in spec and program is not None else None
    facts = host_facts(spec)
    if "run_state" in spec:
        facts["run_state"] = run_state(spec["run_state"])
    if sglang is not None:
        facts["sglang_run"] = finish_sglang_part(sglang, spec["sglang"])
    return facts


# ---------------------------------------------------------------------------------------------
# sglang mode

_CLASS = re.compile(r"^class\s+(\w+)\s*(?:\(([^)]*)\))?\s*:", re.M)
_TOP_LEVEL = re.compile(r"^\S", re.M)
_HOOK_DEF = re.compile(r"^\s+def\s+" + HOOK + r"\s*\(", re.M)


def scan_classes(models_dir):
    """class name -> [(file, bases, defines the hook)] over every sglang/srt/models/*.py."""
    classes = {}
    for path in sorted(glob.glob(os.path.join(models_dir, "*.py"))):
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        for match in _CLASS.finditer(text):
            end = _TOP_LEVEL.search(text, match.end())
            body = text[match.end():end.start() if end else len(text)]
            bases = [b.strip().split(".")[-1] for b in (match.group(2) or "").split(",") if b.strip()]
            entry = {"file": os.path.basename(path), "bases": bases,
                     "hook": bool(_HOOK_DEF.search(body)), "entry": ("EntryClass" in text and match.group(1) in
                                                                     text[text.rfind("EntryClass"):])}
            classes.setdefault(match.group(1), []).append(entry)
    return classes


def resolve_hook(classes, arch):
    """Does ``arch`` (or a base class found in the model sources) define the hook?"""
    defs = classes.get(arch)
    if not defs:
        return {"class_found": False, "file": None, "has_hook": False, "via": None, "chain": []}
    first = sorted(defs, key=lambda d: not d["entry"])[0]
    chain, queue, seen = [], [(arch, first)], set()
    while queue and len(chain) < 32:
        name, entry = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        chain.append("%s (%s)" % (name, entry["file"]))
        if entry["hook"]:
            return {"class_found": True, "file": first["file"], "has_hook": True, "via": name, "chain": chain}
        for base in entry["bases"]:
            for candidate in classes.get(base, []):
                queue.append((base, candidate))
    return {"class_found": True, "file": first["file"], "has_hook": False, "via": None, "chain": chain}


def sglang_options(package_dir):
    """The options of SGLang's own command line, read from its source as its parser builds them
    (deploy/remote/sglang_cli.py: the literal add_argument calls of 0.5.12 and older, the Arg fields
    of 0.5.15+); ``options`` None and the reason when unreadable."""
    return sglang_cli.read_options(package_dir)


#: the largest --config file read (SGLang reads any size; a config of options is a few KiB)
MAX_CONFIG_BYTES = 1 << 20
MAX_CONFIG_ITEMS = 4096
#: what the items may weigh in the facts document (the SGLang part's output is read up to 1 MiB)
MAX_CONFIG_JSON = 256 << 10
MAX_PLUGINS = 64
#: the entry point groups SGLang loads plugins from (srt/plugins/__init__.py, 0.5.12 to 0.5.23): a
#: general plugin may extend a choice list (add_quantization_method_choices and the like)
PLUGIN_GROUPS = ("sglang.srt.plugins", "sglang.srt.platforms")


def config_file(path):
    """``--config FILE`` read as SGLang's ConfigArgumentMerger reads it (srt/server_args_config_parser.py,
    0.5.23 srt/utils/server_args_config_parser.py): a .yaml/.yml name, the file there, ``yaml.safe_load``,
    a mapping at the root; each item as the merger turns it into argv (the doctor judges those)."""
    facts = {"path": path, "error": None, "unreadable": None, "items": []}
    suffix = os.path.splitext(path)[1].lower()
    if suffix not in (".yaml", ".yml"):
        facts["error"] = "Config file must be YAML format, got: %s" % (suffix or "no suffix")
        return facts
    if not os.path.exists(path):
        facts["error"] = "Config file not found: %s" % path
        return facts
    if not os.path.isfile(path):
        facts["error"] = "%s is not a regular file" % path
        return facts
    try:
        import yaml
    except ImportError as exc:
        facts["unreadable"] = "PyYAML is not importable under this python (%s)" % _error(exc)
        return facts
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        facts["error"] = "cannot read %s: %s" % (path, _error(exc))
        return facts
    if len(data) > MAX_CONFIG_BYTES:
        facts["unreadable"] = "%s is larger than %d bytes" % (path, MAX_CONFIG_BYTES)
        return facts
    try:
        loaded = yaml.safe_load(data.decode("utf-8"))
    except Exception as exc:  # yaml.YAMLError, UnicodeDecodeError: SGLang stops on both
        facts["error"] = "%s is not YAML: %s" % (path, _error(exc)[:300])
        return facts
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        facts["error"] = "Config file must contain a dictionary at root level"
        return facts
    for key, value in list(loaded.items())[:MAX_CONFIG_ITEMS]:
        if not isinstance(key, str):
            facts["items"].append([str(key)[:200], "badkey", str(key)[:200]])
        elif isinstance(value, bool):
            facts["items"].append([key, "bool", value])
        elif isinstance(value, list):
            facts["items"].append([key, "list", [str(item) for item in value]])
        elif isinstance(value, dict):
            try:
                as_json = json.dumps(value)
            except (TypeError, ValueError) as exc:
                as_json = "\x00" + _error(exc)
            facts["items"].append([key, "dict", {"json": as_json, "str": str(value)}])
        else:
            facts["items"].append([key, "scalar", str(value)])
    if len(loaded) > MAX_CONFIG_ITEMS or len(json.dumps(facts["items"])) > MAX_CONFIG_JSON:
        facts["items"] = []
        facts["unreadable"] = "%s sets more than %d options or %d bytes of values" % (path, MAX_CONFIG_ITEMS,
                                                                                     MAX_CONFIG_JSON)
    return facts


def plugin_entry_points():
    """The entry points SGLang's load_plugins would find for this python (importlib.metadata, stdlib)."""
    facts = {"groups": list(PLUGIN_GROUPS), "found": [], "error": None}
    if package_metadata.no_entry_points(PLUGIN_GROUPS):  # no entry_points.txt names a group
        return facts
    try:
        import importlib.metadata as metadata
        everything = metadata.entry_points()
        for group in PLUGIN_GROUPS:
            if hasattr(everything, "select"):
                found = everything.select(group=group)
            else:  # Python 3.8, 3.9: a dict of group -> entry points
                found = everything.get(group, ())
            for entry in found:
                if len(facts["found"]) < MAX_PLUGINS:
                    facts["found"].append("%s: %s = %s" % (group, entry.name[:200], entry.value[:200]))
    except Exception as exc:
        facts["error"] = _error(exc)
    return facts


def sglang_facts(spec):
    import importlib.util

    facts = {"schema": SCHEMA, "mode": "sglang", "python": _python(), "found": False, "package_dir": None,
             "version": None, "version_error": None, "models_dir": None, "architectures": {}}
    try:
        found = importlib.util.find_spec("sglang")
    except (ImportError, ValueError) as exc:
        found, facts["version_error"] = None, _error(exc)
    if found is not None and found.submodule_search_locations:
        facts["found"] = True
        facts["package_dir"] = list(found.submodule_search_locations)[0]
    # importlib.metadata's answer, from a plain look at sys.path where that can tell (package_metadata.py)
    facts["version"], version_error = package_metadata.sglang_version()
    facts["version_error"] = version_error or facts["version_error"]
    if facts["package_dir"]:
        models = os.path.join(facts["package_dir"], "srt", "models")
        if os.path.isdir(models):
            facts["models_dir"] = models
            classes = scan_classes(models)
            archs = list(spec.get("architectures") or [])
            if "base_model" in spec:  # the base model's config.json, read here: one exec for both pythons
                config, _ = read_json(os.path.join(os.path.expanduser(spec["base_model"]), "config.json"))
                found_archs = (config or {}).get("architectures") if isinstance(config, dict) else None
                archs += [a for a in found_archs if isinstance(a, str)] if isinstance(found_archs, list) else []
            for arch in archs:
                facts["architectures"][str(arch)] = resolve_hook(classes, str(arch))
    facts["cli"] = sglang_options(facts["package_dir"]) if facts["package_dir"] else None
    if isinstance(spec.get("config"), str):
        facts["config"] = config_file(spec["config"])  # as SGLang opens it: no ~ expansion
    facts["plugins"] = plugin_entry_points()
    # the variables that add choices at parse time (its environment is the launch's, less the run's env file)
    names = set(o.get("conditional_env") for o in (facts["cli"] or {}).get("options") or () if o.get("conditional_env"))
    facts["condition_env"] = dict((n, os.environ[n][:200] if n in os.environ else None) for n in sorted(names)[:16])
    facts["imported_sglang"] = "sglang" in sys.modules
    return facts


#: how deploy/facts/doctor.py starts the program: its text travels as an argument (kept in
#: ``sys.deployctl_program``), so host mode can start the SGLang part with the same text
BOOT = "import sys; sys.deployctl_program = sys.argv.pop(1); exec(sys.deployctl_program)"


def main(argv, program=None):
    """``program``: the program's text when it was sent inline through BOOT, so host mode can run
    the SGLang part under sglang_python in the same exec channel."""
    if len(argv) != 2 or argv[0] not in ("host", "sglang"):
        sys.stderr.write("usage: doctor_facts.py host|sglang SPEC_JSON\n")
        return 2
    try:
        spec = json.loads(argv[1])
    except ValueError as exc:
        sys.stderr.write("doctor_facts.py: SPEC_JSON is not JSON: %s\n" % exc)
        return 2
    facts = host_and_run_facts(spec, program) if argv[0] == "host" else sglang_facts(spec)
    sys.stdout.write(json.dumps(facts, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], program=getattr(sys, "deployctl_program", None)))
