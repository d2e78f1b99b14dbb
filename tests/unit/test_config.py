"""Config validation: every mistake names the file, the line and the field."""

from pathlib import Path

import pytest

from deploy.config import load_config
from deploy.base.errors import ConfigError, ExitCode

REPO = Path(__file__).resolve().parents[2]

VALID = """\
hosts:
  - name: kimi-a
    address: 10.1.230.174
    groups: [kimi]
runs:
  - name: r1
    group: kimi
    base_model: /data/models/Kimi-K2.5
    drafter: /data/drafters/d
"""


def write(tmp_path, text):
    path = tmp_path / "deployctl.yaml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", sorted(p.name for p in (REPO / "configs").glob("*.yaml")))
def test_shipped_examples_are_valid(name):
    config = load_config(REPO / "configs" / name)
    assert config.hosts and config.runs


def test_defaults(tmp_path):
    config = load_config(write(tmp_path, VALID))
    host = config.hosts[0]
    assert (host.port, host.user, host.gpus, host.gpu_devices, host.python) == (22, "root", 8, "/dev/nvidia*", "python3")
    assert host.state_dir == "~/.deployctl"
    assert config.ssh.host_key_policy == "reject"
    run = config.run(None)
    assert (run.draft_tokens, run.eagle_topk, run.port, run.tp_size) == (16, 1, 30000, 8)
    assert run.timeouts.ready_s == 1800
    assert [h.name for h in config.hosts_of(run)] == ["kimi-a"]


def expect_error(tmp_path, text, *fragments):
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    message = str(err.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment in message, message
    assert err.value.exit_code == ExitCode.CONFIG
    return message


def test_unknown_key_is_an_error_with_its_line(tmp_path):
    text = VALID.replace("    drafter: /data/drafters/d\n", "    drafter: /data/drafters/d\n    draft_token: 16\n")
    expect_error(tmp_path, text, "deployctl.yaml:10", "runs[0] (r1).draft_token", "unknown key")


def test_wrong_type_names_field_and_line(tmp_path):
    text = VALID.replace("    address: 10.1.230.174\n", "    address: 10.1.230.174\n    gpus: eight\n")
    expect_error(tmp_path, text, "deployctl.yaml:4", "hosts[0] (kimi-a).gpus", "integer")


def test_state_dir_in_tmp_is_refused(tmp_path):
    text = VALID.replace("    groups: [kimi]\n", "    groups: [kimi]\n    state_dir: /tmp/deployctl\n")
    expect_error(tmp_path, text, "state_dir", "/tmp is wiped")


def test_relative_state_dir_is_refused(tmp_path):
    text = VALID.replace("    groups: [kimi]\n", "    groups: [kimi]\n    state_dir: deployctl\n")
    expect_error(tmp_path, text, "state_dir", "absolute path")


def test_unknown_host_in_run(tmp_path):
    text = VALID.replace("    group: kimi\n", "    hosts: [kimi-a, kimi-b]\n")
    expect_error(tmp_path, text, "deployctl.yaml:7", "runs[0] (r1).hosts[1]", "unknown host 'kimi-b'")


def test_unknown_group_in_run(tmp_path):
    expect_error(tmp_path, VALID.replace("group: kimi", "group: kimmi"), "no host is in group 'kimmi'")


def test_run_needs_exactly_one_target(tmp_path):
    text = VALID.replace("    group: kimi\n", "    group: kimi\n    hosts: [kimi-a]\n")
    expect_error(tmp_path, text, "exactly one of 'hosts'")


def test_duplicate_yaml_key_is_an_error(tmp_path):
    text = VALID.replace("    address: 10.1.230.174\n", "    address: 10.1.230.174\n    address: 10.0.0.1\n")
    expect_error(tmp_path, text, "duplicate key 'address'")


def test_duplicate_host_names(tmp_path):
    text = VALID.replace("runs:", "  - name: kimi-a\n    address: 10.0.0.2\nruns:")
    expect_error(tmp_path, text, "defined twice")


def test_reserved_sglang_flag_in_extra_args(tmp_path):
    text = VALID + "    extra_args: ['--port=30001']\n"
    expect_error(tmp_path, text, "--port is set by deployctl")


def _alias_prefix_cases():
    from deploy.config.models import SGLANG_OPTION_ALIASES

    for option, aliases in SGLANG_OPTION_ALIASES.items():
        for alias in aliases:
            for end in range(len("--") + 1, len(alias) + 1):
                prefix = alias[:end]
                yield option, prefix
                yield option, prefix + "=1"


def test_every_alias_and_prefix_of_a_reserved_option_is_named():
    """Every alias of every reserved option, every prefix of it (argparse's abbreviations), bare and
    with ``=value``: one pure call each, checked in one test that lists every miss (they were 390
    test cases of the same call)."""
    from deploy.config.models import reserved_option_for

    cases = list(_alias_prefix_cases())
    assert len(cases) > 300
    missed = [(option, arg, reserved_option_for(arg)) for option, arg in cases
              if option not in (reserved_option_for(arg) or "").split(" or ")]
    assert missed == []


@pytest.mark.parametrize("arg", ["--speculative-algo=EAGLE", "--speculative-algorithm", "--tensor-parallel-size=4",
                                 "--model=/other", "--tp", "--speculative-draft-model"])
def test_alias_or_prefix_in_extra_args_is_refused_at_load(tmp_path, arg):
    text = VALID + f"    extra_args: ['{arg}']\n"
    with pytest.raises(ConfigError) as info:
        load_config(write(tmp_path, text))
    assert info.value.exit_code == 3
    assert "set by deployctl" in str(info.value) and "extra_args" in str(info.value)


@pytest.mark.parametrize("arg", ["--mem-fraction-static", "0.85", "--disable-cuda-graph", "--tokenizer-path=/x",
                                 "--speculative-draft-model-revision", "--hostname-override", "--portal",
                                 "--model-loader-extra-config", "--tp-rank-offset", "-tp", "--"])
def test_unrelated_options_are_kept(arg):
    from deploy.config.models import reserved_option_for

    assert reserved_option_for(arg) is None


def test_not_yaml_and_not_a_mapping(tmp_path):
    expect_error(tmp_path, "hosts: [\n", "not valid YAML")
    expect_error(tmp_path, "- a\n- b\n", "expected a YAML mapping")


def test_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")


def test_hostile_address_is_refused(tmp_path):
    expect_error(tmp_path, VALID.replace("10.1.230.174", "'a; rm -rf /'"), "neither an IP address nor a host name")


def test_eagle_algorithm_with_eagle3_drafter_is_refused(tmp_path):
    expect_error(tmp_path, VALID + "    speculative_algorithm: EAGLE\n", "accept length is exactly 1.0", "use EAGLE3")


def test_topk_rules(tmp_path):
    expect_error(tmp_path, VALID + "    eagle_topk: 4\n", "needs speculative_num_steps")
    expect_error(tmp_path, VALID + "    speculative_num_steps: 5\n", "must be draft_tokens - 1 = 15")


def test_relative_gpu_glob_is_refused(tmp_path):
    expect_error(tmp_path, VALID.replace("    groups: [kimi]\n", "    groups: [kimi]\n    gpu_devices: dev/nvidia*\n"),
                 "absolute path glob")


@pytest.mark.parametrize("value", ["/dev/nvidia*", "/dev/nvidia0", "/dev/nvidiactl", "/dev/kfd", "/dev/dri/renderD*",
                                   "/dev/dri/card?", "/dev/accel/accel*", "/dev/hl*", "/dev/neuron*", "/dev/davinci*",
                                   "~/dev/nvidia*", "/home/dsb x/dev/nvidia*"])
def test_gpu_device_globs_of_real_accelerators_are_accepted(value):
    from deploy.config.models import Host

    assert Host(name="a", address="10.0.0.1", gpu_devices=value).gpu_devices == value
