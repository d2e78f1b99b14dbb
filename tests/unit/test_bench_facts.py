"""bench_serving result parsing beyond the case table (tests/facts/bench_serving/): GENERATED hostile
variants of a published result block."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from deploy.base.errors import RemoteOutputError
from deploy.facts.bench import OPTIONAL, REQUIRED, parse_bench_result

CASES = Path(__file__).resolve().parents[1] / "facts" / "bench_serving"
REAL = json.loads((CASES / "deepseek_v32_mtp_concurrency_1.json").read_text())["stdout"]
PADDED = json.loads((CASES / "kimi_k26_eagle3_padded_values.json").read_text())["stdout"]


def test_padded_and_unpadded_blocks_read_the_same_way():
    assert parse_bench_result(PADDED).accept_length == 4.6
    assert parse_bench_result(REAL.replace("2.46", "2.46      ")).accept_length == 2.46


def test_without_speculation_accept_length_is_absent():
    result = parse_bench_result(re.sub(r"Accept length:.*\n", "", REAL))
    assert result.accept_length is None and result.output_tok_s == 95.62


def _row(label: str) -> str:
    match = re.search(rf"^{re.escape(label)}:.*$", REAL, re.M)
    assert match, label
    return match.group(0)


@pytest.mark.parametrize("label", list(REQUIRED))
def test_each_required_row_missing_is_named(label):
    with pytest.raises(RemoteOutputError, match=re.escape(f"lacks {label}")):
        parse_bench_result(REAL.replace(_row(label) + "\n", ""), source="kimi-a")


READ_LABELS = [label for label in [*REQUIRED, *OPTIONAL] if re.search(rf"^{re.escape(label)}:", REAL, re.M)]
BAD_VALUES = ["n/a", "", "nan", "inf", "-inf", "-1", "1,234.5", "12 tok/s", "0x10", "1e309"]


@pytest.mark.parametrize("label", READ_LABELS)
@pytest.mark.parametrize("value", BAD_VALUES)
def test_each_read_row_with_a_bad_value_is_an_error_naming_it(label, value):
    row = _row(label)
    bad = row.split(":", 1)[0] + ":" + " " * 10 + value
    with pytest.raises(RemoteOutputError) as err:
        parse_bench_result(REAL.replace(row, bad), source="kimi-a")
    assert str(err.value).startswith("kimi-a: ")


@pytest.mark.parametrize("label", READ_LABELS)
def test_each_read_row_given_twice_is_an_error(label):
    row = _row(label)
    with pytest.raises(RemoteOutputError, match="twice"):
        parse_bench_result(REAL.replace(row, row + "\n" + row), source="kimi-a")


@pytest.mark.parametrize("label", ["Successful requests", "Total generated tokens"])
def test_counts_must_be_whole(label):
    row = _row(label)
    with pytest.raises(RemoteOutputError, match="whole number"):
        parse_bench_result(REAL.replace(row, row + ".5"), source="kimi-a")


@pytest.mark.parametrize("cut", range(REAL.index("====="), len(REAL) - 1, 97))
def test_block_cut_anywhere_is_an_error(cut):
    with pytest.raises(RemoteOutputError):
        parse_bench_result(REAL[:cut], source="kimi-a")


@pytest.mark.parametrize("noise", ["garbage line without colon", "Traceback (most recent call last):", "Error:"])
def test_a_non_row_inside_the_block_is_an_error(noise):
    with pytest.raises(RemoteOutputError, match="unexpected line"):
        parse_bench_result(REAL.replace(_row("Concurrency"), noise), source="kimi-a")


def test_rows_deployctl_does_not_read_are_allowed_but_must_be_rows():
    extra = REAL.replace(_row("Concurrency"), _row("Concurrency") + "\nSome future metric (x):      12.5")
    assert parse_bench_result(extra) == parse_bench_result(REAL)
