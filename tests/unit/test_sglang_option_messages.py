"""Issue 38: the doctor's extra_args messages name the option, and a non-regular file in SGLang's
source is named as such.

Before: ``--enable-metrics yes`` was refused as "'yes' is not an option (a value must follow its
option)", naming no option; a FIFO at ``srt/server_args.py`` was reported "not found" (and a FIFO at a
module it follows would have blocked the doctor's program on open). Generated from the real
versions' own options (tests/facts/sglang_options/) and over every kind of non-regular file at every
source file the reader follows.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest

from deploy.config.models import reserved_option_for
from deploy.doctor.before_stop import check_extra_args
from deploy.remote import sglang_cli
from tests.hostile.test_safe_writes import _char_device, _socket
from tests.unit.test_sglang_options import FACTS, VERSIONS, doctor, read

WORDS = ("yes", "true", "1", "on", "False", "0")


@pytest.mark.parametrize("word", WORDS)
@pytest.mark.parametrize("version", VERSIONS)
def test_a_value_after_a_switch_names_the_switch(version, word):
    """Every flag of the version (nargs 0), given a value as a separate word: the refusal names the
    flag and says it takes no value; the same flag bare still passes."""
    options = [o for o in read(version)["options"] if not any(reserved_option_for(n) for n in o["names"])]
    flags = [o for o in options if o["nargs"] == "0"]
    missed = []
    for o in flags:
        name = o["names"][-1]
        check = check_extra_args(doctor(version, ["--log-level", "info", name, word]))
        if check.status != "fail" or f"{name} {word}: {name} takes no value" not in check.reason \
                or "is not an option" in check.reason:
            missed.append((name, check.status, check.reason[:200]))
    assert not missed, missed[:5]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("args,fragment", [
    (["--mem-fraction-static", "0.85", "0.9"], "--mem-fraction-static 0.9: --mem-fraction-static takes one value; '0.9' is one more"),
    (["--context-length", "8192", "16384"], "--context-length 16384: --context-length takes one value"),
    (["--mem-frac", "0.8", "extra"], "--mem-frac extra: --mem-frac takes one value"),
    (["--enable-metrics", "--log-level", "debug", "verbose"], "--log-level verbose: --log-level takes one value"),
    (["0.85"], "'0.85' is not an option"),
    (["--mem-fraction-static=0.85", "0.9"], "'0.9' is not an option"),
])
def test_a_value_after_an_option_that_has_its_value_names_that_option(version, args, fragment):
    check = check_extra_args(doctor(version, args))
    assert check.status == "fail" and fragment in check.reason, check.reason


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("args", [["--enable-metrics"], ["--enable-metrics", "--log-level", "debug"],
                                  ["--lora-paths", "a", "b", "c"], ["--random-seed", "-1"]])
def test_what_sglang_accepts_still_passes(version, args):
    assert check_extra_args(doctor(version, args)).status == "pass"






def _fifo_link(path: Path) -> None:
    os.mkfifo(path.with_name(path.name + ".fifo"))
    path.symlink_to(path.name + ".fifo")


KINDS = {"fifo": (os.mkfifo, "a FIFO"), "directory": (os.mkdir, "a directory"), "socket": (_socket, "a socket"),
         "char-device": (_char_device, "a character device"), "link-to-fifo": (_fifo_link, "a FIFO")}
#: the source files the 0.5.23 reader follows, server_args.py first
FOLLOWED = ["srt/server_args.py", "srt/arg_groups/choices.py", "srt/arg_groups/fields/memory.py",
            "srt/arg_groups/fields/spec.py", "srt/arg_groups/argparse_actions.py"]


@pytest.mark.parametrize("where", FOLLOWED)
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_non_regular_source_file_is_named_as_such_quickly(tmp_path, kind, where):
    make, words = KINDS[kind]
    tree = tmp_path / "sglang"
    shutil.copytree(FACTS / "0.5.23" / "sglang", tree)
    target = tree / where
    target.unlink()
    make(target)
    started = time.monotonic()
    found = sglang_cli.read_options(str(tree))
    assert time.monotonic() - started < 5
    assert found["options"] is None
    assert f"{target}: not a regular file ({words})" in found["error"], found["error"]
    assert "not found" not in found["error"]
    check = check_extra_args(doctor("0.5.23", ["--mem-fraction-static", "0.85"], found))
    assert check.status == "warn" and "not a regular file" in check.reason


def test_a_missing_server_args_is_still_not_found(tmp_path):
    (tmp_path / "sglang" / "srt").mkdir(parents=True)
    found = sglang_cli.read_options(str(tmp_path / "sglang"))
    assert found["options"] is None and found["error"].endswith("server_args.py: not found")
