"""Synthetic EAGLE-3 drafters and base-model stubs for the sandbox (SIMULATION ONLY, a TEST DOUBLE).

Writes a tiny but format-exact drafter checkpoint so that everything which reads drafters
(``deployctl fix-keys``, the checkpoint checks, the stand-in SGLang's loader) sees the same layout
as a real one:

- ``layout="speculators"``: what vllm-project/speculators saves: decoder keys ``layers.N.*``,
  ``architectures: ["Eagle3Speculator"]``, Llama fields nested under ``transformer_layer_config``,
  aux layer ids at the top level (where SGLang's Llama draft path does not read them).
- ``layout="sglang"``: what SpecForge / public Kimi drafters ship: ``midlayer.*``, flat Llama
  config, ``LlamaForCausalLMEagle3``, ``eagle_config.eagle_aux_hidden_state_layer_ids``.

The safetensors file is real (8-byte LE header length, JSON header padded with spaces to 8 bytes,
contiguous data buffer; bf16 / int64 / bool tensors) but the numbers are deterministic noise: no
model was trained. The base model is only a ``config.json``; there are no weights.

Standard library only, so it can also run on a host: ``python3 drafter.py OUT_DIR [--layout L]``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import struct
import sys
from array import array
from pathlib import Path

#: bytes per element of the dtypes used here (safetensors dtype names).
DTYPE_SIZES = {"BF16": 2, "F16": 2, "F32": 4, "I64": 8, "BOOL": 1}

#: decoder-layer sub-keys of an EAGLE-3 drafter (vllm-project/speculators 0.9.0 and
#: SpecForge use the same sub-keys), in speculators' order.
LAYER_SUBKEYS = (
    "hidden_norm.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
)

DEFAULT_AUX_LAYER_IDS = (2, 30, 58)  # vLLM/SGLang default [2, N//2, N-3] for N = 61 (Kimi-K2.5)


def drafter_tensor_specs(
    *,
    layout: str = "speculators",
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_heads: int = 8,
    num_kv_heads: int = 8,
    head_dim: int = 8,
    vocab_size: int = 512,
    draft_vocab_size: int = 256,
    num_layers: int = 1,
    num_aux: int = 3,
    embed_tokens: bool | None = None,
) -> dict[str, tuple[str, list[int]]]:
    """Name -> (dtype, shape) of every tensor the drafter holds, as its producer names them."""
    if layout not in ("speculators", "sglang"):
        raise ValueError(f"layout must be 'speculators' or 'sglang', got {layout!r}")
    if layout == "sglang" and num_layers != 1:
        raise ValueError("the sglang (midlayer.*) layout has exactly one decoder layer")
    h, i = hidden_size, intermediate_size
    specs: dict[str, tuple[str, list[int]]] = {}
    if embed_tokens is None:
        embed_tokens = layout == "speculators"  # speculators saves it, SpecForge does not
    if embed_tokens:
        specs["embed_tokens.weight"] = ("BF16", [vocab_size, h])
    specs["fc.weight"] = ("BF16", [h, num_aux * h])
    specs["norm.weight"] = ("BF16", [h])
    specs["lm_head.weight"] = ("BF16", [draft_vocab_size, h])
    specs["d2t"] = ("I64", [draft_vocab_size])
    specs["t2d"] = ("BOOL", [vocab_size])
    for n in range(num_layers):
        prefix = "midlayer." if layout == "sglang" else f"layers.{n}."
        # Layer 0 attends over [embeds, hidden] (2H inputs); later layers over H.
        attn_in = 2 * h if n == 0 else h
        shapes = {
            "hidden_norm.weight": [h],
            "input_layernorm.weight": [h],
            "post_attention_layernorm.weight": [h],
            "self_attn.q_proj.weight": [num_heads * head_dim, attn_in],
            "self_attn.k_proj.weight": [num_kv_heads * head_dim, attn_in],
            "self_attn.v_proj.weight": [num_kv_heads * head_dim, attn_in],
            "self_attn.o_proj.weight": [h, num_heads * head_dim],
            "mlp.gate_proj.weight": [i, h],
            "mlp.up_proj.weight": [i, h],
            "mlp.down_proj.weight": [h, i],
        }
        for sub in LAYER_SUBKEYS:
            # speculators keeps the pre-attention norm of layer N > 0 as input_layernorm and has
            # no hidden_norm there (speculators 0.9.0; SGLang 0.5.12+ reads hidden_norm there).
            if sub == "hidden_norm.weight" and n > 0:
                continue
            specs[prefix + sub] = ("BF16", shapes[sub])
    return specs


def _bf16_bytes(values: list[float]) -> bytes:
    """float values -> bf16 little-endian bytes (truncation of float32, as torch does bit-wise)."""
    f32 = array("f", values)
    if f32.itemsize != 4:  # pragma: no cover - every CPython platform has 4-byte float
        raise RuntimeError("array('f') is not 32-bit here")
    if sys.byteorder != "little":
        f32.byteswap()
    raw = f32.tobytes()
    out = bytearray(len(values) * 2)
    out[0::2] = raw[2::4]
    out[1::2] = raw[3::4]
    return bytes(out)


def _tensor_bytes(name: str, dtype: str, shape: list[int], rng: random.Random,
                  hot_ids: list[int], vocab_size: int) -> bytes:
    count = math.prod(shape)
    if name.endswith("d2t"):
        # d2t[i] = target_id(i) - i: the offset from a draft id to its target id.
        return struct.pack(f"<{count}q", *(hot_ids[k] - k for k in range(count)))
    if name.endswith("t2d"):
        hot = set(hot_ids)
        return bytes(1 if k in hot else 0 for k in range(vocab_size))
    if "norm" in name:
        return _bf16_bytes([1.0 + rng.uniform(-0.02, 0.02) for _ in range(count)])
    scale = 1.0 / math.sqrt(shape[-1])
    return _bf16_bytes([rng.gauss(0.0, scale) for _ in range(count)])


def encode_safetensors(tensors: dict[str, tuple[str, list[int], bytes]],
                       metadata: dict[str, str] | None = None) -> bytes:
    """Serialize name -> (dtype, shape, data) in the safetensors layout (huggingface/safetensors
    README: u64 LE header size, JSON header, contiguous data buffer)."""
    header: dict[str, object] = {}
    if metadata is not None:
        header["__metadata__"] = dict(metadata)
    offset = 0
    chunks = []
    for name, (dtype, shape, data) in tensors.items():
        expected = math.prod(shape) * DTYPE_SIZES[dtype]
        if len(data) != expected:
            raise ValueError(f"{name}: {len(data)} bytes of data, shape {shape} x {dtype} needs {expected}")
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
        chunks.append(data)
    blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
    blob += b" " * (-len(blob) % 8)  # the safetensors writer pads the header to 8 bytes
    return struct.pack("<Q", len(blob)) + blob + b"".join(chunks)


def _drafter_config(layout: str, *, hidden_size: int, intermediate_size: int, num_heads: int,
                    num_kv_heads: int, head_dim: int, vocab_size: int, draft_vocab_size: int,
                    num_layers: int, aux_layer_ids: tuple[int, ...] | None) -> dict:
    llama = {
        "model_type": "llama",
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_attention_heads": num_heads,
        "num_key_value_heads": num_kv_heads,
        "head_dim": head_dim,
        "num_hidden_layers": num_layers,
        "vocab_size": vocab_size,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-05,
        "max_position_embeddings": 262144,
        "rope_theta": 50000.0,
        "torch_dtype": "bfloat16",
    }
    if layout == "sglang":
        config = {"architectures": ["LlamaForCausalLMEagle3"], **llama,
                  "draft_vocab_size": draft_vocab_size, "tie_word_embeddings": False}
        config["eagle_config"] = {"use_aux_hidden_state": True}
        if aux_layer_ids is not None:
            config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] = list(aux_layer_ids)
        return config
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.9.0",
        "transformer_layer_config": {"architectures": ["LlamaForCausalLM"], **llama},
        "draft_vocab_size": draft_vocab_size,
        "norm_before_residual": False,
        "torch_dtype": "bfloat16",
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": "moonshotai/Kimi-K2.5",
                         "architectures": ["KimiK25ForConditionalGeneration"]},
        },
    }
    if aux_layer_ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = list(aux_layer_ids)
    return config


def write_eagle3_drafter(
    path: Path | str,
    *,
    layout: str = "speculators",
    hidden_size: int = 64,
    intermediate_size: int = 128,
    num_heads: int = 8,
    num_kv_heads: int = 8,
    head_dim: int = 8,
    vocab_size: int = 512,
    draft_vocab_size: int = 256,
    num_layers: int = 1,
    aux_layer_ids: tuple[int, ...] | None = DEFAULT_AUX_LAYER_IDS,
    shards: int = 1,
    seed: int = 0,
) -> list[str]:
    """Write ``config.json`` and the safetensors file(s) of a synthetic drafter into ``path``.

    Returns the tensor names as stored. ``shards > 1`` writes ``model-0000k-of-0000n.safetensors``
    plus ``model.safetensors.index.json``; otherwise ``model.safetensors``.
    """
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    dims = dict(hidden_size=hidden_size, intermediate_size=intermediate_size, num_heads=num_heads,
                num_kv_heads=num_kv_heads, head_dim=head_dim, vocab_size=vocab_size,
                draft_vocab_size=draft_vocab_size, num_layers=num_layers)
    specs = drafter_tensor_specs(layout=layout, **dims, num_aux=3 if aux_layer_ids is None else len(aux_layer_ids))
    rng = random.Random(f"eagle3-drafter-{seed}-{layout}")
    hot_ids = sorted(rng.sample(range(vocab_size), draft_vocab_size))
    tensors = {name: (dtype, shape, _tensor_bytes(name, dtype, shape, rng, hot_ids, vocab_size))
               for name, (dtype, shape) in specs.items()}

    names = list(tensors)
    shards = max(1, min(shards, len(names)))
    for old in out.glob("*.safetensors"):
        old.unlink()
    index_path = out / "model.safetensors.index.json"
    if index_path.exists():
        index_path.unlink()
    if shards == 1:
        _write_atomic(out / "model.safetensors", encode_safetensors(tensors, {"format": "pt"}))
    else:
        weight_map: dict[str, str] = {}
        per = math.ceil(len(names) / shards)
        total = 0
        for k in range(shards):
            part = {n: tensors[n] for n in names[k * per:(k + 1) * per]}
            fname = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            _write_atomic(out / fname, encode_safetensors(part, {"format": "pt"}))
            weight_map.update({n: fname for n in part})
            total += sum(len(t[2]) for t in part.values())
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        _write_atomic(index_path, (json.dumps(index, indent=2) + "\n").encode())
    config = _drafter_config(layout, **dims, aux_layer_ids=aux_layer_ids)
    _write_atomic(out / "config.json", (json.dumps(config, indent=2) + "\n").encode())
    return names


def write_base_model(
    path: Path | str,
    *,
    model_type: str = "kimi_k25",
    num_hidden_layers: int = 61,
    hidden_size: int = 64,
    vocab_size: int = 512,
) -> Path:
    """A stand-in base model directory: only ``config.json`` (no weights exist in the sandbox)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    text_config = {"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
                   "num_hidden_layers": num_hidden_layers, "hidden_size": hidden_size,
                   "vocab_size": vocab_size, "max_position_embeddings": 262144}  # Kimi-K2.5's window
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": model_type,
        "num_hidden_layers": num_hidden_layers,
        "hidden_size": hidden_size,
        "vocab_size": vocab_size,
        "torch_dtype": "bfloat16",
        "text_config": text_config,
        "_sandbox_note": "SIMULATION: config.json only, no weights (deployctl sandbox).",
    }
    _write_atomic(out / "config.json", (json.dumps(config, indent=2) + "\n").encode())
    return out


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write a synthetic EAGLE-3 drafter (SIMULATION).")
    parser.add_argument("out_dir")
    parser.add_argument("--layout", choices=("speculators", "sglang"), default="speculators")
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--shards", type=int, default=1)
    args = parser.parse_args(argv)
    names = write_eagle3_drafter(args.out_dir, layout=args.layout, num_layers=args.layers,
                                 shards=args.shards)
    print(f"wrote {len(names)} tensors to {args.out_dir}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
