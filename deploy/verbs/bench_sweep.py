"""``deployctl bench``'s draft-token sweep, and putting the configured deployment back afterwards.

A sweep (``--draft-tokens 16 --draft-tokens 10 --draft-tokens 5``) redeploys each value, verifies
and benchmarks it. Before this module the last value kept serving and became the host's last good
deployment (the rollback target); the next ``restart`` then said "argv changed" and went back.
Now:

- a round whose draft tokens are not the run's configured ones runs without ``record-good``: a
  sweep value never becomes the last good deployment;
- the sweep stops at the first round a host failed (the orchestrator has rolled that host back);
- at the end the configured deployment is restored: the same playbook without ``benchmark``
  (converge touches nothing when it already serves), verified and recorded as the last good one;
- what serves on each host when bench ends is said, also after a failure; after Ctrl-C nothing
  more is started (the user asked to stop), and the message says what was left and how to go back.

``run_round(playbook, run)`` runs one locked playbook on the run's hosts (``run_locked``) and
returns its host reports; this module never talks SSH itself, so it is tested with a fake one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from deploy.config.models import Run
from deploy.base.errors import DeployError, LockHeld

Progress = Callable[[str, str, str], None]
RunRound = Callable[[Any, Run], list]


@dataclass
class SweepResult:
    rounds: list[tuple[int, list]] = field(default_factory=list)
    #: the restore's host reports; None when the last round already served the configured value
    restore: list | None = None
    #: per host: {"host", "serves", "configured": True/False/None (unknown)}
    serving: list[dict[str, Any]] = field(default_factory=list)
    interrupted: bool = False
    #: a run-level error (a refused lock) that ended the sweep
    error: DeployError | None = None

    def reports(self) -> list:
        """Every host report, for the exit code: the rounds', then the restore's."""
        return [r for _, reports in self.rounds for r in reports] + list(self.restore or [])

    def to_dict(self) -> dict[str, Any]:
        return {"interrupted": self.interrupted, "serving": self.serving,
                "restore": None if self.restore is None else [r.to_dict() for r in self.restore],
                "error": str(self.error) if self.error is not None else None}


def has_step(playbook, name: str) -> bool:
    return any(s.name == name for s in playbook.steps)


def benchmark_load(playbook) -> dict[str, Any]:
    """The benchmark step's load (prompts, concurrency, lengths, rounds) as the sweep runs it: the
    report's header names it even when no round measured anything."""
    step = next((s for s in playbook.steps if s.name == "benchmark"), None)
    if step is None:
        return {}
    keys = ("num_prompts", "max_concurrency", "output_len", "input_len", "rounds", "dataset")
    return {key: getattr(step.settings, key, None) for key in keys}


def round_playbook(playbook, run: Run, configured: Run):
    """The playbook of one round: a sweep value is never recorded as the last good deployment."""
    if run.draft_tokens == configured.draft_tokens or not has_step(playbook, "record-good"):
        return playbook
    return playbook.with_settings("record-good", enabled=False)


def restore_playbook(playbook):
    """Back to the configured deployment: the bench playbook without its benchmark."""
    return playbook.with_settings("benchmark", enabled=False) if has_step(playbook, "benchmark") else playbook


def _serving(reports: Sequence, configured: Run) -> list[dict[str, Any]]:
    lines = []
    for report in reports:
        if report.ok:
            how = "unchanged (it already served it)" if report.facts.get("converged") else "relaunched and verified"
            lines.append({"host": report.host.name, "configured": True,
                          "serves": f"the configured deployment (draft tokens {configured.draft_tokens}), {how}; "
                                    "it is the last good deployment"})
        else:
            first = str(report.error).splitlines()[0][:200] if report.error is not None else "failed"
            lines.append({"host": report.host.name, "configured": None,
                          "serves": f"NOT known to be the configured deployment ({first}); left running: "
                                    f"{report.left_running or 'unknown'}"})
    return lines


def _interrupted(interrupt: KeyboardInterrupt, hosts: Sequence, stage: str, configured: Run) -> list[dict[str, Any]]:
    finished = {o.value.host.name: o.value for o in getattr(interrupt, "outcomes", []) if o.value is not None}
    lines = []
    for host in hosts:
        report = finished.get(host.name)
        left = report.left_running if report is not None and report.left_running else None
        lines.append({"host": host.name, "configured": None,
                      "serves": f"interrupted during {stage}: {left or 'unknown (not read after Ctrl-C)'}; not "
                                f"restored: `deployctl restart --run {configured.name}` serves the configured "
                                f"draft tokens ({configured.draft_tokens}) again"})
    return lines


def sweep(run_round: RunRound, playbook, configured: Run, runs: Sequence[Run], hosts: Sequence,
          progress: Progress) -> SweepResult:
    """Run every round, then restore the configured deployment; KeyboardInterrupt is re-raised
    with the result (what serves) in its ``sweep`` attribute."""
    result = SweepResult()
    stage = "the sweep"
    try:
        for run in runs:
            sweep_value = run.draft_tokens != configured.draft_tokens
            stage = f"draft tokens {run.draft_tokens}"
            progress("*", "bench", stage + (" (a sweep value: not recorded as the last good deployment)"
                                            if sweep_value else " (the configured value)"))
            reports = run_round(round_playbook(playbook, run, configured), run)
            result.rounds.append((run.draft_tokens, reports))
            failed = [r.host.name for r in reports if not r.ok]
            if failed and run is not runs[-1]:
                progress("*", "bench", f"stopping the sweep: {', '.join(failed)} failed at draft tokens "
                                       f"{run.draft_tokens}")
                break
        last_ok = bool(result.rounds) and all(r.ok for r in result.rounds[-1][1])
        if result.rounds and result.rounds[-1][0] == configured.draft_tokens and last_ok:
            result.serving = _serving(result.rounds[-1][1], configured)
        else:
            stage = "the restore of the configured deployment"
            progress("*", "bench", f"restoring the configured deployment (draft tokens {configured.draft_tokens})")
            result.restore = run_round(restore_playbook(playbook), configured)
            result.serving = _serving(result.restore, configured)
    except KeyboardInterrupt as interrupt:
        result.interrupted = True
        result.serving = _interrupted(interrupt, hosts, stage, configured)
        for line in result.serving:
            progress(line["host"], "bench", f"serves: {line['serves']}")
        interrupt.sweep = result  # type: ignore[attr-defined]
        raise
    except LockHeld as refused:
        result.error = refused
        result.serving = [{"host": h.name, "configured": None,
                           "serves": f"unknown: {stage} could not start ({str(refused).splitlines()[0][:200]})"}
                          for h in hosts]
    for line in result.serving:
        progress(line["host"], "bench", f"serves: {line['serves']}")
    return result
