"""SIMULATED sglang.srt.server_args (deployctl sandbox TEST DOUBLE): the stand-in's command line.

Built the way SGLang 0.5.15+ builds it: ``ServerArgs`` is a dataclass whose ``Annotated[T, Arg(...)]``
fields become options through ``add_cli_args_from_dataclass`` (srt/arg_groups/arg_utils.py), and
``add_cli_args`` then adds a few options with literal ``parser.add_argument`` calls (0.5.23: the
dynamic choices and the deprecated flags). The doctor reads both from this file's source (it never
imports SGLang: a real import pulls in torch, deploy/remote/sglang_cli.py), and the stand-in's
launch_server parses its argv with this parser, so what the doctor accepts is what the launch
accepts. The names, aliases and choices are the real ones (0.5.23's where they differ), for the
subset the stand-in supports; an option of real SGLang that is missing here is refused at launch
like an unknown one, and a value outside its choices fails the launch (argparse exits 2), as
unforgiving as SGLang. Faithful: argparse's default ``allow_abbrev`` (a unique prefix is accepted),
and ``--cuda-graph-max-bs`` only up to 0.5.12 (the doctor sees the literal call whatever the
version: a real install has the source of its own version; this stand-in keeps one file for all).
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from typing import Literal, Optional

from sglang.srt.arg_groups.arg_utils import A, Arg, add_cli_args_from_dataclass
from sglang.srt.layers.quantization import QUANTIZATION_CHOICES

ALGORITHMS = ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM")
#: 0.5.23 srt/arg_groups/fields/model.py
KV_CACHE_DTYPE_CHOICES = ["auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"]


def _version_tuple(version: str) -> tuple[int, int, int]:
    nums = [int(x) for x in re.findall(r"\d+", version)[:3]]
    return tuple(nums + [0] * (3 - len(nums)))  # type: ignore[return-value]


@dataclasses.dataclass
class ServerArgs:
    model_path: A[str, Arg(help="The path of the model weights.", aliases=["--model"])]
    tokenizer_path: A[Optional[str], "The path of the tokenizer."] = None
    trust_remote_code: A[bool, "Whether or not to allow for custom models defined on the Hub."] = False
    dtype: A[Literal["auto", "half", "float16", "bfloat16", "float", "float32"], "Data type for model weights."] = "auto"
    kv_cache_dtype: A[str, Arg(help="Data type for kv cache storage.", choices=KV_CACHE_DTYPE_CHOICES)] = "auto"
    context_length: A[Optional[int], "The model's maximum context length."] = None
    served_model_name: A[Optional[str], "Override the model name returned by the v1/models endpoint."] = None
    # the API keys (srt/utils/auth.py decides), the weight-update session's admin level and the version /model_info reports (drafter swap, issue 29)
    api_key: A[Optional[str], "Set API key of the server. It is also used in the OpenAI API compatible server."] = None
    admin_api_key: A[Optional[str], "Set admin API key for administrative/control endpoints."] = None
    weight_version: A[str, "Version identifier for the model weights."] = "default"
    host: A[str, "The host of the HTTP server."] = "127.0.0.1"
    port: A[int, "The port of the HTTP server."] = 30000
    mem_fraction_static: A[Optional[float], "The fraction of the memory used for static allocation."] = None
    max_running_requests: A[Optional[int], "The maximum number of running requests."] = None
    chunked_prefill_size: A[Optional[int], "The maximum number of tokens in a chunk for the chunked prefill."] = None
    page_size: A[Optional[int], "The number of tokens in a page."] = None
    tp_size: A[int, Arg(help="The tensor parallelism size.", aliases=["--tensor-parallel-size", "--tp"])] = 1
    dp_size: A[int, Arg(help="The data parallelism size.", aliases=["--data-parallel-size"])] = 1
    pp_size: A[int, Arg(help="The pipeline parallelism size.", aliases=["--pipeline-parallel-size"])] = 1
    enable_dp_attention: A[bool, "Enabling data parallelism for attention and tensor parallelism for FFN."] = False
    base_gpu_id: A[int, "The base GPU ID to start allocating GPUs from."] = 0
    random_seed: A[Optional[int], "The random seed."] = None
    watchdog_timeout: A[float, "Set watchdog timeout in seconds."] = 300
    log_level: A[str, "The logging level of all loggers."] = "info"
    decode_log_interval: A[int, "The log interval of decode batch."] = 40
    enable_metrics: A[bool, "Enable log prometheus metrics."] = False
    attention_backend: A[Optional[str], "Choose the kernels for attention layers."] = None
    nnodes: A[int, "The number of nodes."] = 1
    node_rank: A[int, "The node rank."] = 0
    dist_init_addr: A[Optional[str], Arg(help="The host address for initializing distributed backend.",
                                         aliases=["--nccl-init-addr"])] = None
    speculative_algorithm: A[Optional[str], Arg(help="Speculative algorithm.", choices=ALGORITHMS)] = None
    speculative_draft_model_path: A[Optional[str], Arg(help="The path of the draft model weights.",
                                                       aliases=["--speculative-draft-model"])] = None
    speculative_num_steps: A[Optional[int], "The number of steps sampled from draft model."] = None
    speculative_eagle_topk: A[Optional[int], "The number of tokens sampled from the draft model in eagle2."] = None
    speculative_num_draft_tokens: A[Optional[int], "The number of tokens sampled from the draft model."] = None
    speculative_token_map: A[Optional[str], "The path of the draft model's small vocab table."] = None
    quantization: A[Optional[str], Arg(help="The quantization method.", choices=QUANTIZATION_CHOICES)] = None
    enable_hierarchical_cache: A[bool, Arg(help="Enable hierarchical cache.", aliases=["--enable-hicache"])] = False
    disable_overlap_schedule: A[bool, "Disable the overlap scheduler."] = False
    # set from the deprecated --disable-cuda-graph below (0.5.23: no_cli, the literal call is its only spelling)
    disable_cuda_graph: A[bool, Arg(no_cli=True)] = False
    cuda_graph_max_bs: A[Optional[int], Arg(no_cli=True)] = None
    speculative_draft_model_quantization: A[Optional[str], Arg(no_cli=True)] = None

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser, version: str = "0.5.11") -> None:
        add_cli_args_from_dataclass(parser, ServerArgs)
        parser.add_argument("--disable-cuda-graph", action="store_true",
                            help="Deprecated. Use --cuda-graph-backend-{decode,prefill}=disabled instead.")
        if _version_tuple(version) <= (0, 5, 12):
            parser.add_argument("--cuda-graph-max-bs", type=int, default=None)
        if _version_tuple(version) >= (0, 5, 7):  # absent from 0.5.6's server_args.py
            parser.add_argument("--speculative-draft-model-quantization", type=str, choices=QUANTIZATION_CHOICES,
                                default=None)
