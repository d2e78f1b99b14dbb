"""Build small EAGLE-3 drafter checkpoints with the real safetensors library.

Two conventions (vllm-project/speculators 0.9.0 vs SpecForge / SGLang): speculators (vLLM's training library) names the decoder
layer ``layers.0.*`` and nests the Llama fields under ``transformer_layer_config``; SpecForge /
SGLang name it ``midlayer.*`` with a flat config and ``eagle_config``. Shapes are tiny (H=64 by
default) but the key set, dtypes and config fields are the real ones. Values are deterministic
(seeded) and distinct per tensor, so byte comparisons mean something.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np
from safetensors.numpy import save_file

INDEX_NAME = "model.safetensors.index.json"


def _layer_shapes(prefix: str, *, hidden: int, heads: int, kv_heads: int, head_dim: int,
                  intermediate: int, first: bool, hidden_norm_as_input: bool) -> Dict[str, Tuple[int, ...]]:
    """One decoder layer. Layer 0 attends over [embeds, hidden] (2*H inputs); later ones over H."""
    width = 2 * hidden if first else hidden
    shapes: Dict[str, Tuple[int, ...]] = {}
    if first:
        shapes[prefix + "hidden_norm.weight"] = (hidden,)
        shapes[prefix + "input_layernorm.weight"] = (hidden,)
    elif hidden_norm_as_input:
        # speculators: the pre-attention norm of layer N > 0 is stored as input_layernorm
        shapes[prefix + "input_layernorm.weight"] = (hidden,)
    else:
        shapes[prefix + "hidden_norm.weight"] = (hidden,)
    shapes[prefix + "post_attention_layernorm.weight"] = (hidden,)
    shapes[prefix + "self_attn.q_proj.weight"] = (heads * head_dim, width)
    shapes[prefix + "self_attn.k_proj.weight"] = (kv_heads * head_dim, width)
    shapes[prefix + "self_attn.v_proj.weight"] = (kv_heads * head_dim, width)
    shapes[prefix + "self_attn.o_proj.weight"] = (hidden, heads * head_dim)
    shapes[prefix + "mlp.gate_proj.weight"] = (intermediate, hidden)
    shapes[prefix + "mlp.up_proj.weight"] = (intermediate, hidden)
    shapes[prefix + "mlp.down_proj.weight"] = (hidden, intermediate)
    return shapes


def drafter_tensors(*, layer_prefixes: Sequence[str], speculators: bool, hidden: int = 64,
                    vocab: int = 256, draft_vocab: int = 128, n_aux: int = 3,
                    with_embed: bool = True, heads: int = 4, kv_heads: int = 2,
                    intermediate: Optional[int] = None, seed: int = 0) -> Dict[str, np.ndarray]:
    """Every tensor of a drafter, in a stable order (F16 weights, int64 d2t, bool t2d)."""
    rng = np.random.default_rng(seed)
    head_dim = hidden // heads
    intermediate = intermediate or 2 * hidden
    shapes: Dict[str, Tuple[int, ...]] = {}
    if with_embed:
        shapes["embed_tokens.weight"] = (vocab, hidden)
    shapes["fc.weight"] = (hidden, n_aux * hidden)
    for i, prefix in enumerate(layer_prefixes):
        shapes.update(_layer_shapes(prefix, hidden=hidden, heads=heads, kv_heads=kv_heads,
                                    head_dim=head_dim, intermediate=intermediate, first=i == 0,
                                    hidden_norm_as_input=speculators))
    shapes["norm.weight"] = (hidden,)
    shapes["lm_head.weight"] = (draft_vocab, hidden)
    tensors: Dict[str, np.ndarray] = {}
    for name, shape in shapes.items():
        tensors[name] = rng.standard_normal(shape).astype(np.float16)
    hot = np.sort(rng.choice(vocab, size=draft_vocab, replace=False))
    tensors["d2t"] = (hot - np.arange(draft_vocab)).astype(np.int64)
    t2d = np.zeros(vocab, dtype=bool)
    t2d[hot] = True
    tensors["t2d"] = t2d
    return tensors


def llama_fields(*, hidden: int = 64, vocab: int = 256, layers: int = 1, heads: int = 4,
                 kv_heads: int = 2, intermediate: Optional[int] = None) -> Dict[str, object]:
    return {
        "hidden_size": hidden,
        "intermediate_size": intermediate or 2 * hidden,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "rms_norm_eps": 1e-05,
        "vocab_size": vocab,
        "max_position_embeddings": 262144,
        "rope_theta": 50000.0,
        "hidden_act": "silu",
        "num_hidden_layers": layers,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
    }


def speculators_config(*, hidden: int = 64, vocab: int = 256, draft_vocab: int = 128, layers: int = 1,
                       aux_ids: Optional[Iterable[int]] = (2, 30, 58), heads: int = 4,
                       kv_heads: int = 2) -> Dict[str, object]:
    layer = {"architectures": ["LlamaForCausalLM"], "model_type": "llama"}
    layer.update(llama_fields(hidden=hidden, vocab=vocab, layers=layers, heads=heads,
                              kv_heads=kv_heads))
    config: Dict[str, object] = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": "0.3.0",
        "draft_vocab_size": draft_vocab,
        "norm_before_residual": False,
        "target_hidden_size": None,
        "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": 3}],
            "verifier": {"name_or_path": "moonshotai/Kimi-K2.5",
                         "architectures": ["KimiK25ForConditionalGeneration"]},
        },
        "torch_dtype": "bfloat16",
        "transformers_version": "4.57.1",
    }
    if aux_ids is not None:
        config["eagle_aux_hidden_state_layer_ids"] = list(aux_ids)
    return config


def sglang_config(*, hidden: int = 64, vocab: int = 256, draft_vocab: int = 128, layers: int = 1,
                  aux_ids: Optional[Iterable[int]] = (2, 30, 58), heads: int = 4,
                  kv_heads: int = 2) -> Dict[str, object]:
    config: Dict[str, object] = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama"}
    config.update(llama_fields(hidden=hidden, vocab=vocab, layers=layers, heads=heads,
                               kv_heads=kv_heads))
    config["draft_vocab_size"] = draft_vocab
    if aux_ids is not None:
        config["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(aux_ids),
                                  "use_aux_hidden_state": True}
    config["torch_dtype"] = "bfloat16"
    return config


def write_weights(directory: Path, tensors: Dict[str, np.ndarray], *, sharded: bool = False,
                  metadata: Optional[Dict[str, str]] = None) -> List[Path]:
    """model.safetensors, or two shards plus model.safetensors.index.json."""
    metadata = metadata if metadata is not None else {"format": "pt"}
    directory.mkdir(parents=True, exist_ok=True)
    if not sharded:
        path = directory / "model.safetensors"
        save_file(tensors, str(path), metadata=metadata)
        return [path]
    names = list(tensors)
    half = (len(names) + 1) // 2
    parts = [names[:half], names[half:]]
    files = []
    weight_map = {}
    for i, part in enumerate(parts, 1):
        fname = "model-%05d-of-%05d.safetensors" % (i, len(parts))
        save_file({n: tensors[n] for n in part}, str(directory / fname), metadata=metadata)
        files.append(directory / fname)
        weight_map.update((n, fname) for n in part)
    total = sum(int(t.nbytes) for t in tensors.values())
    index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(weight_map.items()))}
    (directory / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")
    return files


def write_config(directory: Path, config: Dict[str, object]) -> Path:
    path = directory / "config.json"
    path.write_text(json.dumps(config, indent=2) + "\n")
    return path


def make_speculators_drafter(dir, *, layers: int = 1, sharded: bool = False, hidden: int = 64,
                             vocab: int = 256, draft_vocab: int = 128,
                             aux_ids: Optional[Iterable[int]] = (2, 30, 58), heads: int = 4,
                             kv_heads: int = 2, seed: int = 0) -> Path:
    """A drafter as vLLM's speculators saves it: ``layers.N.*`` keys, embed_tokens included,
    config with ``transformer_layer_config`` and top-level ``eagle_aux_hidden_state_layer_ids``."""
    directory = Path(dir)
    n_aux = len(tuple(aux_ids)) if aux_ids is not None else 3
    tensors = drafter_tensors(layer_prefixes=["layers.%d." % i for i in range(layers)],
                              speculators=True, hidden=hidden, vocab=vocab,
                              draft_vocab=draft_vocab, n_aux=n_aux, with_embed=True, heads=heads,
                              kv_heads=kv_heads, seed=seed)
    write_weights(directory, tensors, sharded=sharded)
    write_config(directory, speculators_config(hidden=hidden, vocab=vocab, draft_vocab=draft_vocab,
                                               layers=layers, aux_ids=aux_ids, heads=heads,
                                               kv_heads=kv_heads))
    return directory


def make_sglang_drafter(dir, *, layers: int = 1, sharded: bool = False, hidden: int = 64,
                        vocab: int = 256, draft_vocab: int = 128,
                        aux_ids: Optional[Iterable[int]] = (2, 30, 58), heads: int = 4,
                        kv_heads: int = 2, with_embed: bool = False, seed: int = 0) -> Path:
    """A drafter as SpecForge / the public Kimi drafters ship it: ``midlayer.*`` (one layer) or
    ``layers.N.*`` with ``hidden_norm`` in every layer (several), no embed_tokens, flat config
    with ``eagle_config``."""
    directory = Path(dir)
    n_aux = len(tuple(aux_ids)) if aux_ids is not None else 3
    prefixes = ["midlayer."] if layers == 1 else ["layers.%d." % i for i in range(layers)]
    tensors = drafter_tensors(layer_prefixes=prefixes, speculators=False, hidden=hidden,
                              vocab=vocab, draft_vocab=draft_vocab, n_aux=n_aux,
                              with_embed=with_embed, heads=heads, kv_heads=kv_heads, seed=seed)
    write_weights(directory, tensors, sharded=sharded)
    write_config(directory, sglang_config(hidden=hidden, vocab=vocab, draft_vocab=draft_vocab,
                                          layers=layers, aux_ids=aux_ids, heads=heads,
                                          kv_heads=kv_heads))
    return directory


def load_all(directory: Path) -> Dict[str, Tuple[str, Tuple[int, ...], bytes]]:
    """name -> (dtype, shape, bytes) of every tensor in every .safetensors file, via safetensors."""
    from safetensors.numpy import load_file

    out: Dict[str, Tuple[str, Tuple[int, ...], bytes]] = {}
    for path in sorted(Path(directory).glob("*.safetensors")):
        for name, array in load_file(str(path)).items():
            out[name] = (str(array.dtype), tuple(array.shape), array.tobytes())
    return out


def file_sha256(path) -> str:
    import hashlib

    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def data_region_sha256(path) -> str:
    """sha256 of the bytes after the 8-byte prefix and the header: the tensor data."""
    import hashlib
    import struct

    with open(path, "rb") as handle:
        n = struct.unpack("<Q", handle.read(8))[0]
        handle.seek(8 + n)
        digest = hashlib.sha256()
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def header_json(path) -> Dict[str, object]:
    import struct

    with open(path, "rb") as handle:
        n = struct.unpack("<Q", handle.read(8))[0]
        return json.loads(handle.read(n))


def snapshot(directory) -> Dict[str, Tuple[str, int, int]]:
    """name -> (sha256, mtime_ns, inode) of every file in the directory (hidden ones included)."""
    out = {}
    for path in sorted(Path(directory).iterdir()):
        if path.is_file():
            st = path.stat()
            out[path.name] = (file_sha256(path), st.st_mtime_ns, st.st_ino)
    return out


def contents(directory) -> Dict[str, str]:
    """name -> sha256 of every file in the directory."""
    return {name: sha for name, (sha, _, _) in snapshot(directory).items()}
