"""Fleets: SGLang's router in front of replicas, rolling redeploys, multi-node servers, built on
run-level phases (phases.py). The CLI calls the functions below; they import lazily so that
``deployctl --help`` loads no SSH library."""

from __future__ import annotations

from typing import Any


def print_fleet_plan(*args: Any, **kw: Any):
    from deploy.fleet.plan import print_fleet_plan as impl

    return impl(*args, **kw)


def fleet_report(*args: Any, **kw: Any):
    from deploy.fleet.plan import fleet_report as impl

    return impl(*args, **kw)


def print_fleet_report(*args: Any, **kw: Any):
    from deploy.fleet.plan import print_fleet_report as impl

    return impl(*args, **kw)


