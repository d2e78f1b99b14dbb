"""The doctor's extra_args verdicts against the REAL parsers of SGLang 0.5.12, 0.5.15 and 0.5.23 (issue 40).

tests/facts/sglang_verdicts.json holds a generated corpus of extra_args argvs and what each real parser did
with it (tests/facts/capture_sglang_verdicts.py ran the wheels' own ``ServerArgs.add_cli_args`` parser and,
for ``--config``, their own ConfigArgumentMerger). The doctor reads the options from the captured sources
(tests/facts/sglang_options/) as it reads a host's, and must refuse every argv the real parser rejects and
none it accepts. An argv that sets an option deployctl reserves is refused by deployctl's own rule, whatever
SGLang says: those are checked apart.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import pytest

from deploy.config.models import reserved_option_for
from deploy.doctor.sglang_options import Context, Parsed, parse_extra_args
from deploy.facts.doctor import ConfigFileFacts, PluginFacts, SglangCliFacts
from deploy.remote import doctor_facts, sglang_cli

FACTS = Path(__file__).resolve().parents[1] / "facts"
VERSIONS = ("0.5.12", "0.5.15", "0.5.23")
CORPUS = json.loads((FACTS / "sglang_verdicts.json").read_text())["corpus"]
#: the capture ran with no SGLang plugin installed
NO_PLUGINS = PluginFacts(groups=list(doctor_facts.PLUGIN_GROUPS), found=[])
#: where the doctor still disagrees with a real parser, each with its reason (the report lists them)
KNOWN_GAPS = {
    # 0.5.23 adds token_oracle to the choices when SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE is set at parse time:
    # the doctor does not know the launch environment's value, so it warns instead of refusing
    ("0.5.23", ("--sampling-backend", "token_oracle")),
}


@functools.lru_cache(maxsize=None)
def options(version: str) -> tuple:
    return tuple(SglangCliFacts.model_validate(sglang_cli.read_options(str(FACTS / "sglang_options" / version /
                                                                            "sglang"))).options or ())


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory) -> dict:
    """version -> the doctor's Parsed per corpus case (index), computed once for the module's tests."""
    folder = tmp_path_factory.mktemp("configs")
    return {version: [judge(version, case, folder) for case in CORPUS] for version in VERSIONS}


def judge(version: str, case: dict, tmp_path: Path) -> Parsed:
    argv = list(case["argv"])
    if case.get("config") is not None:
        path = tmp_path / case["config"]["name"]
        path.write_text(case["config"]["text"])
        argv = [str(path) if a == "@CONFIG@" else a for a in argv]
    config = None
    if "--config" in argv and argv.index("--config") + 1 < len(argv):
        # the SGLang part's reading of the file (deploy/remote/doctor_facts.py), parsed as the doctor parses it
        config = ConfigFileFacts.model_validate(doctor_facts.config_file(argv[argv.index("--config") + 1]))
    return parse_extra_args(argv, list(options(version)), Context(plugins=NO_PLUGINS, config=config, version=version))


def reserved(case: dict) -> bool:
    return any(reserved_option_for(a.split("=", 1)[0]) for a in case["argv"]) or \
        any(reserved_option_for("--" + line.split(":")[0].strip()) for line in (case.get("config") or {}).get("text", "")
            .splitlines() if ":" in line)


def test_the_corpus_is_big_and_judged_by_every_version():
    assert len(CORPUS) >= 300
    for version in VERSIONS:
        judged = [c for c in CORPUS if c["verdicts"][version]["ok"] is not None]
        assert len(judged) >= 300
        assert sum(1 for c in judged if c["verdicts"][version]["ok"] is False) >= 100
        assert sum(1 for c in judged if c["verdicts"][version]["ok"] is True) >= 100


@pytest.mark.parametrize("version", VERSIONS)
def test_the_doctor_refuses_exactly_what_the_real_parser_refuses(version, verdicts):
    disagree, agree = [], 0
    for case, parsed in zip(CORPUS, verdicts[version]):
        real = case["verdicts"][version]
        if real["ok"] is None or reserved(case):
            continue
        if bool(parsed.problems) == (not real["ok"]):
            agree += 1
        elif (version, tuple(case["argv"])) not in KNOWN_GAPS:
            disagree.append((case["argv"], (case.get("config") or {}).get("text"), real, parsed.problems, parsed.doubts))
    assert not disagree, "\n".join(map(str, disagree[:20]))
    assert agree >= 300


@pytest.mark.parametrize("version", VERSIONS)
def test_every_refusal_names_the_option_and_the_value(version, verdicts):
    for case, parsed in zip(CORPUS, verdicts[version]):
        real = case["verdicts"][version]
        argv = case["argv"]
        if real["ok"] is not False or reserved(case) or case.get("config") or "--config" in argv or \
                (version, tuple(argv)) in KNOWN_GAPS:
            continue
        text = "\n".join(parsed.problems)
        option = argv[-1].split("=")[0] if argv[-1].startswith("--") else argv[-2].split("=")[0]
        assert option in text or argv[0].split("=")[0] in text, (argv, text)
        if not argv[-1].startswith("--") and "unrecognized option" not in text and "ambiguous" not in text:
            assert repr(argv[-1]) in text, (argv, text)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_reserved_option_is_refused_whatever_sglang_says(version, verdicts):
    cases = [(c, p) for c, p in zip(CORPUS, verdicts[version]) if reserved(c) and c["verdicts"][version]["ok"] is not None]
    assert cases
    for case, parsed in cases:
        assert parsed.problems, case["argv"]


@pytest.mark.parametrize("version", VERSIONS)
def test_known_gaps_are_warnings_not_silent_passes(version, tmp_path):
    for gap_version, argv in KNOWN_GAPS:
        if gap_version == version:
            parsed = judge(version, {"argv": list(argv)}, tmp_path)
            assert not parsed.problems and parsed.doubts, parsed
