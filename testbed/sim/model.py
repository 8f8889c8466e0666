"""Model directory stand-in for the testbed (what /srv/models/<name>/ holds).

Only the files SGLang's startup reads before the weights: config.json and
model.safetensors.index.json, plus shard files with a valid safetensors header.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path


def _safetensors_bytes(tensor_name: str, n_bytes: int) -> bytes:
    """A valid safetensors file: 8-byte little-endian header length, JSON header, zero data."""
    n_bytes = max(1, n_bytes)
    header = {
        "__metadata__": {"format": "pt"},
        tensor_name: {"dtype": "U8", "shape": [n_bytes], "data_offsets": [0, n_bytes]},
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # header padded to 8 bytes, as the reference writer does
    return struct.pack("<Q", len(raw)) + raw + bytes(n_bytes)


def make_model_dir(path, n_shards: int = 5, shard_bytes: int = 4096,
                   architecture: str = "GlmMoeDsaForCausalLM", quantized: bool = True) -> Path:
    """Write a model stand-in into PATH; returns the Path.

    config.json (architecture, GLM-5-like sizes, ModelOpt NVFP4 quantization_config if
    quantized), model.safetensors.index.json (weight_map over all shards, metadata.total_size),
    and shards model-0000N-of-0000M.safetensors of SHARD_BYTES zero bytes each.
    """
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": [architecture],
        "model_type": "glm_moe_dsa" if architecture == "GlmMoeDsaForCausalLM" else "llama",
        "hidden_size": 6144,
        "num_hidden_layers": 78,
        "num_attention_heads": 64,
        "max_position_embeddings": 202752,
        "vocab_size": 154880,
        "torch_dtype": "bfloat16",
    }
    if quantized:
        config["quantization_config"] = {"quant_method": "modelopt", "quant_algo": "NVFP4"}
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    width = max(5, len(str(n_shards)))
    weight_map = {}
    total = 0
    for i in range(1, n_shards + 1):
        name = f"model-{i:0{width}d}-of-{n_shards:0{width}d}.safetensors"
        tensor = f"model.layers.{i - 1}.mlp.experts.weight"
        (root / name).write_bytes(_safetensors_bytes(tensor, shard_bytes))
        weight_map[tensor] = name
        total += shard_bytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    return root
