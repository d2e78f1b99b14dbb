"""A host whose drafter store (``<state_dir>/drafters``) would overlap a run's drafter or base model is
refused at config load (exit 3), naming host, run, field and both paths (issue 17: ``state_dir: ~/data``
with the drafters in ``~/data/drafters/`` lost a user's checkpoints on the first ``up``)."""

from __future__ import annotations

import pytest

from deploy.config import load_config
from deploy.base.errors import ConfigError, ExitCode


def config_text(state_dir: str, drafter: str, base_model: str = "/models/kimi", user: str = "ubuntu",
                target: str = "hosts: [gpu-a]") -> str:
    return f"""hosts:
  - name: gpu-a
    address: 127.0.0.1
    user: {user}
    state_dir: "{state_dir}"
    groups: [fleet]
  - name: gpu-b
    address: 127.0.0.2
runs:
  - name: kimi
    {target}
    base_model: "{base_model}"
    drafter: "{drafter}"
"""


# (id, state_dir, drafter, base_model, user, field refused, relation)
REFUSED = [
    ("issue-17-data", "~/data", "~/data/drafters/kimi-1ep", "/models/kimi", "ubuntu", "drafter", "contains"),
    ("store-is-drafter", "~/data", "~/data/drafters", "/models/kimi", "ubuntu", "drafter", "is"),
    ("store-is-drafter-trailing-slash", "~/data", "~/data/drafters/", "/models/kimi", "ubuntu", "drafter", "is"),
    ("store-inside-drafter", "~/ckpt/kimi", "~/ckpt", "/models/kimi", "ubuntu", "drafter", "lies inside"),
    ("absolute", "/srv/data", "/srv/data/drafters/x", "/models/kimi", "ubuntu", "drafter", "contains"),
    ("absolute-dotted", "/srv/data", "/srv/data/./drafters//x", "/models/kimi", "ubuntu", "drafter", "contains"),
    ("home-vs-absolute", "~/data", "/home/ubuntu/data/drafters/kimi-1ep", "/models/kimi", "ubuntu", "drafter",
     "contains"),
    ("root-home", "/root/data", "~/data/drafters/k", "/models/kimi", "root", "drafter", "contains"),
    ("base-model-in-store", "/srv/data", "/ckpt/d", "/srv/data/drafters/base", "ubuntu", "base_model", "contains"),
    ("store-inside-base-model", "/models/kimi/state", "/ckpt/d", "/models/kimi", "ubuntu", "base_model",
     "lies inside"),
    ("drafter-is-root", "~/data", "/", "/models/kimi", "ubuntu", "drafter", "lies inside"),
    ("base-model-is-home", "~/data", "/ckpt/d", "~", "ubuntu", "base_model", "lies inside"),
]

ALLOWED = [
    ("default", "~/.deployctl", "~/data/drafters/kimi-1ep", "/models/kimi", "ubuntu"),
    ("sibling-prefix", "~/data", "~/data/drafters-old/kimi", "/models/kimi", "ubuntu"),
    ("state-dir-beside", "~/data", "~/data/kimi-1ep", "/models/kimi", "ubuntu"),
    ("hf-model-id", "~/data", "/ckpt/d", "moonshotai/Kimi-K2", "ubuntu"),
    ("other-user-home", "~/data", "/home/alice/data/drafters/x", "/models/kimi", "ubuntu"),
]


def write(tmp_path, text):
    path = tmp_path / "deployctl.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("state_dir,drafter,base_model,user,field,relation", [c[1:] for c in REFUSED],
                         ids=[c[0] for c in REFUSED])
def test_a_store_overlapping_a_checkpoint_is_refused(tmp_path, state_dir, drafter, base_model, user, field,
                                                     relation):
    with pytest.raises(ConfigError) as caught:
        load_config(write(tmp_path, config_text(state_dir, drafter, base_model, user)))
    message = str(caught.value)
    assert caught.value.exit_code == ExitCode.CONFIG == 3
    assert f"runs[0] (kimi).{field}" in message and "host 'gpu-a'" in message and "run 'kimi'" in message
    assert state_dir + "/drafters" in message
    assert (drafter if field == "drafter" else base_model) in message
    if relation:
        assert f" {relation} " in message


@pytest.mark.parametrize("target", ["hosts: [gpu-b, gpu-a]", "group: fleet"])
def test_every_way_a_run_names_its_hosts_is_checked(tmp_path, target):
    with pytest.raises(ConfigError, match="gpu-a"):
        load_config(write(tmp_path, config_text("~/data", "~/data/drafters/k", target=target)))


@pytest.mark.parametrize("state_dir,drafter,base_model,user", [c[1:] for c in ALLOWED], ids=[c[0] for c in ALLOWED])
def test_disjoint_paths_load(tmp_path, state_dir, drafter, base_model, user):
    config = load_config(write(tmp_path, config_text(state_dir, drafter, base_model, user)))
    assert config.runs[0].drafter == drafter


def test_cli_exits_3_before_connecting(tmp_path):
    from deploy.cli.main import main

    path = write(tmp_path, config_text("~/data", "~/data/drafters/kimi-1ep"))
    assert main(["-c", str(path), "plan"]) == 3
