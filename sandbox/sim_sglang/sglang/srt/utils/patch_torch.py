"""SIMULATED ``sglang.srt.utils.patch_torch`` (deployctl sandbox TEST DOUBLE).

Real SGLang (0.5.21 - 0.5.23) registers its CUDA-tensor reductions for ForkingPickler here (CUDA IPC
handles that name the device by UUID); the stand-in torch's tensors already pickle as handles."""


def monkey_patch_torch_reductions() -> None:
    """Nothing to patch: the stand-in torch's tensors pickle as handles to their source."""
