"""Pydantic models for hosts, runs and SSH settings.

Every model forbids unknown keys: a typo such as ``draft_token: 16`` must be an error, never a
silently ignored setting that deploys with the default.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, field_validator, model_validator

from deploy.base.limits import has_control_chars

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
Name = Annotated[str, Field(pattern=NAME_PATTERN)]
PositiveSeconds = Annotated[float, Field(gt=0, le=24 * 3600)]

_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)")


def _plain_text(value: str) -> str:
    # A newline in a path reached the host's shell as a second command line (a newline in
    # state_dir created odd directories before failing); no real path or name has one.
    if has_control_chars(value):
        raise ValueError(f"{value!r} contains a control character (newline, tab, NUL...); not allowed")
    return value


def _host_path(value: str) -> str:
    _plain_text(value)
    if value.startswith("-"):
        # host programs would read it as an option (the fixer did: exit 2, "bad usage")
        raise ValueError(f"{value!r} starts with '-'; a path must not look like a command-line option")
    return value


def is_address_or_hostname(value: str) -> bool:
    """An IPv4/IPv6 address or an RFC 1123 host name (letters, digits, '-', dot-separated labels)."""
    try:
        ipaddress.ip_address(value)
        return True
    except ValueError:
        pass
    name = value[:-1] if value.endswith(".") else value
    return 0 < len(name) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in name.split("."))


def _address(value: str) -> str:
    if not is_address_or_hostname(value):
        raise ValueError(
            f"{value!r} is neither an IP address nor a host name (RFC 1123: letters, digits and '-' "
            "in dot-separated labels)"
        )
    return value


#: PATH_MAX on Linux; a longer "path" is not one, and it would only make huge command lines
MAX_PATH = 4096
PlainText = Annotated[str, Field(max_length=MAX_PATH), AfterValidator(_plain_text)]
HostPath = Annotated[str, Field(min_length=1, max_length=MAX_PATH), AfterValidator(_host_path)]
Address = Annotated[str, Field(min_length=1, max_length=253), AfterValidator(_address)]


# Options deployctl builds itself from the run's fields, each with the aliases SGLang's
# server_args.py registers for it. SGLang parses with argparse's default allow_abbrev=True, so an
# unambiguous prefix (``--speculative-algo=EAGLE``) or an alias (``--tensor-parallel-size``) sets
# the same option; passed in extra_args it would silently override the run's own value, since
# argparse keeps whichever occurrence comes last.
SGLANG_OPTION_ALIASES: dict[str, tuple[str, ...]] = {
    "--model-path": ("--model-path", "--model"),
    "--speculative-algorithm": ("--speculative-algorithm",),
    "--speculative-draft-model-path": ("--speculative-draft-model-path", "--speculative-draft-model"),
    "--speculative-num-steps": ("--speculative-num-steps",),
    "--speculative-eagle-topk": ("--speculative-eagle-topk",),
    "--speculative-num-draft-tokens": ("--speculative-num-draft-tokens",),
    "--tp-size": ("--tp-size", "--tensor-parallel-size", "--tp"),
    "--host": ("--host",),
    "--port": ("--port",),
}
RESERVED_SGLANG_FLAGS = frozenset(a for names in SGLANG_OPTION_ALIASES.values() for a in names)


def reserved_option_for(arg: str) -> str | None:
    """The deployctl-set option ``arg`` would set when argparse reads it, or None.

    argparse accepts ``--opt=value`` and, with allow_abbrev, any prefix of a long option that
    matches one option only; a prefix of several is an "ambiguous option" error at launch, which
    we refuse here as well rather than find out after stopping the running server.
    """
    if not arg.startswith("--") or arg == "--":
        return None
    flag = arg.split("=", 1)[0]
    for option, aliases in SGLANG_OPTION_ALIASES.items():
        if flag in aliases:
            return option
    hits = sorted({option for option, aliases in SGLANG_OPTION_ALIASES.items()
                   if any(a.startswith(flag) for a in aliases)})
    return " or ".join(hits) if hits else None


def accepts_bool(annotation: Any) -> bool:
    """Whether a field's type admits a boolean (bool, Any, a bool Literal, or a union with one)."""
    if annotation is bool or annotation is Any:
        return True
    origin = get_origin(annotation)
    if origin is Annotated:
        return accepts_bool(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return any(accepts_bool(a) for a in get_args(annotation))
    if origin is Literal:
        return any(isinstance(a, bool) for a in get_args(annotation))
    return False


class NonDecimalNumber(str):
    """A YAML 1.1 number written otherwise than in decimal (``02222``, ``0x1f``, ``1_000``, ``37:02``).

    PyYAML's SafeLoader reads ``port: 02222`` as octal (port 1170) and ``37:02`` as base 60 (2222):
    a port or GPU count nobody wrote. The config loader keeps such a scalar as its text in this
    type; a number field refuses it (below), a text field gets the text as written.
    """

    @property
    def kind(self) -> str:
        text = self.lstrip("+-").lower()
        if text.startswith("0x"):
            return "hexadecimal"
        if text.startswith("0b"):
            return "binary"
        if ":" in text:
            return "base 60 (sexagesimal)"
        if "_" in text:
            return "a number with underscores"
        if text.startswith("0") and text[1:2].isdigit():
            return "octal"
        return "not plain decimal"


def accepts_number(annotation: Any) -> bool:
    """Whether a field's type is (or admits) an int or a float."""
    if annotation in (int, float):
        return True
    origin = get_origin(annotation)
    if origin is Annotated:
        return accepts_number(get_args(annotation)[0])
    if origin is Union or origin is types.UnionType or origin in (list, tuple, set, frozenset):
        return any(accepts_number(a) for a in get_args(annotation))
    return False


def _non_decimal_in(value: Any) -> NonDecimalNumber | None:
    if isinstance(value, NonDecimalNumber):
        return value
    if isinstance(value, (list, tuple)):
        return next((v for v in value if isinstance(v, NonDecimalNumber)), None)
    return None


_SHELL_EXPANSION = re.compile(r"\$(?:[A-Za-z_][A-Za-z0-9_]*|\{|\(|[0-9#?*@!$-])|`|(?:^|:)~")


def shell_expansion(value: str) -> str | None:
    """The first ``$NAME``, ``${``, ``$(``, backquote or ``~`` (at the start or after ``:``) in ``value``.

    A run's ``env`` is written into the launch's env file quoted (deploy/steps/launch.py): a shell
    never expands it, so ``PATH: /usr/local/cuda/bin:$PATH`` became a PATH in which the launch
    could not find its own commands, found only after the server was stopped (issue 31).
    """
    match = _SHELL_EXPANSION.search(value)
    return match.group(0) if match else None


class Strict(BaseModel):
    """Every model read from a user's YAML (config and playbook steps).

    YAML reads ``yes``/``no``/``on``/``off``/``true`` as booleans and pydantic's lax mode turns
    True into 1: ``gpus: yes`` would deploy on one GPU and ``port: on`` dial port 1. NaN and
    infinity (``.nan``, ``.inf``) pass every range check that compares with them; both are refused.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_boolean_for_other_types(cls, value: Any, info: Any) -> Any:
        if isinstance(value, bool) and info.field_name in cls.model_fields:
            if not accepts_bool(cls.model_fields[info.field_name].annotation):
                raise ValueError(f"expected a value of another type, got the boolean {str(value).lower()} "
                                 "(YAML reads yes/no/on/off/true/false as booleans)")
        odd = _non_decimal_in(value)
        if odd is not None and info.field_name in cls.model_fields:
            if accepts_number(cls.model_fields[info.field_name].annotation):
                raise ValueError(f"expected a decimal integer, got {str(odd)!r} ({odd.kind}: YAML 1.1 would read "
                                 "it as another number than the digits say); write the number in decimal")
        return value


class SSHSettings(Strict):
    #: OpenSSH client config to honour (Host aliases, HostName, User, Port, IdentityFile,
    #: ProxyJump...). Unset: ~/.ssh/config when it exists; ``none``: ignore ssh_config.
    #: Values set in this YAML win over ssh_config (see deploy/ssh/config.py).
    config_file: Annotated[str, Field(min_length=1, max_length=MAX_PATH), AfterValidator(_plain_text)] | None = None
    #: a relative path is relative to the config file's directory
    known_hosts: Annotated[str, Field(min_length=1, max_length=MAX_PATH), AfterValidator(_plain_text)] = "~/.ssh/known_hosts"
    #: ``reject``: unknown host keys are refused (OpenSSH StrictHostKeyChecking=yes).
    #: ``accept-new``: an unknown key is accepted and recorded; a changed key is still refused.
    host_key_policy: Literal["reject", "accept-new"] = "reject"
    connect_timeout_s: PositiveSeconds = 10
    command_timeout_s: PositiveSeconds = 120
    connect_retries: Annotated[int, Field(ge=0, le=10)] = 3
    max_parallel: Annotated[int, Field(ge=1, le=256)] = 8


#: what gpu_devices' file names may start with (free-gpus runs fuser -k on them): NVIDIA (/dev/nvidia*),
#: AMD (/dev/kfd, /dev/dri/renderD*, /dev/dri/card*), Intel Gaudi (/dev/accel/accel*, /dev/hl*),
#: AWS Neuron (/dev/neuron*), Huawei Ascend (/dev/davinci*)
GPU_DEVICE_NAMES = ("nvidia", "kfd", "renderD", "card", "accel", "hl", "neuron", "davinci")


class Host(Strict):
    name: Name
    #: an IP, a DNS name, or a Host alias of the user's ssh_config
    address: Address
    port: Annotated[int, Field(ge=1, le=65535)] = 22
    user: Annotated[str, Field(pattern=r"^[a-z_][a-z0-9_.-]{0,31}$")] = "root"
    #: a relative path is relative to the config file's directory
    identity_file: Annotated[str, Field(min_length=1, max_length=MAX_PATH), AfterValidator(_plain_text)] | None = None
    gpus: Annotated[int, Field(ge=1, le=64)] = 8
    gpu_devices: Annotated[str, Field(min_length=1, max_length=MAX_PATH), AfterValidator(_plain_text)] = "/dev/nvidia*"
    python: HostPath = "python3"
    #: Persistent directory for helpers, PID files and logs. ``~`` is resolved on the host.
    #: Never under /tmp: a host's /tmp is wiped by a reboot or VM crash (a hand-run deployment lost its fix
    #: script that way).
    state_dir: Annotated[str, Field(max_length=MAX_PATH), AfterValidator(_plain_text)] = "~/.deployctl"
    #: doctor fails when the state or logs directory has less free space than this
    min_free_mib: Annotated[int, Field(ge=0)] = 1024
    groups: list[Name] = Field(default_factory=list)

    @field_validator("gpu_devices")
    @classmethod
    def _gpu_devices_absolute(cls, value: str) -> str:
        if not (value.startswith("/") or value.startswith("~/")):
            raise ValueError("expected an absolute path glob such as /dev/nvidia*")
        if any(ch in value for ch in "[]{}"):
            raise ValueError("only '*' and '?' wildcards are supported, e.g. /dev/nvidia*")
        if ".." in value.split("/"):
            # fuser -k kills every process holding a matched file: /dev/../home/* is not a GPU
            raise ValueError("'..' is not allowed in gpu_devices (fuser -k kills whatever holds a match)")
        directory, _, last = value.rpartition("/")
        if any(ch in directory for ch in "*?"):
            raise ValueError("wildcards are allowed in the last path component only, e.g. /dev/nvidia* "
                             "(fuser -k kills every process holding a match)")
        if not last.startswith(GPU_DEVICE_NAMES):
            # /dev/* or /dev/tty* would match /dev/null and the terminals: fuser -k would kill sshd and every shell
            raise ValueError(f"the file name {last!r} must start with a GPU device name ({', '.join(GPU_DEVICE_NAMES)}), "
                             "e.g. /dev/nvidia*: fuser -k kills every process holding a match, and /dev/null or "
                             "/dev/tty* are held by nearly every process")
        return value

    @field_validator("state_dir")
    @classmethod
    def _state_dir_is_persistent(cls, value: str) -> str:
        if not (value.startswith("/") or value == "~" or value.startswith("~/")):
            raise ValueError("expected an absolute path or one under ~ (resolved on the host)")
        home = value.startswith("~")
        rest = value[1:] if home else value
        if ".." in rest.split("/"):
            # /var/../tmp/x is /tmp/x: '..' would walk around the /tmp guard below
            raise ValueError(f"{value!r}: '..' is not allowed in state_dir; write the directory itself")
        normalized = posixpath.normpath("/" + rest.lstrip("/"))
        if not home and (normalized in ("/tmp", "/var/tmp", "/dev/shm", "/run", "/var/run")
                         or normalized.startswith(("/tmp/", "/var/tmp/", "/dev/shm/", "/run/", "/var/run/"))):
            raise ValueError(
                "state_dir must survive a reboot: /tmp is wiped by a VM crash or restart "
                "(it lost the fix script in a real incident); use a directory under ~ or /var/lib"
            )
        if home:
            return "~" if normalized == "/" else "~" + normalized
        return normalized


class Timeouts(Strict):
    #: grace between SIGTERM and SIGKILL when stopping stale processes
    stop_grace_s: PositiveSeconds = 30
    #: nvidia-smi polling until every GPU is free
    gpus_free_s: PositiveSeconds = 120
    #: /health polling after launch: a 1T-parameter model loads for many minutes
    ready_s: PositiveSeconds = 1800
    fix_keys_s: PositiveSeconds = 600


#: launch_router options deployctl sets from the router's own fields (argparse allow_abbrev applies too)
ROUTER_OPTION_ALIASES: dict[str, tuple[str, ...]] = {
    "--host": ("--host",), "--port": ("--port",), "--policy": ("--policy",),
    "--worker-urls": ("--worker-urls",),
    "--worker-startup-timeout-secs": ("--worker-startup-timeout-secs",),
}


class RouterSpec(Strict):
    """SGLang's own router in front of the run's replicas: Shepherd Model Gateway (``smg``, its
    name since 2026) or ``sglang-router`` 0.3.x, whichever router.python has (smg when both)."""

    #: a host of the config (it may also be one of the replicas)
    host: Name
    #: the router's own port (sglang-router's default is 30000 too: on a replica host pick another)
    port: Annotated[int, Field(ge=1, le=65535)] = 30080
    #: address the router binds; null = the router host's own address
    bind: Address | None = None
    #: smg 1.13 has all of these; sglang-router 0.3.x only the first five (checked on the router
    #: host against the installed package before anything is stopped)
    policy: Literal["cache_aware", "round_robin", "random", "power_of_two", "manual", "least_load",
                    "consistent_hashing", "prefix_hash", "passthrough"] = "cache_aware"
    #: interpreter that has smg or sglang-router installed on the router host
    python: HostPath = "python3"
    #: which router package to run; auto = smg when installed, else sglang-router
    package: Literal["auto", "smg", "sglang-router"] = "auto"
    extra_args: list[PlainText] = Field(default_factory=list)
    #: the router's wait for its first workers, and each worker's wait after POST /workers
    startup_timeout_s: PositiveSeconds = 120
    #: a removed worker's in-flight requests must finish within this (SGLang's /v1/loads all zero)
    drain_timeout_s: PositiveSeconds = 300

    @field_validator("extra_args")
    @classmethod
    def _no_reserved_router_flags(cls, args: list[str]) -> list[str]:
        for arg in args:
            if not arg.startswith("--"):
                continue
            flag = arg.split("=", 1)[0]
            hits = sorted(o for o, aliases in ROUTER_OPTION_ALIASES.items() if any(a.startswith(flag) for a in aliases))
            if hits:
                raise ValueError(f"{flag} would set {' or '.join(hits)}, which deployctl sets from the router's "
                                 "own fields (host, port, bind, policy, the verified replicas)")
        return args


_DURATION = re.compile(r"^(?P<value>\d+(?:\.\d+)?)\s*(?P<unit>s|m|h)$")


def _duration_s(value: Any) -> Any:
    """``10m``, ``90s``, ``1h`` or a number of seconds; anything else is left for the type's own error
    (a YAML 1.1 non-decimal number, ``0x10``, for Strict's own message)."""
    if isinstance(value, str) and not isinstance(value, NonDecimalNumber):
        match = _DURATION.match(value.strip())
        if match is None:
            raise ValueError(f"expected a duration such as 90s, 10m or 1h (or seconds as a number), got {value!r}")
        return float(match["value"]) * {"s": 1, "m": 60, "h": 3600}[match["unit"]]
    return value


class CanarySpec(Strict):
    """The first batch of a roll behind a router serves live traffic beside the others for ``window``
    before the roll goes on (docs/fleets.md, the canary; deploy/local/canary_gate.py decides)."""

    #: the canary batch: this many replicas, the first of the run's hosts
    replicas: Annotated[int, Field(ge=1, le=4096)] = 1
    #: how long the canary serves live traffic at most ("10m", "90s" or seconds)
    window: Annotated[float, Field(gt=0, le=86400)] = 600
    #: every replica's figures are read at the same instants, this far apart
    interval: Annotated[float, Field(ge=0.5, le=300)] = 5
    #: the canary's finished requests before any decision
    min_requests: Annotated[int, Field(ge=1, le=10_000_000)] = 200
    #: a drop smaller than this is not worth a rollback (a canary within it is promoted)
    tolerance: Annotated[float, Field(gt=0, lt=0.5)] = 0.05
    #: the chance of a wrong call over one window on an unchanged drafter, at most
    alpha: Annotated[float, Field(gt=0, lt=0.5)] = 0.01
    #: too little traffic to tell by the end of the window: keep the last good drafter (the canary
    #: goes back to it, not quarantined) or promote the new one
    inconclusive: Literal["keep", "promote"] = "keep"

    @field_validator("window", "interval", mode="before")
    @classmethod
    def _durations(cls, value: Any) -> Any:
        return _duration_s(value)

    @model_validator(mode="after")
    def _interval_within_window(self) -> CanarySpec:
        if self.interval * 8 > self.window:
            raise ValueError(f"window ({self.window:g} s) must hold at least 8 intervals of {self.interval:g} s "
                             "(the decision needs 8 paired intervals)")
        if self.window / self.interval > 720:
            # the decision after each interval sorts every pair's Walsh average: n (n + 1) / 2 of them
            raise ValueError(f"window / interval is {self.window / self.interval:.0f}: at most 720 intervals "
                             "(a longer window needs a longer interval)")
        return self


class RolloutSpec(Strict):
    #: restart and nightly behind a router: the first batch is a canary judged on live traffic
    canary: CanarySpec | None = None


class Run(Strict):
    name: Name
    hosts: list[Name] = Field(default_factory=list)
    group: Name | None = None
    base_model: HostPath
    drafter: HostPath
    tp_size: Annotated[int, Field(ge=1, le=64)] = 8
    #: address SGLang binds; null = the host's own address
    serve_host: Address | None = None
    port: Annotated[int, Field(ge=1, le=65535)] = 30000
    draft_tokens: Annotated[int, Field(ge=2, le=64)] = 16
    eagle_topk: Annotated[int, Field(ge=1, le=16)] = 1
    #: only with eagle_topk > 1; with topk 1 it is always draft_tokens - 1 (see speculative_plan)
    speculative_num_steps: Annotated[int, Field(ge=1, le=63)] | None = None
    speculative_algorithm: str = "EAGLE3"
    #: interpreter that has SGLang installed (a venv's python, say); helpers use the host's python
    sglang_python: HostPath = "python3"
    #: verify the drafter for this SGLang loader generation; auto = ask the host's installed sglang
    sglang_generation: Literal["auto", "legacy", "modern"] = "auto"
    extra_args: list[PlainText] = Field(default_factory=list)
    env: dict[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")], Annotated[str, Field(pattern=r"^[^\x00]*$")]] = Field(
        default_factory=dict
    )
    timeouts: Timeouts = Field(default_factory=Timeouts)
    #: SGLang's router in front of the run's replicas (see docs/fleets.md)
    router: RouterSpec | None = None
    #: one SGLang server across these hosts (rank 0 first): --nnodes, --node-rank, --dist-init-addr
    nodes: list[Name] = Field(default_factory=list)
    #: rank 0's port for torch.distributed's rendezvous (fixed, so converge sees the same argv);
    #: null = port + 1
    dist_init_port: Annotated[int, Field(ge=1, le=65535)] | None = None
    #: a new drafter on a host serving this run: reload (stop, launch: the target loads again) or swap
    #: it into the running server (SGLang 0.5.21+ weight-update session; not yet seen on real GPUs,
    #: docs/drafter-swap.md); restart --swap-drafter / --reload override it per command
    drafter_update: Literal["reload", "swap"] = "reload"
    #: how restart and nightly roll behind the router: ``{canary: {...}}`` (docs/fleets.md)
    rollout: RolloutSpec | None = None

    @field_validator("env")
    @classmethod
    def _env_values_are_literal(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            found = shell_expansion(value)
            if found:
                raise ValueError(f"env.{name}: {value[:80]!r} has {found!r}, a shell expansion; the launch "
                                 "environment takes each value literally (written quoted into the env file, never "
                                 "expanded), so write the full value (e.g. PATH: /usr/local/cuda/bin:/usr/bin:/bin)")
        return env

    @model_validator(mode="after")
    def _one_target(self) -> Run:
        if sum(map(bool, (self.hosts, self.group, self.nodes))) != 1:
            raise ValueError("set exactly one of 'hosts' (a list of host names), 'group' or 'nodes' "
                             "(the hosts of one multi-node server)")
        if self.nodes and len(set(self.nodes)) != len(self.nodes):
            raise ValueError("'nodes' names a host twice")
        if self.nodes and self.router is not None:
            raise ValueError("'router' in front of a multi-node server ('nodes') is not supported yet")
        if self.rollout is not None and self.rollout.canary is not None and self.router is None:
            raise ValueError("'rollout.canary' needs a 'router': the canary serves live traffic through it beside "
                             "the replicas that keep the last good drafter")
        if self.nodes and len(self.nodes) < 2:
            raise ValueError("'nodes' needs at least 2 hosts (one host is 'hosts: [NAME]')")
        if self.eagle_topk > 1 and self.speculative_num_steps is None:
            raise ValueError("eagle_topk > 1 needs speculative_num_steps (SGLang cannot derive it)")
        if self.eagle_topk == 1 and self.speculative_num_steps not in (None, self.draft_tokens - 1):
            raise ValueError(
                "with eagle_topk 1 SGLang forces num_draft_tokens = num_steps + 1; "
                f"speculative_num_steps must be draft_tokens - 1 = {self.draft_tokens - 1} or unset"
            )
        return self

    def overridden(self, **updates: Any) -> Run:
        """This run with ``updates`` applied and validated again, cross-field rules included (a
        command-line override is held to the same rules as the YAML); raises ValidationError."""
        return Run.model_validate({**self.model_dump(), **updates})

    @field_validator("speculative_algorithm")
    @classmethod
    def _eagle3_only(cls, value: str) -> str:
        if value == "EAGLE":
            raise ValueError(
                "EAGLE with an EAGLE-3 drafter feeds it one hidden state instead of three: accept "
                "length is exactly 1.0 (sglang PR #21272); use EAGLE3"
            )
        if value != "EAGLE3":
            raise ValueError(f"expected EAGLE3 (deployctl deploys EAGLE-3 drafters), got {value!r}")
        return value

    @field_validator("extra_args")
    @classmethod
    def _no_reserved_flags(cls, args: list[str]) -> list[str]:
        for arg in args:
            option = reserved_option_for(arg)
            if option is not None:
                flag = arg.split("=", 1)[0]
                how = "is" if flag == option else f"would be read by SGLang's argparse as {option} (alias or prefix), which is"
                raise ValueError(
                    f"{flag} {how} set by deployctl from the run's own fields; remove it from extra_args "
                    "(set the run's field instead)"
                )
        return args


def _home_of(user: str) -> str:
    return "/root" if user == "root" else f"/home/{user}"


def _comparable(path: str, user: str) -> str | None:
    """``path`` as an absolute, normalised path for the overlap check (``~`` as the user's usual
    home), or None for what is not a host path (a Hugging Face model id, ``~other/...``)."""
    if path == "~" or path.startswith("~/"):
        path = _home_of(user) + path[1:]
    if not path.startswith("/"):
        return None
    return posixpath.normpath(path)


def _relation(store: str, path: str) -> str | None:
    if store == path:
        return "is"
    if path.startswith(store.rstrip("/") + "/"):
        return "contains"
    if store.startswith(path.rstrip("/") + "/"):
        return "lies inside"
    return None


def store_overlaps(index: int, run: Run, hosts: list[Host]) -> list[tuple[tuple[str | int, ...], str]]:
    """A host's drafter store (``<state_dir>/drafters``) that is, contains or lies inside the run's
    drafter or base model. The store prunes its entries: with ``state_dir: ~/data`` and the
    drafters in ``~/data/drafters/``, the first ``up`` deleted a user's other checkpoints. (The
    fixer checks the resolved paths on the host too; ``~`` is assumed to be /root or /home/USER
    here, where the host cannot be asked.)"""
    names = set(run.nodes or run.hosts)
    problems: list[tuple[tuple[str | int, ...], str]] = []
    for host in hosts:
        if not (host.name in names or (run.group and run.group in host.groups)):
            continue
        store_text = posixpath.join(host.state_dir, "drafters")
        store = _comparable(store_text, host.user)
        for field in ("drafter", "base_model"):
            value = getattr(run, field)
            path = _comparable(value, host.user)
            relation = _relation(store, path) if store and path else None
            if relation:
                problems.append(((("runs", index, field)),
                                 f"host {host.name!r}: its drafter store {store_text} (state_dir {host.state_dir}) "
                                 f"{relation} run {run.name!r}'s {field} {value}: the store deletes its old "
                                 "entries, so it must never hold a user's checkpoint; set the host's state_dir "
                                 "elsewhere (the default is ~/.deployctl)"))
    return problems


class Config(Strict):
    ssh: SSHSettings = Field(default_factory=SSHSettings)
    hosts: list[Host]
    runs: list[Run] = Field(default_factory=list)

    def reference_problems(self) -> list[tuple[tuple[str | int, ...], str]]:
        """Cross-references pydantic cannot see field by field: (location, message) pairs."""
        problems: list[tuple[tuple[str | int, ...], str]] = []
        seen: set[str] = set()
        for i, host in enumerate(self.hosts):
            if host.name in seen:
                problems.append((("hosts", i, "name"), f"host name {host.name!r} is defined twice"))
            seen.add(host.name)
        groups = {g for h in self.hosts for g in h.groups}
        run_names: set[str] = set()
        for i, run in enumerate(self.runs):
            if run.name in run_names:
                problems.append((("runs", i, "name"), f"run name {run.name!r} is defined twice"))
            run_names.add(run.name)
            for j, name in enumerate(run.nodes):
                if name not in seen:
                    problems.append(
                        (("runs", i, "nodes", j), f"unknown host {name!r}; expected one of {sorted(seen)}")
                    )
            for j, name in enumerate(run.hosts):
                if name not in seen:
                    problems.append(
                        (("runs", i, "hosts", j), f"unknown host {name!r}; expected one of {sorted(seen)}")
                    )
            if run.router is not None and run.router.host not in seen:
                problems.append((("runs", i, "router", "host"),
                                 f"unknown host {run.router.host!r}; expected one of {sorted(seen)}"))
            if run.group and run.group not in groups:
                problems.append(
                    (("runs", i, "group"), f"no host is in group {run.group!r}; known groups: {sorted(groups)}")
                )
            problems += store_overlaps(i, run, self.hosts)
        return problems

    def host(self, name: str) -> Host:
        for host in self.hosts:
            if host.name == name:
                return host
        raise KeyError(name)

    def run(self, name: str | None) -> Run:
        if name is None:
            if len(self.runs) == 1:
                return self.runs[0]
            raise KeyError(None)
        for run in self.runs:
            if run.name == name:
                return run
        raise KeyError(name)

    def hosts_of(self, run: Run) -> list[Host]:
        if run.group:
            return [h for h in self.hosts if run.group in h.groups]
        return [self.host(n) for n in (run.nodes or run.hosts)]

    def select_hosts(self, names: list[str] | None, group: str | None) -> list[Host]:
        hosts = self.hosts
        if group:
            hosts = [h for h in hosts if group in h.groups]
        if names:
            known = {h.name for h in hosts}
            hosts = [h for h in hosts if h.name in names]
            missing = [n for n in names if n not in known]
            if missing:
                raise KeyError(missing[0])
        return hosts
