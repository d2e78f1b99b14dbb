"""What many tests deploy: the hosts and runs the step and session tests share, and the fleet
config document the rollout, router and canary tests load (issue 37: these were written out again
in each file). Host and Run are frozen pydantic models: a test may share one, never change it.

A test whose assertions depend on an odd value of its own (a state dir with a space, a drafter path
with a quote, an env secret) keeps its own host or run next to those assertions.
"""

from __future__ import annotations

from deploy.config.models import Host, Run
from deploy.host.records import BenchMeasurement

#: a host on loopback that the test never connects to (serving, signal and cancel tests script it)
LOOPBACK_HOST = Host(name="h", address="127.0.0.1", state_dir="/var/lib/x")

#: a plain host and its run (``user`` set: the lock owner and stop-stale's scope name it)
PLAIN_HOST = Host(name="h", address="10.0.0.1", user="u", state_dir="/var/lib/deployctl")
PLAIN_RUN = Run(name="r", hosts=["h"], base_model="/m", drafter="/d")

#: a Kimi-K2.5 host under ``~`` with a state dir that needs quoting, and its run (paths with spaces)
KIMI_HOST = Host(name="kimi-a", address="10.1.230.174", gpus=2, state_dir="~/deployctl state")
KIMI_RUN = Run(name="r", hosts=["kimi-a"], base_model="/data/models/Kimi K2.5", drafter="/data/drafter")

#: the regression gates' host and run: figures only, short paths, the default 16 draft tokens
GATE_HOST = Host(name="kimi-a", address="10.1.230.174", gpus=2, state_dir="~/s")
GATE_RUN = Run(name="r", hosts=["kimi-a"], base_model="/m", drafter="/d", draft_tokens=16)


def fleet_config(run_lines: str = "", *, c_address: str = "10.0.0.3") -> str:
    """Three hosts a, b, c in group ``g`` and one run ``r``; ``run_lines`` (indented 4) complete the run
    (``"    group: g\\n    router: {host: a}\\n"``), and a test may append more of it after."""
    return ("hosts:\n"
            "  - {name: a, address: 10.0.0.1, groups: [g]}\n"
            "  - {name: b, address: 10.0.0.2, groups: [g]}\n"
            f"  - {{name: c, address: {c_address}, groups: [g]}}\n"
            "runs:\n"
            "  - name: r\n"
            "    base_model: /m\n"
            "    drafter: /d\n" + run_lines)


def measured(rounds: list, settings: dict, figure: object = None) -> BenchMeasurement:
    """The benchmark step's measurement of these rounds (the regression gates' tests); rounds the step never hands
    on (0, nan, "x": issue 38's defence in depth of the gate) are built without validation."""
    fields = {"successful_requests": 16, "duration_s": 20.0, "output_tokens": 4096,
              "output_tok_s": rounds[0] if figure is None else figure, "output_tok_s_rounds": rounds, "settings": settings}
    try:
        return BenchMeasurement.model_validate(fields)
    except ValueError:
        return BenchMeasurement.model_construct(**fields)


def default_signals() -> None:
    """Popen(preexec_fn=...) for a deployctl child a test sends SIGINT or SIGHUP: a runner started in
    the background by a non-interactive shell has SIGINT ignored, one started under ``nohup`` SIGHUP;
    the child inherits that and deployctl keeps an inherited SIG_IGN on purpose (deploy/base/signals.py,
    tested on its own), so the test would see no signal at all. The child starts as from a terminal."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
