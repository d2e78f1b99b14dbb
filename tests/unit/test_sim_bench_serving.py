"""The sandbox's stand-in bench_serving reads dataset files as SGLang 0.5.23's does, and refuses
what it refuses (a missing file, a sharegpt run without a file on an offline host)."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

SIM = Path(__file__).parents[2] / "sandbox" / "sim_sglang" / "sglang" / "bench_serving.py"


def sim():
    spec = importlib.util.spec_from_file_location("sim_bench_serving", SIM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def args(module, *argv: str):
    return module.build_parser().parse_args(list(argv))


def records(n: int) -> list[dict]:
    return [{"conversations": [{"from": "human", "value": f"prompt number {i} " + "word " * i},
                               {"from": "gpt", "value": "two words"}]} for i in range(n)]


def test_sharegpt_file_gives_its_own_prompts_with_the_fixed_output_length(tmp_path):
    module = sim()
    path = tmp_path / "d.json"
    path.write_text(json.dumps(records(10) + [{"conversations": [{"from": "human", "value": "one turn"}]}]))
    rows = module.sample_file_requests(args(module, "--dataset-name", "sharegpt", "--dataset-path", str(path),
                                            "--num-prompts", "20", "--sharegpt-output-len", "64"), random.Random(1))
    assert len(rows) == 10 and all(out == 64 for _, _, out in rows)  # the one-turn record is skipped
    assert {p for p, _, _ in rows} == {r["conversations"][0]["value"] for r in records(10)}
    # per-dataset numbers: the input tokens are the file's prompts' (words + BOS)
    assert sum(n for _, n, _ in rows) == sum(len(r["conversations"][0]["value"].split()) + 1 for r in records(10))


def test_custom_jsonl_skips_lines_that_are_not_json_like_sglang(tmp_path):
    module = sim()
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"conversations": [{"role": "user", "content": "hello there"},
                                                  {"role": "assistant", "content": "hi you"}]}) + "\n{broken\n")
    rows = module.sample_file_requests(args(module, "--dataset-name", "custom", "--dataset-path", str(path),
                                            "--num-prompts", "5"), random.Random(1))
    assert rows == [("hello there", 3, 2)]


@pytest.mark.parametrize("name", ["sharegpt", "custom"])
def test_a_missing_file_is_refused(tmp_path, name, capsys, monkeypatch):
    module = sim()
    # like the real tool: the server's /get_model_info first (it picks the tokenizer), then the dataset
    monkeypatch.setattr(module, "_request", lambda url, *a, **k: {} if url.endswith("/get_model_info") else 1 / 0)
    code = module.main(["--dataset-name", name, "--dataset-path", str(tmp_path / "nope.json"), "--port", "1"])
    assert code == 1 and ("FileNotFoundError" in capsys.readouterr().err)


def test_sharegpt_without_a_file_would_download_and_fails_offline(capsys):
    module = sim()
    assert module.main(["--dataset-name", "sharegpt", "--port", "1"]) == 1
    assert "huggingface.co" in capsys.readouterr().err


def test_output_len_under_four_is_refused_like_sglang(tmp_path):
    module = sim()
    path = tmp_path / "d.json"
    path.write_text(json.dumps(records(3)))
    with pytest.raises(ValueError, match="output_len too small"):
        module.sample_file_requests(args(module, "--dataset-name", "sharegpt", "--dataset-path", str(path),
                                         "--sharegpt-output-len", "3"), random.Random(1))
