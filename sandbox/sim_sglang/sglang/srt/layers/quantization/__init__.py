"""SIMULATED sglang.srt.layers.quantization (deployctl sandbox TEST DOUBLE): names only, no kernels.

The lists are copied from the published SGLang 0.5.23 wheel:
- ``QUANTIZATION_CHOICES``: ``srt/arg_groups/choices.py``, the values ``--quantization`` and
  ``--speculative-draft-model-quantization`` accept (``unquant`` included);
- ``QUANTIZATION_METHODS``: ``srt/layers/quantization/__init__.py``'s registry on CUDA
  (BASE_QUANTIZATION_METHODS plus ``mxfp4``);
- ``CONFIG_FILE_METHODS``: the methods whose config class lists config files
  (``get_config_filenames()`` non-empty). ``model_loader/weight_utils.py get_quant_config`` raises
  ``Cannot find the config file for <method>`` when a checkpoint without quantization_config in
  its config.json has none of those files; the others quantize such a checkpoint online.
"""

QUANTIZATION_CHOICES = (
    "awq", "fp8", "mxfp8", "gptq", "gptq_marlin", "awq_marlin", "bitsandbytes", "gguf", "modelopt",
    "modelopt_fp8", "modelopt_fp4", "nvfp4_online", "modelopt_mixed", "petit_nvfp4", "w8a8_int8", "w8a8_fp8",
    "moe_wna16", "w4afp8", "mxfp4", "auto-round", "auto-round-int8", "compressed-tensors", "modelslim",
    "mxfp_w4a8", "quark", "quark_int4fp8_moe", "quark_mxfp4", "mlx_q4", "mlx_q8", "unquant", "humming",
)

QUANTIZATION_METHODS = (
    "fp8", "mxfp8", "minimax_m3_nvfp4", "blockwise_int8", "modelopt", "modelopt_fp8", "modelopt_fp4",
    "nvfp4_online", "modelopt_mixed", "w8a8_int8", "w8a8_fp8", "awq", "awq_marlin", "bitsandbytes", "gguf",
    "gptq_marlin", "moe_wna16", "compressed-tensors", "w4afp8", "petit_nvfp4", "quark", "quark_mxfp4",
    "auto-round", "auto-round-int8", "modelslim", "quark_int4fp8_moe", "humming", "mxfp_w4a8", "mxfp4",
)

#: method -> the files its config class looks for (0.5.23 get_config_filenames); modelopt_fp4 is
#: absent: without hf_quant_config.json it quantizes MoE experts online instead of raising
CONFIG_FILE_METHODS = {
    "awq": ("quant_config.json", "quantize_config.json"),
    "awq_marlin": ("quantize_config.json",),
    "gptq": ("quantize_config.json",),
    "gptq_marlin": ("quantize_config.json",),
    "moe_wna16": ("quantize_config.json",),
    "modelopt": ("hf_quant_config.json",),
    "modelopt_fp8": ("hf_quant_config.json",),
    "modelopt_mixed": ("hf_quant_config.json",),
    "petit_nvfp4": ("hf_quant_config.json",),
    "auto-round": ("quantization_config.json",),
    "modelslim": ("quant_model_description.json",),
}
