"""The canary: the first batch of a roll behind the router, judged on live traffic (issue 43).

Every gate before it judges a drafter on prompts deployctl chose; acceptance depends on what is
generated, so a drafter retrained on another data mix can pass verify and the benchmark gate and
still accept less on what users send. With ``rollout.canary`` (or ``restart --canary``) the roll is:

1. ``canary: last good of X`` (before anything changes): each canary host's last good record is
   read; a host without one is refused (exit 8, nothing changed): the canary could not go back.
2. the first batch is redeployed as any batch (out of the router, drained, the playbook: doctor,
   verify, the benchmark gate if the playbook has one, record-good; back into the router).
3. ``canary window``: for up to ``window`` seconds every replica's own figures are read at the same
   instants, every ``interval`` (one host-side loop on the router host, fleet_ops.py poll metrics),
   and deploy/local/canary_gate.decide judges the canary's intervals against the others' after each:
   - **promote**: the roll goes on with the next batches;
   - **roll back** (its live acceptance, or speed, is below the others' beyond the traffic's noise):
     each canary replica leaves the router and is drained (the others serve, never below N-1), its
     last good record (read in 1.) is written back, its last good deployment relaunched and verified
     (the session's own rollback, deploy/engine/session.py roll_back), the new drafter's fingerprint
     quarantined on it with the cause ("canary: live acceptance" or "canary: live speed"), and it is
     put back into the router; exit 12, the later batches are not touched;
   - **inconclusive** at the end of the window: ``rollout.canary.inconclusive`` says which way:
     ``keep`` (the default) goes back to the last good one as above but quarantines nothing (exit
     11); ``promote`` goes on;
   - a signal during the window (Ctrl-C, SIGTERM) rolls the canary back as for a rollback, without
     a quarantine, says so, then stops as the signal asks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from deploy.base.errors import DeployError, ExitCode, Regression
from deploy.config.models import CanarySpec, Host
from deploy.fleet.phases import RunPhase, rotation_of
from deploy.host.records import CanaryDecision, CanaryMark, CanaryWindow, IntervalFigures


class CanaryRefused(DeployError):
    """A canary host has no last good deployment to go back to: refused before anything changed (exit 8,
    like the fleet's pre-flight)."""
    exit_code = ExitCode.VERIFY


class CanaryRolledBack(Regression):
    """The canary's live figures were below the others': rolled back to its last good (exit 12)."""


class CanaryKept(DeployError):
    """The canary window could not tell (or a signal came): the canary went back to its last good (exit 11)."""
    exit_code = ExitCode.ROLLED_BACK


def names(hosts: Sequence[Host]) -> str:
    return ",".join(h.name for h in hosts)


def canary_phases(spec: CanarySpec, batch: tuple[Host, ...], playbook) -> tuple[RunPhase, RunPhase]:
    """(the phase before the canary's batch, the window after its router-add), each one builder."""
    return (RunPhase(f"canary: last good of {names(batch)}", _keep_last_good(batch)),
            RunPhase(f"canary window {names(batch)}: live figures against the other replicas' (at most "
                     f"{spec.window:g} s, every {spec.interval:g} s)", _window(spec, batch, playbook)))


# -- before: what the canary would go back to ------------------------------------------------------


def _keep_last_good(batch: tuple[Host, ...]):
    def body(ctx) -> str:
        from deploy.facts.server import parse_record, read_record_command
        from deploy.host.records import LastGood
        from deploy.host.state_layout import last_good_path
        from deploy.steps.base import Command

        def planned(host: Host) -> list[Command]:
            return [Command(description="read the last good deployment the canary would go back to (none: "
                                        "refused, exit 8, nothing changed)",
                            command=read_record_command(last_good_path(host.state_dir)))]

        def read(host: Host) -> LastGood | None:
            from deploy.ssh.transport import HostConnection

            path = last_good_path(host.state_dir)
            with HostConnection(host, ctx.config.ssh, ctx.state.jumps) as conn:
                return parse_record(conn.run(planned(host)[0].command, timeout=60).stdout, host.name, path)

        kept: dict[str, LastGood] = {}
        missing = []
        for host in batch:
            record = ctx.on_host(host, read, planned)
            if record is None:
                missing.append(host.name)
            else:
                kept[host.name] = record
        ctx.refuse(lambda: CanaryRefused(
            f"canary: no last good deployment is recorded on {', '.join(missing)}: the canary could not go back "
            "to one; nothing was changed (deploy it once without the canary)") if missing else None,
            "a canary host has no last good deployment recorded (exit 8, nothing changed)")
        ctx.memory.canary_last_good = kept
        return "the canary goes back to: " + "; ".join(f"{n} {r.drafter_path}" for n, r in kept.items())
    return body


# -- the window ----------------------------------------------------------------------------------


def _window(spec: CanarySpec, batch: tuple[Host, ...], playbook):
    def body(ctx) -> str:
        from deploy.facts.canary import interval, parse_instant
        from deploy.local.canary_gate import Decision, Settings, decide

        outcomes = {h.name: ctx.reports[h.name].outcome for h in batch if h.name in ctx.reports}
        if ctx.stops(len(outcomes) != len(batch) or any(o != "ok" for o in outcomes.values()),
                     "the canary batch did not deploy a new drafter (no window)"):
            ctx.memory.canary = CanaryWindow(hosts=[h.name for h in batch], outcome="not-run",
                                             why=f"the canary batch did not deploy a new drafter ({outcomes})")
            return f"no window: the canary batch did not deploy a new drafter ({', '.join(f'{k} {v}' for k, v in outcomes.items())})"
        router = ctx.router
        ours = {h.name for h in batch}
        canary_urls = [ctx.url(h) for h in batch]
        healthy = {w.url for w in router.workers() if w.is_healthy}
        others = [h for h in ctx.config.hosts_of(ctx.run) if h.name not in ours and ctx.url(h) in healthy]
        other_urls = [ctx.url(h) for h in others]
        settings = Settings(tolerance=spec.tolerance, alpha=spec.alpha, min_requests=spec.min_requests,
                            looks=max(1, int(spec.window // spec.interval)))
        intervals: list = []
        seen: dict[str, Any] = {"previous": None, "start": None, "decision": None}

        def observe(line: dict, arrived: float) -> bool:
            instant = parse_instant(line, canary_urls + other_urls, router.host.name)
            if seen["previous"] is None:
                seen["previous"], seen["start"] = instant, instant.at
                return False
            intervals.append(interval(seen["start"], seen["previous"], instant, canary_urls, other_urls))
            seen["previous"] = instant
            decision = decide(intervals, settings, final=len(intervals) >= settings.looks)
            if len(intervals) % 10 == 0 or decision.outcome != "watching":
                ctx.say("*", "canary", f"{len(intervals)}/{settings.looks} intervals: {decision.line()}")
            if len(intervals) % 10 == 0 and decision.outcome == "watching":
                _update_marks(ctx, batch, decision)
            if decision.outcome != "watching":
                seen["decision"] = decision
                return True
            return False

        started = time.monotonic()
        ctx.memory.canary = CanaryWindow(hosts=[h.name for h in batch], others=[h.name for h in others],
                                         outcome="watching", settings=CanarySpec.model_validate(spec.model_dump()))
        _mark(ctx, batch, [h.name for h in others], spec)
        try:
            if not other_urls:
                seen["decision"] = decide([], settings, final=True)
            else:
                router.watch_metrics(canary_urls + other_urls, spec.interval, spec.window, observe)
            for _ in ctx.only_when(False, "every 10 intervals while the window watches"):  # observe sends it
                _update_marks(ctx, batch, None)
        except KeyboardInterrupt:
            _record(ctx, None, intervals, started, "a signal during the window")
            ctx.say("*", "canary", "a signal during the window: the canary goes back to its last good drafter")
            _go_back(ctx, batch, playbook, "a signal came during the canary window", None)
            raise
        except DeployError as exc:
            # a read of another shape (strictly refused), the router host lost: nothing judged the new
            # drafter, so the canary does not stay on it
            first = str(exc).splitlines()[0][:300]
            _record(ctx, None, intervals, started, f"the window's reads failed: {first}", "failed")
            ctx.say("*", "canary", f"the window's reads failed ({first}): the canary goes back to its "
                                   "last good drafter")
            _go_back(ctx, batch, playbook, f"the window's reads failed: {first}", None)
            raise
        finally:
            _unmark(ctx, batch)
        decision: Decision | None = seen["decision"]
        if decision is None:  # the loop ended without a decision: cancelled
            decision = decide(intervals, settings, final=True)
        _record(ctx, decision, intervals, started, None)
        promoted = decision.outcome == "promote" or (decision.outcome == "inconclusive" and
                                                     spec.inconclusive == "promote")
        if ctx.stops(promoted, "the canary keeps up with the others (or is inconclusive with "
                               "rollout.canary.inconclusive: promote): promoted, the roll goes on"):
            how = "" if decision.outcome == "promote" else " (rollout.canary.inconclusive: promote)"
            ctx.memory.canary = ctx.memory.canary.but(action="promoted")
            return f"PROMOTED{how}: {decision.line()}"
        rolled_back = decision.outcome == "roll-back"
        ctx.memory.canary = ctx.memory.canary.but(
            action="rolled back, quarantined" if rolled_back else "kept the last good drafter")
        _go_back(ctx, batch, playbook, decision.line() if rolled_back else f"canary inconclusive: {decision.why}",
                 decision.cause if rolled_back else None)
        ctx.refuse(lambda: CanaryRolledBack(
            f"canary {names(batch)} rolled back to its last good drafter ({decision.cause}): {decision.line()}; "
            "the other replicas were not touched") if rolled_back else CanaryKept(
            f"canary {names(batch)} inconclusive at the end of its window ({decision.why}): back on its last good "
            "drafter (rollout.canary.inconclusive: keep); nothing quarantined; the other replicas were not touched"),
            "not promoted: rolled back and quarantined (exit 12), or inconclusive with keep (exit 11)")
        return "unreachable"
    return body


def _mark(ctx, batch: tuple[Host, ...], others: list[str], spec: CanarySpec) -> None:
    """canary.json on each canary host for the window, so that ``status`` marks the replica: the running
    server's PID (read from its PID file) and the window's end by this machine's clock (Unix time)."""
    from deploy.base.shell import quote_path
    from deploy.host.state_layout import StatePaths
    from deploy.steps.base import Command

    now = time.time()
    marks = ctx.memory.canary_marks

    def pid_read(host: Host) -> Command:
        return Command(description="the server's PID, for the canary mark",
                       command=f"head -c 64 -- {quote_path(StatePaths(host.state_dir).pidfile)} 2>/dev/null; true")

    def planned(host: Host) -> list[Command]:
        return [pid_read(host), mark_write(ctx.network(host))]

    def work(host: Host) -> None:
        with _connection(ctx, host) as conn:
            text = conn.run(pid_read(host).command, timeout=30).stdout.strip()
            if not text.isdigit():
                return  # no PID: no mark (status then shows no canary; the window goes on)
            marks[host.name] = CanaryMark(run=ctx.run.name, since=now, until=now + spec.window + 60,
                                          pid=int(text), others=others)
            _write_mark(conn, host, marks[host.name])

    for host in batch:
        ctx.on_host(host, work, planned)


def _connection(ctx, host: Host):
    from deploy.ssh.transport import HostConnection

    return HostConnection(host, ctx.config.ssh, ctx.state.jumps)


def mark_command(host: Host) -> str:
    """The mark's write: host_ops' replace_file of canary.json, the mark on stdin (records never go on a
    command line, issue 38)."""
    from deploy.base.shell import quote_path
    from deploy.facts.helpers import write_file_command
    from deploy.host.state_layout import StatePaths, canary_path

    return write_file_command(host.python, StatePaths(host.state_dir).helper("host_ops.py"),
                              quote_path(canary_path(host.state_dir)))


def mark_write(host: Host, figures: bool = False):
    from deploy.steps.base import Command

    return Command(description="the canary mark with the window's figures so far (its acceptance and speed "
                               "against the others')" if figures else
                               "the canary mark status reads (canary.json: the run, the server's PID, the "
                               "window's end, the others)",
                   command=mark_command(host), stdin_shown="the canary mark (JSON)")


def _write_mark(conn, host: Host, mark: CanaryMark) -> None:
    from deploy.facts.server import record_stdin

    conn.check(mark_command(host), timeout=30, what="writing the canary mark",
               stdin=record_stdin(mark.document(), host.name, "the canary mark"))


def _update_marks(ctx, batch: tuple[Host, ...], decision) -> None:
    """The mark with the window's figures so far (status and its prom file show them): every 10 intervals.
    A failed write is said and the window goes on (the mark is a record for status, not the decision)."""
    def work(host: Host) -> None:
        mark = ctx.memory.canary_marks.get(host.name)
        if mark is None:
            return
        ratios = {c.figure: c.ratio for c in decision.comparisons}
        mark = ctx.memory.canary_marks[host.name] = mark.but(
            acceptance_ratio=ratios.get("acceptance"), speed_ratio=ratios.get("speed"), intervals=decision.intervals,
            canary_requests=float(decision.canary_requests), outcome=decision.outcome)
        try:
            with _connection(ctx, host) as conn:
                _write_mark(conn, host, mark)
        except DeployError as exc:
            ctx.say(host.name, "canary", f"could not update the canary mark: {str(exc).splitlines()[0][:200]}")

    for host in batch:
        ctx.on_host(host, work, lambda h: [mark_write(ctx.network(h), figures=True)])


def _unmark(ctx, batch: tuple[Host, ...]) -> None:
    from deploy.host.state_layout import canary_path
    from deploy.base.shell import quote_path
    from deploy.steps.base import Command

    def planned(host: Host) -> list[Command]:
        return [Command(description="remove the canary mark", when="the window ended (decided, or a signal)",
                        command=f"rm -f -- {quote_path(canary_path(host.state_dir))}")]

    def work(host: Host) -> None:
        try:
            with _connection(ctx, host) as conn:
                conn.run(planned(host)[0].command, timeout=30)
        except DeployError as exc:  # the mark names the server and its window's end: a stale one is ignored
            ctx.say(host.name, "canary", f"could not remove the canary mark: {str(exc).splitlines()[0][:200]}")

    for host in batch:
        ctx.on_host(host, work, planned)


def _record(ctx, decision, intervals: list, started: float, signal: str | None,
            outcome: str = "interrupted") -> None:
    entry = ctx.memory.canary
    assert entry is not None
    figures = [IntervalFigures.model_validate(
        {"at": round(i.at, 3), "canary": {"accept": i.canary.accept, "requests": i.canary.requests,
                                          "token_s": i.canary.token_s},
         "others": {"accept": i.others.accept, "requests": i.others.requests, "token_s": i.others.token_s}})
        for i in intervals]
    entry = entry.but(seconds=round(time.monotonic() - started, 3), intervals=figures)
    if decision is not None:
        entry = entry.but(outcome=decision.outcome, decision=CanaryDecision.model_validate(decision.to_dict()),
                          line=decision.line())
    else:
        entry = entry.but(outcome=outcome, why=signal)
    ctx.memory.canary = entry
    # each canary host's history row and plain report line carry the decision in short
    decided = entry.decision
    ratios = {c.figure: c.ratio for c in decided.comparisons} if decided is not None else {}
    short = {"outcome": entry.outcome, "cause": decided.cause if decided else None,
             "acceptance_ratio": ratios.get("acceptance"), "speed_ratio": ratios.get("speed"),
             "intervals": len(intervals), "seconds": entry.seconds,
             "canary_requests": decided.canary_requests if decided else None,
             "others": entry.others or [], "why": (decided.why if decided else None) or signal}
    for name in entry.hosts:
        report = ctx.reports.get(name)
        if report is not None:
            report.facts["canary"] = short


BACK = "the canary goes back to its last good drafter (rolled back, inconclusive with keep, or a signal)"


def _go_back(ctx, batch: tuple[Host, ...], playbook, why: str, cause: str | None) -> None:
    """Each canary replica: out of the router and drained, its last good record written back, its last good
    deployment relaunched and verified, the new fingerprint quarantined (``cause``), back into the router."""
    router = ctx.router
    for _ in ctx.only_when(True, BACK):
        for host in batch:
            url = ctx.url(host)
            listed = [w for w in router.workers() if w.url == url]
            for w in listed:
                rotation_of(ctx, host).out = router.remove(w.url, settle=False)
            if listed:
                router.drain(url, ctx.run.router.drain_timeout_s)
            ctx.on_host(host, lambda h: _restore(ctx, h, playbook, why, cause),
                        lambda h: _restore_actions(ctx, h, playbook))
            report = ctx.reports.get(host.name)
            for _ in ctx.only_when(report is not None and report.outcome in ("rolled-back", "regression"),
                                   "it serves its last good one again"):
                router.settled()
                listed_now = {w.url for w in router.workers()}
                for _ in ctx.only_when(url not in listed_now, f"the router does not list {url}"):
                    router.add(url)
                rotation_of(ctx, host).back = time.monotonic()


def _restore_actions(ctx, host: Host, playbook) -> list[Any]:
    """What ``_restore`` sends to a canary host: its last good record written back, the session's
    rollback (engine.plan.plan_failure: the steps roll_back runs), the quarantine update."""
    import dataclasses

    from deploy.engine.plan import plan_failure
    from deploy.engine.session import step_context
    from deploy.facts.quarantine import update_command
    from deploy.host.records import LastGood, QuarantineEntry
    from deploy.steps import record_good
    from deploy.steps.base import Command

    net = ctx.network(host)
    step = step_context(net, ctx.run, record_good.Settings(step="record-good"), None, ctx.stamp, lambda *a: None)
    actions: list[Any] = [dataclasses.replace(
        record_good.write_action(step, LastGood(argv=[], env_file="<as recorded>"), None,
                                 shown="the last good record read before the canary's redeploy"),
        description="write back the last good record read before the canary's redeploy", when=None)]
    for name, planned in plan_failure(playbook, ctx.run, net):
        if name.startswith("rollback"):
            actions += [dataclasses.replace(a, when=None) for a in planned if hasattr(a, "when")]
    actions.append(Command(description="quarantine the new drafter's fingerprint on this host, with the cause "
                                       "(canary: live acceptance, or canary: live speed)",
                           when="the canary is rolled back (not when inconclusive or on a signal)",
                           command=update_command(host.python, host.state_dir, "add", "<the new fingerprint>",
                                                  QuarantineEntry(failed_at="<time>", reason="<cause>: <the decision>"),
                                                  script="<deploy/remote/quarantine.py>")))
    return actions


def _restore(ctx, host: Host, playbook, why: str, cause: str | None) -> None:
    from deploy.engine.session import roll_back, step_context
    from deploy.steps import record_good
    from deploy.steps.memory import StepMemory

    state = ctx.state
    report = ctx.reports[host.name]
    report.error = CanaryRolledBack(f"{cause}: {why}") if cause else CanaryKept(f"canary: {why}")
    new_fingerprint = report.facts.get("drafter_fingerprint")
    held = state.options.held_locks.get(host.name) if state.options.held_locks else None
    with _connection(ctx, host) as conn:
        step = step_context(host, ctx.run, record_good.Settings(step="record-good"), conn, ctx.stamp, state.progress)
        write = record_good.write_action(step, ctx.memory.canary_last_good[host.name], None)  # on stdin (issue 38)
        conn.check(write.command, timeout=60, what="restoring the last good record", stdin=write.stdin)
        memory = StepMemory(host_lock=held.held if held is not None else None)
        roll_back(report, playbook, ctx.run, conn, ctx.stamp, state.progress, memory, threading.Event())
        if cause and new_fingerprint and not memory.rollback_failed:
            _quarantine(ctx, conn, host, new_fingerprint, cause, why, report)


def _quarantine(ctx, conn, host: Host, fingerprint: str, cause: str, why: str, report) -> None:
    from datetime import datetime, timezone

    from deploy.facts.quarantine import parse_update, update_command
    from deploy.host.records import QuarantineEntry

    entry = QuarantineEntry(failed_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                            verb=ctx.state.options.command, run=ctx.run.name, exit_code=int(ExitCode.REGRESSION),
                            reason=f"{cause}: {why[:300]}", drafter_path=report.facts.get("drafter_path"))
    try:
        parse_update(conn.check(update_command(host.python, host.state_dir, "add", fingerprint, entry), timeout=30,
                                what="quarantine").stdout, host.name)
    except DeployError as exc:
        report.warnings.append(f"could not update the quarantine record: {exc}")
        return
    note = f"quarantined drafter fingerprint {fingerprint[:16]} on this host ({cause})"
    report.warnings.append(note)
    ctx.say(host.name, "quarantine", note)
