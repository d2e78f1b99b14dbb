"""The doctor's plain look at sys.path (deploy/remote/package_metadata.py) against importlib.metadata
itself, under every host python here (3.8 to 3.13): on generated metadata trees (several path
entries, SGLang's metadata directory spelled many ways, twice, beside look-alikes; METADATA folded,
CRLF, without a Version, with two, empty, not UTF-8; entry points in and out of SGLang's plugin groups,
in odd section spellings), whatever the plain look answers is importlib.metadata's answer, and where
the trees are ordinary it does answer (so the doctor's SGLang part skips importing importlib.metadata).
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from deploy.remote import package_metadata
from tests.unit.test_sglang_verdicts import _pythons

REMOTE = Path(package_metadata.__file__).parent
GROUPS = ("sglang.srt.plugins", "sglang.srt.platforms")

#: metadata directory names: SGLang's canonical one, other spellings some version may read as SGLang's,
#: look-alikes that are not SGLang, and other packages
NAMES = ["sglang-0.5.23.dist-info", "sglang-0.5.21.dist-info", "SGLang-0.5.23.dist-info", "sglang.egg-info",
         "sglang-0.5.23-py3.11.egg-info", "sglang_-1.0.dist-info", "sg_lang-1.0.dist-info", "sglang-.dist-info",
         "sglang_router-0.3.2.dist-info", "sglang-router-0.3.2.dist-info", "sglangx-1.0.dist-info",
         "numpy-2.1.0.dist-info", "flashinfer_python-0.2.6.dist-info", "torch-2.9.0.dist-info", "sglang"]

OTHERS = ["sglang_router-0.3.2.dist-info", "sglang-router-0.3.2.dist-info", "sglangx-1.0.dist-info",
          "numpy-2.1.0.dist-info", "flashinfer_python-0.2.6.dist-info", "torch-2.9.0.dist-info", "sglang"]

METADATA = {
    "plain": "Metadata-Version: 2.4\nName: sglang\nVersion: 0.5.23\nSummary: SGLang\n\nA body.\nVersion: 9\n",
    "no-body": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.21\n",
    "no-body-no-newline": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.21",
    "folded-license": "Metadata-Version: 2.1\nName: sglang\nLicense: Apache\n        License 2.0\nVersion: 0.5.23\n\n",
    "folded-version": "Metadata-Version: 2.1\nName: sglang\nVersion: 0.5.23\n  .post1\n\n",
    "crlf": "Metadata-Version: 2.1\r\nName: sglang\r\nVersion: 0.5.23\r\n\r\nbody\r\n",
    "lowercase": "metadata-version: 2.1\nname: sglang\nversion: 0.5.22\n\n",
    "no-space": "Name: sglang\nVersion:0.5.23\n\n",
    "trailing-space": "Name: sglang\nVersion: 0.5.23  \n\n",
    "tab": "Name: sglang\nVersion:\t0.5.23\n\n",
    "two-versions": "Name: sglang\nVersion: 0.5.23\nVersion: 0.5.21\n\n",
    "no-version": "Metadata-Version: 2.1\nName: sglang\n\nVersion: 1.0\n",
    "empty": "",
    "leading-blank": "\nName: sglang\nVersion: 0.5.23\n",
    "not-a-header": "Name: sglang\nthis is not a header\nVersion: 0.5.23\n\n",
    "colon-first": ": odd\nVersion: 0.5.23\n\n",
    "from-line": "From someone\nVersion: 0.5.23\n\n",
    "space-in-name": "Name: sglang\nVersion : 0.5.23\n\n",
    "form-feed": "Name: sglang\x0c\nVersion: 0.5.23\n\n",
    "line-separator": "Name: sg\u2028lang\nVersion: 0.5.23\n\n",
    "non-ascii": "Name: sglang\nAuthor: J\u00f6rg\nVersion: 0.5.23\n\n",
    "unicode-version": "Name: sglang\nVersion: 0.5.\u0662\n\n",
}

ENTRY_POINTS = {
    "none": None,
    "scripts": "[console_scripts]\nsglang = sglang.cli:main\n",
    "plugin": "[sglang.srt.plugins]\nmine = my_plugin:register\n",
    "platform": "[sglang.srt.platforms]\nnpu = my_npu:platform\n",
    "double-brackets": "[[sglang.srt.plugins]]\nmine = my_plugin:register\n",
    "spaced-section": "[ sglang.srt.plugins ]\nmine = my_plugin:register\n",
    "mentioned": "[console_scripts]\n# not a sglang.srt.plugins entry\nx = y:z\n",
    "empty-group": "[sglang.srt.plugins]\n",
}

#: the child program: for each case, sys.path set to the case's entries (then the interpreter's own
#: library, which holds no metadata), the plain look's answers and importlib.metadata's
PROBE = r"""
import json, sys
library = list(sys.path)
sys.path.insert(0, sys.argv[1])
import package_metadata as plain
import importlib.metadata as metadata
import email, email.message, email.parser, zipfile, csv, pathlib  # what metadata imports on first use
sys.path.remove(sys.argv[1])
groups = tuple(json.loads(sys.argv[2]))
out = []
for entries in json.load(sys.stdin):
    sys.path[:] = entries + library
    try:
        truth = ["ok", metadata.version("sglang")]
    except Exception as exc:
        truth = ["error", type(exc).__name__]
    try:
        everything = metadata.entry_points()
        if hasattr(everything, "select"):
            eps = [e.value for g in groups for e in everything.select(group=g)]
        else:
            eps = [e.value for g in groups for e in everything.get(g, ())]
        eps_truth = ["ok", sorted(eps)]
    except Exception as exc:
        eps_truth = ["error", type(exc).__name__]
    out.append({"version": plain.plain_sglang_version(), "truth": truth,
                "no_entry_points": plain.no_entry_points(groups), "eps": eps_truth})
    sys.path[:] = library
json.dump(out, sys.stdout)
"""


def _write(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_bytes(text.encode("utf-8"))


def _case(root: Path, rng: random.Random, index: int) -> tuple[list[str], str]:
    """One generated sys.path: 1-3 directories of metadata, sometimes a missing one, a file, an .egg."""
    entries, labels = [], []
    for slot in range(rng.randint(1, 3)):
        kind = rng.choices(["dir", "missing", "file", "egg"], weights=[12, 2, 1, 1])[0] if slot else "dir"
        base = root / f"case{index}" / f"entry{slot}"
        if kind == "missing":
            entries.append(str(base / "nowhere"))
            labels.append("missing")
            continue
        if kind == "file":
            _write(base / "lib.zip", b"not a zip")
            entries.append(str(base / "lib.zip"))
            labels.append("file")
            continue
        folder = base / ("thing-1.0-py3.11.egg" if kind == "egg" else "site-packages")
        folder.mkdir(parents=True)
        # every other case is a pip-like tree: one canonical SGLang directory among other packages
        if index % 2:
            names = (["sglang-0.5.23.dist-info"] if slot == 0 else []) + rng.sample(OTHERS, rng.randint(0, 2))
        else:
            names = rng.sample(NAMES, rng.randint(0, 3))
        for name in names:
            meta = folder / name
            style = rng.choice(list(METADATA))
            if name == "sglang":  # the package itself, not metadata
                _write(meta / "__init__.py", "")
                continue
            if rng.random() < 0.1:
                _write(meta / "PKG-INFO", METADATA[style])
            elif rng.random() < 0.05:
                _write(meta / "METADATA", b"Name: sglang\nVersion: 0.5.\xff\n\n")
            else:
                _write(meta / "METADATA", METADATA[style])
            points = rng.choice(list(ENTRY_POINTS))
            if ENTRY_POINTS[points] is not None:
                _write(meta / "entry_points.txt", ENTRY_POINTS[points])
            labels.append(f"{name}:{style}:{points}")
        if kind == "egg":
            _write(folder / "EGG-INFO" / "entry_points.txt", ENTRY_POINTS["plugin"])
            labels.append("egg")
        entries.append(str(folder))
    return entries, " ".join(labels)


def _ordinary(root: Path) -> list[tuple[list[str], str]]:
    """Trees as a pip install leaves them: the plain look must answer these itself."""
    cases = []
    for index, (metadata, points) in enumerate([("plain", "scripts"), ("no-body", "none"),
                                                ("folded-license", "none"), ("non-ascii", "scripts"),
                                                ("trailing-space", "none")]):
        site = root / f"ordinary{index}" / "site-packages"
        _write(site / "sglang-0.5.23.dist-info" / "METADATA", METADATA[metadata])
        if ENTRY_POINTS[points] is not None:
            _write(site / "sglang-0.5.23.dist-info" / "entry_points.txt", ENTRY_POINTS[points])
        _write(site / "sglang_router-0.3.2.dist-info" / "METADATA", "Name: sglang-router\nVersion: 0.3.2\n\n")
        _write(site / "numpy-2.1.0.dist-info" / "METADATA", "Name: numpy\nVersion: 2.1.0\n\n")
        _write(site / "sglang" / "__init__.py", "")
        cases.append(([str(root / f"ordinary{index}" / "nowhere.zip"), str(site)], f"ordinary {metadata}"))
    return cases


@pytest.fixture(scope="module")
def answers(tmp_path_factory):
    root = tmp_path_factory.mktemp("metadata-trees")
    rng = random.Random(20261207)
    cases = _ordinary(root) + [_case(root, rng, index) for index in range(240)]
    pythons = _pythons()
    if not pythons:
        pytest.skip("no python3.8 to python3.13 here")
    found = {}
    for python in pythons:
        done = subprocess.run([python, "-I", "-S", "-c", PROBE, str(REMOTE), json.dumps(GROUPS)],
                              input=json.dumps([entries for entries, _ in cases]), capture_output=True, text=True,
                              timeout=120, cwd=root)
        assert done.returncode == 0, (python, done.stderr[-2000:])
        found[python] = json.loads(done.stdout)
    return cases, found


def test_every_answer_of_the_plain_look_is_importlib_metadatas(answers):
    cases, found = answers
    for python, results in found.items():
        for (entries, label), result in zip(cases, results):
            if result["version"] is not None:
                assert result["truth"] == ["ok", result["version"]], (python, label, entries, result)
            if result["no_entry_points"]:
                assert result["eps"] == ["ok", []], (python, label, entries, result)


def test_the_plain_look_answers_the_ordinary_trees_and_most_generated_ones(answers):
    cases, found = answers
    for python, results in found.items():
        for (_, label), result in zip(cases[:5], results[:5]):
            assert result["version"] == result["truth"][1] and result["no_entry_points"], (python, label, result)
        decided = sum(result["version"] is not None for result in results)
        no_points = sum(bool(result["no_entry_points"]) for result in results)
        undecided_truths = sum(result["version"] is None and result["truth"][0] == "ok" for result in results)
        # half the generated trees are pip-like, and most of those have a plain METADATA
        assert decided >= 30 and no_points >= 30 and undecided_truths >= 20, (python, decided, no_points,
                                                                               undecided_truths)


@pytest.mark.parametrize("text, value", [
    (METADATA["plain"], "0.5.23"), (METADATA["no-body"], "0.5.21"), (METADATA["no-body-no-newline"], "0.5.21"),
    (METADATA["lowercase"], "0.5.22"), (METADATA["trailing-space"], "0.5.23  "), (METADATA["tab"], "0.5.23"),
    (METADATA["folded-license"], "0.5.23"), (METADATA["non-ascii"], "0.5.23"),
])
def test_a_plain_header_block_gives_emails_value(text, value):
    import email

    assert package_metadata.header_value(text, "Version") == value == email.message_from_string(text)["Version"]


@pytest.mark.parametrize("style", ["folded-version", "crlf", "two-versions", "no-version", "leading-blank",
                                   "not-a-header", "colon-first", "from-line", "space-in-name", "form-feed",
                                   "line-separator"])
def test_anything_but_a_plain_header_block_is_left_to_importlib_metadata(style):
    with pytest.raises(package_metadata.Undecided):
        package_metadata.header_value(METADATA[style], "Version")


def test_a_finder_that_lists_distributions_leaves_the_answer_to_importlib_metadata(monkeypatch, tmp_path):
    site = tmp_path / "site-packages"
    _write(site / "sglang-0.5.23.dist-info" / "METADATA", METADATA["plain"])
    monkeypatch.setattr("sys.path", [str(site)])
    assert package_metadata.plain_sglang_version() == "0.5.23" and package_metadata.no_entry_points(GROUPS)

    class Finder:
        @staticmethod
        def find_distributions(context=None):
            return iter(())

    monkeypatch.setattr("sys.meta_path", [Finder] + list(os.sys.meta_path))
    assert package_metadata.plain_sglang_version() is None and package_metadata.no_entry_points(GROUPS) is None


@pytest.mark.parametrize("planted", ["METADATA", "entry_points.txt"])
def test_a_fifo_planted_as_metadata_never_blocks_the_plain_look(tmp_path, planted):
    """The plain look reads through state_files.read_regular (non-blocking, regular files only): a FIFO
    leaves the answer to importlib.metadata instead of holding the doctor (a subprocess, so a hang fails)."""
    site = tmp_path / "site-packages"
    info = site / "sglang-0.5.23.dist-info"
    _write(info / "METADATA", METADATA["plain"])
    (info / planted).unlink(missing_ok=True)
    os.mkfifo(info / planted)
    probe = ("import json, sys; sys.path[:] = [sys.argv[2], sys.argv[3]] + sys.path; import package_metadata as p; "
             "print(json.dumps([p.plain_sglang_version(), p.no_entry_points(('sglang.srt.plugins',))]))")
    done = subprocess.run([sys.executable, "-I", "-S", "-c", probe, "-", str(REMOTE), str(site)],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    version, no_plugins = json.loads(done.stdout)
    expected = [None, True] if planted == "METADATA" else ["0.5.23", None]  # each look reads one of the two
    assert [version, no_plugins] == expected, (version, no_plugins)
