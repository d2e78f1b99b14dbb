"""SIMULATED sglang.srt.server_args (deployctl sandbox TEST DOUBLE): the stand-in's command line.

Like the real module (SGLang 0.4-0.5), ``ServerArgs.add_cli_args(parser)`` declares every option of
``python -m sglang.launch_server`` with ``parser.add_argument("--name", ...)``: the doctor reads the
option strings from this file's text (it never imports SGLang: a real import pulls in torch), and
the stand-in's launch_server builds its parser here, so what the doctor accepts is exactly what the
launch accepts. The names are the real ones, for the subset the stand-in supports; an option of
real SGLang that is missing here is refused at launch like an unknown one (as unforgiving as SGLang
with a typo). Faithful: argparse's default ``allow_abbrev`` (a unique prefix is accepted), and
``--cuda-graph-max-bs`` only up to 0.5.12 (the doctor sees the literal whatever the version: a
real install has the source of its own version; this stand-in keeps one file for every version).
"""

from __future__ import annotations

import argparse
import re

from sglang.srt.layers.quantization import QUANTIZATION_CHOICES

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")


def _version_tuple(version: str) -> tuple[int, int, int]:
    nums = [int(x) for x in re.findall(r"\d+", version)[:3]]
    return tuple(nums + [0] * (3 - len(nums)))  # type: ignore[return-value]


class ServerArgs:
    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, version: str = "0.5.11") -> None:
        parser.add_argument("--model-path", "--model", type=str, required=True, help="The path of the model weights.")
        parser.add_argument("--tokenizer-path", type=str, default=None)
        parser.add_argument("--trust-remote-code", action="store_true")
        parser.add_argument("--dtype", type=str, default="auto")
        parser.add_argument("--kv-cache-dtype", type=str, default="auto")
        parser.add_argument("--context-length", type=int, default=None)
        parser.add_argument("--served-model-name", type=str, default=None)
        parser.add_argument("--admin-api-key", type=str, default=None)
        parser.add_argument("--weight-version", type=str, default="default")
        parser.add_argument("--host", type=str, default="127.0.0.1")
        parser.add_argument("--port", type=int, default=30000)
        parser.add_argument("--mem-fraction-static", type=float, default=None)
        parser.add_argument("--max-running-requests", type=int, default=None)
        parser.add_argument("--chunked-prefill-size", type=int, default=None)
        parser.add_argument("--page-size", type=int, default=None)
        parser.add_argument("--tensor-parallel-size", "--tp-size", "--tp", dest="tp_size", type=int, default=1)
        parser.add_argument("--data-parallel-size", "--dp-size", dest="dp_size", type=int, default=1)
        parser.add_argument("--pipeline-parallel-size", "--pp-size", dest="pp_size", type=int, default=1)
        parser.add_argument("--enable-dp-attention", action="store_true")
        parser.add_argument("--base-gpu-id", type=int, default=0)
        parser.add_argument("--random-seed", type=int, default=None)
        parser.add_argument("--watchdog-timeout", type=float, default=300)
        parser.add_argument("--log-level", type=str, default="info")
        parser.add_argument("--decode-log-interval", type=int, default=40)
        parser.add_argument("--enable-metrics", action="store_true")
        parser.add_argument("--attention-backend", type=str, default=None)
        parser.add_argument("--disable-cuda-graph", action="store_true")
        if _version_tuple(version) <= (0, 5, 12):
            parser.add_argument("--cuda-graph-max-bs", type=int, default=None)
        parser.add_argument("--nnodes", type=int, default=1)
        parser.add_argument("--node-rank", type=int, default=0)
        parser.add_argument("--dist-init-addr", type=str, default=None)
        parser.add_argument("--speculative-algorithm", type=str, choices=ALGORITHMS, default=None)
        parser.add_argument("--speculative-draft-model-path", "--speculative-draft-model",
                            dest="speculative_draft_model_path", type=str, default=None)
        parser.add_argument("--speculative-num-steps", type=int, default=None)
        parser.add_argument("--speculative-eagle-topk", type=int, default=None)
        parser.add_argument("--speculative-num-draft-tokens", type=int, default=None)
        parser.add_argument("--speculative-token-map", type=str, default=None)
        parser.add_argument("--quantization", type=str, choices=QUANTIZATION_CHOICES, default=None)
        if _version_tuple(version) >= (0, 5, 7):  # absent from 0.5.6's server_args.py
            parser.add_argument("--speculative-draft-model-quantization", type=str, choices=QUANTIZATION_CHOICES,
                                default=None)
        parser.add_argument("--enable-hierarchical-cache", action="store_true")
        parser.add_argument("--disable-overlap-schedule", action="store_true")
