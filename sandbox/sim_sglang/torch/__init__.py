"""SIMULATED torch (deployctl sandbox TEST DOUBLE): the few names the drafter swap's sender uses.

deploy/remote/drafter_swap.py ``sglang_payloads`` is the one payload path of the product; on a sandbox
host it runs against this package, ``safetensors.torch`` and the stand-in's
``sglang.srt.utils.MultiprocessingSerializer`` (all on the host's ``~/pylib``), as on a GPU host it
runs against the real ones.

Faithful: ``torch.device("cuda", i)``, ``Tensor.to(device)`` (a copy on that GPU), ``torch.cuda.synchronize``,
and a tensor pickles as a handle to memory the sender holds, not as its bytes (a CUDA tensor through
SGLang's ``monkey_patch_torch_reductions`` travels as a CUDA IPC handle).
Not faithful: there are no tensor bytes. A ``Tensor`` here is the safetensors header entry of one
tensor and the file it came from; the stand-in server reads what it needs (headers, SIMULATION
markers) from that file's directory, as a real server maps the sender's GPU memory by the IPC handle.
"""

from __future__ import annotations

from typing import Any


class device:  # noqa: N801 - torch's name
    def __init__(self, type: str, index: int | None = None) -> None:  # noqa: A002 - torch's signature
        if ":" in type and index is None:
            type, _, number = type.partition(":")
            index = int(number)
        self.type, self.index = type, index

    def __repr__(self) -> str:
        return f"device(type={self.type!r}, index={self.index!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, device) and (self.type, self.index) == (other.type, other.index)

    def __hash__(self) -> int:
        return hash((self.type, self.index))


class Tensor:
    """One tensor of a safetensors file: its dtype, shape and source, on a (simulated) device."""

    def __init__(self, dtype: str, shape: list[int], source: str, device: Any = None) -> None:
        self.dtype, self.shape, self.source = dtype, list(shape), source
        self.device = device if device is not None else globals()["device"]("cpu")

    def to(self, target: Any) -> "Tensor":
        where = target if isinstance(target, device) else device(str(target))
        return Tensor(self.dtype, self.shape, self.source, where)

    def __repr__(self) -> str:
        return f"tensor(dtype={self.dtype}, shape={self.shape}, device={self.device!r}) SIMULATED"


class cuda:  # noqa: N801 - torch's module name
    @staticmethod
    def synchronize(where: Any = None) -> None:
        """Nothing to wait for: the simulated copy has no bytes."""

    @staticmethod
    def is_available() -> bool:
        return True
