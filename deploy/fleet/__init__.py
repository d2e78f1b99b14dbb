"""Fleets: SGLang's router in front of replicas, rolling redeploys, multi-node servers, built on
run-level phases (phases.py). The CLI calls the functions below; they import lazily so that
``deployctl --help`` loads no SSH library."""

from __future__ import annotations

from typing import Any


def plan_fleet(*args: Any, **kw: Any):
    from deploy.fleet.plan import plan_fleet as impl

    return impl(*args, **kw)


def plan_nodes(*args: Any, **kw: Any):
    from deploy.fleet.nodes import plan_nodes as impl

    return impl(*args, **kw)


def print_fleet_plan(*args: Any, **kw: Any):
    from deploy.fleet.plan import print_fleet_plan as impl

    return impl(*args, **kw)


def fleet_report(*args: Any, **kw: Any):
    from deploy.fleet.plan import fleet_report as impl

    return impl(*args, **kw)


def print_fleet_report(*args: Any, **kw: Any):
    from deploy.fleet.plan import print_fleet_report as impl

    return impl(*args, **kw)


def stop_router(*args: Any, **kw: Any):
    from deploy.fleet.rolling import stop_router as impl

    return impl(*args, **kw)


def remove_from_router(*args: Any, **kw: Any):
    from deploy.fleet.rolling import remove_from_router as impl

    return impl(*args, **kw)


def rolling_runner(config, playbook, run, hosts, progress, serial, allow_downtime):
    """run_locked's runner for a run with a router or --serial."""
    from deploy.fleet.rolling import run_fleet

    return lambda options: run_fleet(config, playbook, run, hosts, progress, options, serial, allow_downtime)


def nodes_runner(config, playbook, run, hosts, progress):
    """run_locked's runner for a multi-node server."""
    from deploy.fleet.nodes import run_nodes

    return lambda options: run_nodes(config, playbook, run, hosts, progress, options)
