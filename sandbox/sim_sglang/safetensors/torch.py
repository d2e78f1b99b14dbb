"""SIMULATED ``safetensors.torch`` (deployctl sandbox TEST DOUBLE): ``load_file`` reads the file's
header and returns the stand-in torch's tensors (dtype, shape, the file); no tensor bytes are read."""

from __future__ import annotations

import json
import struct

import torch


def load_file(filename: str, device: str = "cpu") -> dict:
    with open(filename, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {name: torch.Tensor(entry["dtype"], entry["shape"], str(filename), torch.device(device))
            for name, entry in header.items() if name != "__metadata__"}
