"""Every TCP port the router binds, and who holds each one on the router host (pure).

Both router packages bind more than ``--host:--port`` and exit at start when one is taken (read from
their ``launch_router --help``, smg 1.13.0 and sglang-router 0.3.2):

| flag | default | package |
|---|---|---|
| ``--prometheus-port`` on ``--prometheus-host`` | 29000 on 0.0.0.0 (smg: ``::`` for an IPv6 ``--host``) | both |
| ``--health-check-port`` (dedicated probe listener, on ``--host``) | off | smg |
| ``--mesh-port`` on ``--mesh-host``, only with ``--enable-mesh`` | 39527 on 0.0.0.0 | smg |

A default that ``router.extra_args`` overrides (argparse also takes an unambiguous abbreviation,
``--prometheus-po``, or ``--flag=value``) is read from there. The router host reports the listeners
on each port (``fleet_ops.py ports``); ``port_problems`` names the holder of a taken one.
"""

from __future__ import annotations

from dataclasses import dataclass

from deploy.config.models import Host, RouterSpec
from deploy.doctor.checks import binds_overlap
from deploy.host.sglang_argv import unseen_holder
from deploy.base.errors import ConfigError, RemoteOutputError
from deploy.fleet.router_package import SGLANG_ROUTER

PROMETHEUS_PORT = 29000
MESH_PORT = 39527
#: the options of the same family, for argparse's abbreviation rule (a prefix must name one option)
_FAMILY = ("--prometheus-port", "--prometheus-host", "--prometheus-duration-buckets", "--health-check-port",
           "--health-check-interval-secs", "--health-check-timeout-secs", "--health-check-endpoint",
           "--health-failure-threshold", "--health-success-threshold", "--mesh-port", "--mesh-host",
           "--mesh-advertise-host", "--mesh-peer-urls", "--mesh-server-name", "--mesh-tls-ca-cert",
           "--mesh-tls-cert", "--mesh-tls-key", "--enable-mesh")


@dataclass(frozen=True)
class RouterBind:
    what: str
    address: str
    port: int

    @property
    def label(self) -> str:
        shown = f"[{self.address}]" if ":" in self.address else self.address
        return f"{shown}:{self.port} ({self.what})"


def option_value(args: list[str], flag: str) -> str | None:
    """The value ``args`` give ``flag`` as argparse reads it (the last one wins), or None."""
    value = None
    for i, arg in enumerate(args):
        name, eq, inline = arg.partition("=")
        if not name.startswith("--") or len(name) < 3:
            continue
        if name != flag and not (flag.startswith(name) and [f for f in _FAMILY if f.startswith(name)] == [flag]):
            continue
        if eq:
            value = inline
        elif i + 1 < len(args):
            value = args[i + 1]
    return value


def _present(args: list[str], flag: str) -> bool:
    return any(a == flag or (flag.startswith(a) and len(a) > 8 and [f for f in _FAMILY if f.startswith(a)] == [flag])
               for a in args)


def _port(text: str | None, default: int, flag: str) -> int:
    if text is None:
        return default
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise ConfigError(f"router.extra_args: {flag} {text!r} is not a port (expected 1-65535)")
    return int(text)


def router_binds(spec: RouterSpec, host: Host, package: str | None) -> list[RouterBind]:
    """Every (address, port) the router will bind; ``package``: smg, sglang-router, or None when it
    is chosen on the router host at run time (then smg's options count where extra_args set them)."""
    args = list(spec.extra_args)
    main = spec.bind or host.address
    binds = [RouterBind("router.port", main, spec.port)]
    prometheus_default = "::" if (package != SGLANG_ROUTER and ":" in main) else "0.0.0.0"
    flag = option_value(args, "--prometheus-port")
    binds.append(RouterBind("--prometheus-port" + (" from extra_args" if flag else f", the default {PROMETHEUS_PORT}"),
                            option_value(args, "--prometheus-host") or prometheus_default,
                            _port(flag, PROMETHEUS_PORT, "--prometheus-port")))
    if package != SGLANG_ROUTER:
        health = option_value(args, "--health-check-port")
        if health is not None:
            binds.append(RouterBind("--health-check-port from extra_args (smg)", main,
                                    _port(health, 0, "--health-check-port")))
        if _present(args, "--enable-mesh"):
            mesh = option_value(args, "--mesh-port")
            binds.append(RouterBind("--mesh-port" + (" from extra_args" if mesh else f", the default {MESH_PORT}") +
                                    " (smg --enable-mesh)", option_value(args, "--mesh-host") or "0.0.0.0",
                                    _port(mesh, MESH_PORT, "--mesh-port")))
    return binds


def parse_ports(got: dict, binds: list[RouterBind], source: str) -> dict[int, list[dict]]:
    """fleet_ops.py ports -> port -> [{"address", "holders": [{"pid", "cmdline", "router"}]}], strictly."""
    entries = got.get("ports")
    wanted = sorted({b.port for b in binds})
    try:
        if not isinstance(entries, list) or sorted(int(e["port"]) for e in entries) != wanted:
            raise ValueError("ports")
        out: dict[int, list[dict]] = {}
        for entry in entries:
            out[int(entry["port"])] = [
                {"address": str(li["address"]),
                 "uid": None if li.get("uid") is None else int(li["uid"]),
                 "holders": [{"pid": int(h["pid"]), "cmdline": str(h.get("cmdline") or "")[:300],
                              "router": bool(h["router"])} for h in li["holders"]]}
                for li in entry["listeners"]]
        return out
    except (ValueError, KeyError, TypeError):
        raise RemoteOutputError(f"{source}: fleet_ops.py ports printed unexpected output: {str(got)[:300]!r}") from None


def port_problems(binds: list[RouterBind], listening: dict[int, list[dict]],
                  uid: int | None = None) -> tuple[list[str], list[str]]:
    """(what is fine, what is taken: each naming the holder) for every bind of the router."""
    fine, taken = [], []
    for bind in binds:
        clashing = [li for li in listening.get(bind.port, []) if binds_overlap(li["address"], bind.address)]
        foreign = []
        for li in clashing:
            if not li["holders"]:
                foreign.append(f"{li['address']}:{bind.port} by {unseen_holder(li.get('uid'), uid)}")
            foreign += [f"{li['address']}:{bind.port} by pid {h['pid']} ({h['cmdline'] or '?'})"
                        for h in li["holders"] if not h["router"]]
        if foreign:
            taken.append(f"{bind.label} is taken: {'; '.join(foreign)}")
        elif clashing:
            fine.append(f"{bind.label}: the router deployctl started listens there")
        else:
            fine.append(f"{bind.label} is free")
    return fine, taken
