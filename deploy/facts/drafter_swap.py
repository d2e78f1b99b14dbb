"""The drafter swap's host reads: command builders and strict parsers for deploy/remote/drafter_swap.py.

``inspect``: both drafters' config, tensors (dtype, shape), bytes and vocabulary-map digests, and the
GPUs' memory; ``send``: the summary of one weight-update session. Anything but the documented
JSON line is a RemoteOutputError naming the host.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from deploy.base.errors import RemoteOutputError
from deploy.base.limits import parse_json
from deploy.base.shell import quote, quote_path

SENDER = "drafter_swap.py"


def cap(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + "..."


class _Fact(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class DrafterFacts(_Fact):
    config: dict[str, Any] | None = None
    #: name -> [dtype, shape]
    tensors: dict[str, list[Any]] = Field(default_factory=dict)
    bytes: int = Field(default=0, ge=0)
    d2t_sha256: str | None = None
    t2d_sha256: str | None = None
    error: str | None = None


class GpuMemory(_Fact):
    index: int = Field(ge=0)
    used_mib: int = Field(ge=0)
    total_mib: int = Field(ge=0)

    @property
    def free_mib(self) -> int:
        return max(0, self.total_mib - self.used_mib)


class SwapInspection(_Fact):
    running: DrafterFacts
    new: DrafterFacts
    gpus: list[GpuMemory] | None
    gpu_error: str | None


class SendSummary(_Fact):
    ok: bool
    stage: Literal["prepare", "server_info", "begin", "update", "end", "model_info", "done"]
    #: the tensor update was attempted: from here on the server may hold the new drafter
    sent: bool
    ended: bool
    http_status: int | None
    message: str
    weight_version: str | None
    tensors: int = Field(ge=0)
    seconds: float = Field(ge=0)
    #: /flush_cache after the update answered 200 (the scheduler was idle); False does not fail the swap
    flushed: bool
    #: seconds the begin, update and end calls took: each holds SGLang's model-update writer lock, which
    #: waits for every in-flight request and holds new ones back until it answers (0.5.21 - 0.5.23)
    held_s: float = Field(ge=0)
    held: dict[Literal["begin", "update", "end"], float]


def _python_prefix(env_file: str | None) -> str:
    # the sender sees what the server saw at launch (CUDA_VISIBLE_DEVICES and the like)
    return f"set -a && . {quote_path(env_file)} && set +a || exit 1; " if env_file else ""


def inspect_command(python: str, helper: str, running: str, new: str) -> str:
    return f"{quote_path(python)} {quote_path(helper)} inspect --running {quote_path(running)} --new {quote_path(new)}"


def send_command(python: str, helper: str, url: str, drafter: str, weight_version: str, tp: int,
                 base_gpu_id: int, state_dir: str, timeout_s: float, env_file: str | None) -> str:
    return (f"{_python_prefix(env_file)}{quote_path(python)} {quote_path(helper)} send --url {quote(url)} "
            f"--drafter {quote_path(drafter)} --weight-version {quote(weight_version)} --tp {int(tp)} "
            f"--base-gpu-id {int(base_gpu_id)} --state-dir {quote_path(state_dir)} --timeout {timeout_s:g}")


def _one_json(output: str, host: str, what: str) -> Any:
    lines = [line for line in output.splitlines() if line.strip()]
    if len(lines) != 1:
        raise RemoteOutputError(f"{host}: {what} printed {len(lines)} lines, expected one JSON line: "
                                f"{cap(output, 300)!r}")
    try:
        return parse_json(lines[0])  # 64 levels at most: a deep line is a RemoteOutputError, not a RecursionError
    except ValueError:
        raise RemoteOutputError(f"{host}: {what} printed {cap(lines[0], 300)!r}, expected JSON") from None


def parse_inspection(output: str, host: str) -> SwapInspection:
    try:
        return SwapInspection.model_validate(_one_json(output, host, "the drafter inspection"))
    except ValidationError as exc:
        raise RemoteOutputError(f"{host}: the drafter inspection is not as expected: {cap(str(exc), 400)}") from None


def parse_send(output: str, host: str) -> SendSummary:
    try:
        return SendSummary.model_validate(_one_json(output, host, "the drafter swap"))
    except ValidationError as exc:
        raise RemoteOutputError(f"{host}: the drafter swap's summary is not as expected: {cap(str(exc), 400)}") from None
