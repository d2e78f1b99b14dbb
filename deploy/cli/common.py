"""What the verbs that plan or run a playbook share: the command line becomes one
``DeployRequest`` (deploy/verbs/deploy.py), one engine call answers it, and its result is rendered
here. No SSH, no resolution, no decision: those are the verbs' (deploy/verbs/)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:  # the engine stays unimported until a verb runs (a fast --help)
    from deploy.verbs.deploy import DeployRequest, DeployResult

IGNORE_DOCTOR_WARNING = ("--ignore-doctor: a failing doctor check will not stop this run; the running server may be "
                         "stopped for a deploy the doctor expects to fail")


def request_of(globals_, verb: str, playbook: str, **options: Any) -> DeployRequest:
    """The command line as one request value (``options``: the verb's parsed flags, by field name)."""
    from deploy.verbs.deploy import DeployRequest

    options["host_names"] = tuple(options.get("host_names") or ())
    return DeployRequest(verb=verb, config_path=globals_.config_path, playbook=playbook,  # type: ignore[arg-type]
                         **options)


def warn_ignore_doctor(ignore_doctor: bool) -> None:
    if ignore_doctor:
        click.echo(IGNORE_DOCTOR_WARNING, err=True)


def execute(globals_, request: DeployRequest, as_json: bool) -> int:
    """up, restart, down and plan: the one engine call, rendered; its exit status."""
    from deploy.render import report as render
    from deploy.verbs import deploy

    warn_ignore_doctor(request.ignore_doctor)
    progress = render.progress_printer()
    result = deploy.execute(request, globals_.load(), progress)
    return render_result(result, as_json, progress)


def render_result(result: DeployResult, as_json: bool, progress: Any = None) -> int:
    """A plan or a run as text or one JSON document; returns the result's exit code."""
    from deploy.render import report as render

    command, run_name = result.request.verb, result.run.name
    if result.plans is not None:
        if as_json:
            document = render.plan_document(command, run_name, result.plans, result.endpoints)
            if result.fleet_plan is not None:
                document["fleet"] = result.fleet_plan
            render.print_json(document)
        else:
            render.plan_text(command, result.plans, render.console(), result.endpoints)
            if result.fleet_plan is not None:
                from deploy.fleet.plan import print_fleet_plan

                print_fleet_plan(result.fleet_plan)
        return result.exit_code
    fleet, router = result.fleet, result.router
    if fleet is not None:
        write_canary_report(fleet, run_name, progress)
    if as_json:
        document = render.report_document(command, run_name, result.reports)
        if fleet is not None:
            from deploy.fleet.plan import fleet_report

            document["fleet"] = fleet_report(fleet)
        if router is not None:
            document["router"] = router
        render.print_json(document)
    else:
        render.step_summary_tables(command, result.reports, render.console())
        if fleet is not None:
            from deploy.fleet.plan import print_fleet_report

            print_fleet_report(fleet)
    return result.exit_code


def write_canary_report(result: Any, run_name: str, progress: Any = None) -> str | None:
    """A canary window ran: its HTML page (deploy/render/canary_report.py), its path kept in
    ``result.canary.report_html``; None when no window ran. A failure to write it is a warning on
    ``progress``: the page is a record, never a reason to fail the run."""
    canary = getattr(result, "canary", None)
    if canary is None or not canary.intervals and canary.outcome == "not-run":
        return None
    from deploy.local.state import LocalStateError
    from deploy.render import canary_report

    try:
        path = str(canary_report.write(canary, run_name))
    except (OSError, LocalStateError) as exc:
        if progress is not None:
            progress("*", "canary", f"WARNING: the canary report was not written: {exc}")
        return None
    result.canary = canary.but(report_html=path)
    if progress is not None:
        progress("*", "canary", f"report: {path}")
    return path
