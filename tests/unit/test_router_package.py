"""Which router package runs the fleet (smg or sglang-router), from the router host's metadata."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from deploy.config.models import Host, Run
from deploy.base.errors import DeployError, RemoteOutputError
from deploy.fleet.router import FLEET_OPS, parse_router_packages, router_url, url_host, worker_url
from deploy.fleet.router_package import (POLICIES, ROUTER_CMDLINE_MARKS, RouterPackage, choose_package,
                                         policy_problem)

VERSIONS = {"smg": [None, "1.13.0", "1.2.0"], "sglang-router": [None, "0.3.2", "0.2.4"]}


@pytest.mark.parametrize("smg,old,forced", list(itertools.product(VERSIONS["smg"], VERSIONS["sglang-router"],
                                                                  ["auto", "smg", "sglang-router"])))
def test_choose_package_prefers_smg_and_honours_router_package(smg, old, forced):
    installed = {"smg": smg, "sglang-router": old}
    if forced == "auto":
        expected = ("smg", smg) if smg else ("sglang-router", old) if old else None
    else:
        expected = (forced, installed[forced]) if installed[forced] else None
    if expected is None:
        with pytest.raises(DeployError) as info:
            choose_package(installed, forced, "r1 (/opt/py)")
        assert "r1 (/opt/py)" in str(info.value) and "pip install" in str(info.value)
    else:
        package = choose_package(installed, forced, "r1")
        assert (package.name, package.version) == expected


@pytest.mark.parametrize("name,version,module,api,settle,ready", [
    ("smg", "1.13.0", "smg.launch_router", True, 5.0, "/readiness"),
    ("sglang-router", "0.3.2", "sglang_router.launch_router", True, 0.0, "/health"),
    ("sglang-router", "0.2.4", "sglang_router.launch_router", False, 0.0, "/health"),
])
def test_package_properties(name, version, module, api, settle, ready):
    package = RouterPackage(name, version)
    assert (package.module, package.workers_api, package.drain_settle_s, package.readiness_path) == (
        module, api, settle, ready)


@pytest.mark.parametrize("version", ["dev", "x.y", "1", "latest", "v1.13"])
def test_a_version_that_is_no_release_is_unexpected_output(version):
    with pytest.raises(RemoteOutputError):
        choose_package({"sglang-router": version}, "auto", "r1")


@pytest.mark.parametrize("policy", sorted(set(POLICIES["smg"]) | set(POLICIES["sglang-router"])))
def test_policies_per_package(policy):
    for name, version in (("smg", "1.13.0"), ("sglang-router", "0.3.2")):
        problem = policy_problem(RouterPackage(name, version), policy)
        assert (problem is None) == (policy in POLICIES[name])
        if problem:
            assert policy in problem and name in problem


def test_fleet_ops_recognises_the_same_router_marks():
    # fleet_ops.py runs on hosts (stdlib only), so it keeps its own copy: the two must not drift
    from deploy.remote import fleet_ops

    assert tuple(fleet_ops.ROUTER_CMDLINE_MARKS) == ROUTER_CMDLINE_MARKS


def test_fleet_ops_router_packages_reads_metadata_of_this_interpreter():
    out = subprocess.run([sys.executable, str(FLEET_OPS), "router-packages"], capture_output=True, text=True,
                         timeout=60, check=True).stdout
    packages = parse_router_packages(out.strip(), "local")
    assert set(packages) == {"smg", "sglang-router"}


GOOD = {"packages": {"smg": "1.13.0", "sglang-router": None}, "python": "/usr/bin/python3", "error": None}
BAD_OUTPUTS = [
    "", "null", "[]", "{}", '{"packages": []}', '{"packages": null}', '{"packages": {"smg": 1.13}}',
    '{"packages": {"smg": ""}}', json.dumps({"packages": {"smg": "1" * 65}}), '{"packages": {"smg": ["1.13"]}}',
    "Traceback (most recent call last):", json.dumps(GOOD)[:-1], "\x1b]0;title\x07",
]


@pytest.mark.parametrize("output", BAD_OUTPUTS)
def test_parse_router_packages_refuses_any_other_shape(output):
    with pytest.raises(RemoteOutputError):
        parse_router_packages(output, "r1")


def test_parse_router_packages_accepts_the_helper_shape():
    assert parse_router_packages(json.dumps(GOOD), "r1") == {"smg": "1.13.0", "sglang-router": None}


@pytest.mark.parametrize("address,expected", [("10.0.0.1", "10.0.0.1"), ("gpu-a.example", "gpu-a.example"),
                                              ("fd00::1", "[fd00::1]"), ("::1", "[::1]"), ("[::1]", "[::1]")])
def test_url_host_brackets_ipv6(address, expected):
    assert url_host(address) == expected


def test_worker_and_router_urls_with_ipv6():
    run = Run.model_validate({"name": "r", "hosts": ["h"], "base_model": "/m", "drafter": "/d", "port": 30001,
                              "router": {"host": "h", "port": 30080, "bind": "::"}})
    host = Host(name="h", address="fd00::7")
    assert worker_url(run, host) == "http://[fd00::7]:30001"
    assert router_url(run.router, host) == "http://[::1]:30080"
