"""Model directory stand-in for the testbed (what /srv/models/<name>/ holds).

config.json and model.safetensors.index.json, shard files with a valid safetensors header
and real bytes after it (written, not sparse: the simulated server maps every shard and
touches every page as safetensors does, so its load time follows the page cache, as a real
server's does); and a tiny word-level tokenizer (tokenizer.json + tokenizer_config.json,
written as plain JSON, no download) so that `AutoTokenizer.from_pretrained(model_dir)` works
for clients such as `python -m sglang.bench_serving`.

The shards' total size: ``TESTBED_MODEL_MIB`` in the environment of whoever makes the folder
(`python -m testbed up`), default 64 MiB per host, small enough for several testbeds on one
machine; a larger one (a few GiB) makes warm and cold loads measurably apart.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

#: the environment variable that sizes a testbed host's model (MiB, all shards together)
MODEL_MIB_ENV = "TESTBED_MODEL_MIB"
DEFAULT_MODEL_MIB = 64
_PATTERN = bytes(range(1, 256)) * 4112  # ~1 MiB of non-zero bytes, nothing a file system elides


def model_bytes() -> int:
    """The shards' total size for a testbed host (``TESTBED_MODEL_MIB``, default 64 MiB)."""
    value = os.environ.get(MODEL_MIB_ENV, "").strip()
    mib = float(value) if value else DEFAULT_MODEL_MIB
    if mib <= 0:
        raise ValueError(f"{MODEL_MIB_ENV}={value}: the model's size in MiB must be above 0")
    return int(mib * (1 << 20))


def _header(tensor_name: str, n_bytes: int) -> bytes:
    """A safetensors header: 8-byte little-endian length, then the JSON (padded to 8 bytes,
    as the reference writer does) of one U8 tensor of N_BYTES."""
    header = {
        "__metadata__": {"format": "pt"},
        tensor_name: {"dtype": "U8", "shape": [n_bytes], "data_offsets": [0, n_bytes]},
    }
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw


def write_shard(path: Path, tensor_name: str, n_bytes: int) -> None:
    """A valid safetensors file at PATH whose N_BYTES of data are written for real."""
    n_bytes = max(1, n_bytes)
    with open(path, "wb") as fh:
        fh.write(_header(tensor_name, n_bytes))
        left = n_bytes
        while left:
            chunk = _PATTERN[:min(left, len(_PATTERN))]
            fh.write(chunk)
            left -= len(chunk)


#: the text the simulator generates, word after word
WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "sglang",
         "serves", "tokens", "from", "eight", "simulated", "blackwell", "gpus", "in", "a", "small",
         "testbed"]
# The tokenizer's vocabulary: the simulator's words first, then filler words; it is fixed, so
# tokenization is deterministic across hosts and runs.
TOKENIZER_WORDS = list(dict.fromkeys(WORDS))
TOKENIZER_VOCAB_SIZE = 1024
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>"]


def tokenizer_files() -> dict:
    """{filename: text} of a word-level Hugging Face tokenizer (the `tokenizers` JSON format)."""
    words = list(SPECIAL_TOKENS) + TOKENIZER_WORDS
    words += [f"w{i}" for i in range(TOKENIZER_VOCAB_SIZE - len(words))]
    vocab = {w: i for i, w in enumerate(words)}
    added = [{"id": i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(SPECIAL_TOKENS)]
    tok = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
           "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None,
           "decoder": None, "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "<unk>"}}
    config = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>",
              "unk_token": "<unk>", "model_max_length": 202752, "clean_up_tokenization_spaces": False}
    return {"tokenizer.json": json.dumps(tok, indent=1) + "\n",
            "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}


def make_model_dir(path, n_shards: int = 5, shard_bytes: int | None = None) -> Path:
    """Write a model stand-in into PATH; returns the Path.

    config.json (GLM-5's architecture and sizes, ModelOpt NVFP4 quantization_config),
    model.safetensors.index.json (weight_map over all shards, metadata.total_size), and
    shards model-0000N-of-0000M.safetensors of SHARD_BYTES data bytes each (default: the
    testbed's model size, ``model_bytes()``, over the shards).
    """
    if shard_bytes is None:
        shard_bytes = max(1, model_bytes() // n_shards)
    root = Path(path)
    root.mkdir(parents=True, exist_ok=True)
    config = {
        "architectures": ["GlmMoeDsaForCausalLM"],
        "model_type": "glm_moe_dsa",
        "hidden_size": 6144,
        "num_hidden_layers": 78,
        "num_attention_heads": 64,
        "max_position_embeddings": 202752,
        "vocab_size": 154880,
        "torch_dtype": "bfloat16",
        "quantization_config": {"quant_method": "modelopt", "quant_algo": "NVFP4"},
    }
    (root / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    width = max(5, len(str(n_shards)))
    weight_map = {}
    total = 0
    for i in range(1, n_shards + 1):
        name = f"model-{i:0{width}d}-of-{n_shards:0{width}d}.safetensors"
        tensor = f"model.layers.{i - 1}.mlp.experts.weight"
        write_shard(root / name, tensor, shard_bytes)
        weight_map[tensor] = name
        total += shard_bytes
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")
    for name, text in tokenizer_files().items():
        (root / name).write_text(text)
    return root
