"""SIMULATED ``sglang.srt.utils`` (deployctl sandbox TEST DOUBLE): ``MultiprocessingSerializer``.

As real SGLang 0.5.21 - 0.5.23 writes it (``srt/utils/common.py``): ``serialize`` is a
``ForkingPickler`` dump, base64 with ``output_str=True``; ``deserialize`` takes base64 text
(``b64decode(validate=True)``) or bytes and unpickles with a restricted unpickler. The stand-in's
unpickler allows builtins and the stand-in torch's ``Tensor``/``device`` only (SGLang's
``SafeUnpickler`` allows its own list of torch rebuild functions)."""

from __future__ import annotations

import base64
import io
import pickle
from multiprocessing.reduction import ForkingPickler

_ALLOWED = {("builtins", name) for name in ("bool", "bytes", "dict", "float", "int", "list", "str", "tuple")}
_ALLOWED |= {("torch", "Tensor"), ("torch", "device"), ("copyreg", "_reconstructor"), ("builtins", "object")}


class SafeUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if (module, name) not in _ALLOWED:
            raise RuntimeError(f"Deserialization of {module}.{name} is not allowed (SIMULATION: the stand-in "
                               "reads the stand-in torch's tensors only)")
        return super().find_class(module, name)


class MultiprocessingSerializer:
    @staticmethod
    def serialize(obj, output_str: bool = False):
        buf = io.BytesIO()
        ForkingPickler(buf).dump(obj)
        output = buf.getvalue()
        if output_str:
            return base64.b64encode(output).decode("utf-8")
        return output

    @staticmethod
    def deserialize(data):
        if isinstance(data, str):
            data = base64.b64decode(data, validate=True)
        return SafeUnpickler(io.BytesIO(data)).load()
