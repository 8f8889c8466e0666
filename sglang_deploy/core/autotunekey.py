"""FlashInfer's autotune cache carried to a new model revision (issue 42).

SGLang (0.5.12+, ``ModelRunner._flashinfer_autotune_cache_path``) keeps the tactics its
FlashInfer autotune chose in ``$SGLANG_CACHE_DIR/flashinfer/autotune/<flashinfer version>/
sm<XY>/<key>/rank_tp<r>_pp<p>_dp<d>.json``, where ``<key>`` is the first 16 hex digits of the
sha256 of ``"|".join([model_path, dtype, quantization, moe_runner_backend, tp_size, pp_size,
dp_size, moe_ep_size, hf_config class name])`` (``model_key``, ``cache_key``). The model path
is the string the unit passes as ``--model-path``, and a new revision lives in its own folder
(``PATH@REV``, or a new ``sglang_model_path``): its first start finds no cache and tunes every
MoE op again (minutes on a real host) while the host is out of the router.

What FlashInfer keeps in that file (``flashinfer/autotuner.py``, ``save_configs``) is keyed by
``(custom op, runner class, the input shapes' tuning profile)``; its ``_metadata`` (FlashInfer,
CUDA, cuBLAS, cuDNN versions, the GPU's name) is checked again when the file is loaded, and a
mismatch makes FlashInfer ignore the whole file. The weights' values play no part: a revision
whose architecture is the old one's runs the same ops on the same shapes, so the old revision's
tactics are the ones it would tune again.

So the staging run (or a plain deploy before its restart) copies the old revision's folder to
the new revision's key, when (``decide``):

* a server ran the old revision (its ``--model-path`` read from the unit's ExecStart) and the new
  one differs;
* the launch flags that enter the key, or that decide the config class, are the same
  (``KEY_FLAGS``);
* the two ``config.json`` are the same but for metadata (``IGNORED_CONFIG_KEYS``): anything else
  may change a shape, so the new revision tunes again;
* self-verifying: the old key, rebuilt from the old revision's inputs, names a folder that
  exists. The dtype and the config class are SGLang's own derivations (``dtype_candidates``,
  ``config_class_candidates``); the candidate whose key matches an existing folder is the one
  SGLang computed (a 64-bit match), and the new key is built from the same values. No match:
  nothing is copied, and the reason says what was tried.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

#: launch flags that enter the key or decide a value in it, with SGLang's defaults (0.5.12)
KEY_FLAGS: dict[str, str | None] = {
    "dtype": "auto", "quantization": None, "moe-runner-backend": "auto", "tp-size": "1",
    "pp-size": "1", "dp-size": "1", "ep-size": "1", "trust-remote-code": None,
    "enable-dp-attention": None, "moe-a2a-backend": None, "load-format": None,
}
#: config.json keys that say nothing about the shapes (written by the tool that saved it)
IGNORED_CONFIG_KEYS = frozenset({"_name_or_path", "transformers_version", "_commit_hash"})
#: ``--dtype`` values (sglang ``_STR_DTYPE_TO_TORCH_DTYPE``) as ``str(torch dtype)``
TORCH_DTYPE = {"half": "torch.float16", "float16": "torch.float16", "float": "torch.float32",
               "float32": "torch.float32", "bfloat16": "torch.bfloat16"}
KEY_RE = re.compile(r"^[0-9a-f]{16}$")

COPY = "copy"
NONE = "none"  # nothing to carry (or nothing that may be carried): the server tunes as usual
SKIP = "skip"  # it might have been carried, but was not: the reason says why


def model_key(model_path: str, dtype: str, quantization: Any, moe_runner_backend: Any,
              tp: Any, pp: Any, dp: Any, ep: Any, config_class: str) -> str:
    """The string SGLang hashes (``_flashinfer_autotune_cache_path``'s ``model_key``)."""
    return "|".join(str(x) for x in (model_path, dtype, quantization, moe_runner_backend,
                                     tp, pp, dp, ep, config_class))


def cache_key(key: str) -> str:
    """The cache folder's name for a ``model_key``."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def flag_values(flags: Mapping[str, str]) -> dict[str, str | None]:
    """Of an argv's ``--name value`` pairs (``restart.argv_flags``), those of ``KEY_FLAGS``,
    SGLang's default where absent (a flag alone: ``""``)."""
    return {name: flags.get(name, default) for name, default in KEY_FLAGS.items()}


def dtype_candidates(flag: str | None, config: Mapping[str, Any]) -> list[str]:
    """``str(ModelRunner.dtype)`` for ``--dtype FLAG``: a named dtype is itself; ``auto``
    follows config.json's ``dtype``/``torch_dtype`` (float32 models run in bfloat16 or float16
    by model type, sglang ``_get_and_verify_dtype``); every dtype when the config names none."""
    if flag and flag != "auto":
        return [TORCH_DTYPE[flag]] if flag in TORCH_DTYPE else []
    named = config.get("dtype") or config.get("torch_dtype")
    if isinstance(named, str) and TORCH_DTYPE.get(named) not in (None, "torch.float32"):
        return [TORCH_DTYPE[named]]
    return ["torch.bfloat16", "torch.float16", "torch.float32"]


def config_class_candidates(config: Mapping[str, Any], trust_remote_code: bool) -> list[str]:
    """``hf_config.__class__.__name__``: the remote code's ``AutoConfig`` class (``auto_map``,
    with ``--trust-remote-code``), the transformers class of its ``model_type``
    (``glm_moe_dsa`` -> ``GlmMoeDsaConfig``, transformers' naming), and ``PretrainedConfig``."""
    out = []
    auto = (config.get("auto_map") or {}).get("AutoConfig") if isinstance(
        config.get("auto_map"), Mapping) else None
    if trust_remote_code and isinstance(auto, str):
        out.append(auto.rsplit("--", 1)[-1].rsplit(".", 1)[-1])
    model_type = config.get("model_type")
    if isinstance(model_type, str) and model_type:
        out.append("".join(p[:1].upper() + p[1:] for p in re.split(r"[_\-]", model_type)
                           if p) + "Config")
    out.append("PretrainedConfig")
    return list(dict.fromkeys(out))


def architecture_changes(old: Mapping[str, Any], new: Mapping[str, Any], limit: int = 3
                         ) -> list[str]:
    """What differs between two config.json (``IGNORED_CONFIG_KEYS`` aside): ``key a -> b``."""
    out = []
    for k in sorted((set(old) | set(new)) - IGNORED_CONFIG_KEYS):
        if old.get(k) != new.get(k):
            out.append(f"{k} {_short(old.get(k))} -> {_short(new.get(k))}")
    return out if len(out) <= limit else [*out[:limit], f"{len(out) - limit} more"]


def _short(value: Any) -> str:
    text = "(absent)" if value is None else str(value)
    return text if len(text) <= 40 else text[:37] + "..."


@dataclass(frozen=True)
class Copy:
    """One folder to copy: PARENT (``<flashinfer version>/sm<XY>``, under the autotune root),
    from the old revision's key to the new one's."""

    parent: str
    source: str
    dest: str


@dataclass(frozen=True)
class CarryDecision:
    action: str  # COPY, NONE or SKIP
    reason: str
    copies: tuple[Copy, ...] = field(default=())
    #: the model_key's values after the path (the candidate that matched), for the report
    inputs: tuple[str, ...] = field(default=())


def precheck(old_path: str | None, new_path: str, old_flags: Mapping[str, str] | None,
             new_flags: Mapping[str, str]) -> CarryDecision | None:
    """What can be decided from the controller's facts alone (None: the host must be asked:
    ``decide``). OLD_FLAGS: the serving unit's ``--name value`` pairs (None: no unit ran)."""
    if old_flags is None or not old_path:
        return CarryDecision(NONE, "no server ran before: nothing tuned to carry")
    if old_path == new_path:
        return CarryDecision(NONE, "the model path is unchanged: SGLang finds its cache itself")
    a, b = flag_values(old_flags), flag_values(new_flags)
    changed = [f"{k} {a[k]} -> {b[k]}" for k in KEY_FLAGS if a[k] != b[k]]
    if changed:
        return CarryDecision(NONE, "launch flags of the autotune key changed ("
                             + ", ".join(changed) + "): the new revision tunes again")
    return None


def decide(old_path: str | None, new_path: str, old_flags: Mapping[str, str] | None,
           new_flags: Mapping[str, str], old_config: Mapping[str, Any] | None,
           new_config: Mapping[str, Any] | None, folders: Mapping[str, Iterable[str]]
           ) -> CarryDecision:
    """Whether to copy the old revision's autotune cache to the new one's key, and which
    folders. FOLDERS: per parent (``<flashinfer version>/sm<XY>``) the key folders that exist
    under ``$SGLANG_CACHE_DIR/flashinfer/autotune``."""
    early = precheck(old_path, new_path, old_flags, new_flags)
    if early is not None:
        return early
    assert old_flags is not None and old_path
    if not isinstance(old_config, Mapping) or not isinstance(new_config, Mapping):
        which = old_path if not isinstance(old_config, Mapping) else new_path
        return CarryDecision(SKIP, f"{which}/config.json unreadable: nothing copied, the new "
                                   "revision tunes at its first start")
    changes = architecture_changes(old_config, new_config)
    if changes:
        return CarryDecision(NONE, "the architecture changed (config.json: "
                             + ", ".join(changes) + "): the new revision tunes again")
    by_parent = {p: {k for k in ks if KEY_RE.match(k)} for p, ks in folders.items()}
    if not any(by_parent.values()):
        return CarryDecision(NONE, "no autotune cache on the host: nothing tuned to carry")
    v = flag_values(old_flags)
    trust = v["trust-remote-code"] is not None
    # ModelRunner.dp_size: --dp-size only with --enable-dp-attention, else 1
    dp = str(v["dp-size"]) if v["enable-dp-attention"] is not None else "1"
    tried = 0
    for dtype in dtype_candidates(v["dtype"], old_config):
        for cls in config_class_candidates(old_config, trust):
            rest = (dtype, str(v["quantization"]), str(v["moe-runner-backend"]), str(v["tp-size"]),
                    str(v["pp-size"]), dp, str(v["ep-size"]), cls)
            tried += 1
            old_key = cache_key(model_key(old_path, *rest))
            parents = sorted(p for p, ks in by_parent.items() if old_key in ks)
            if not parents:
                continue
            new_key = cache_key(model_key(new_path, *rest))
            copies = tuple(Copy(p, old_key, new_key) for p in parents
                           if new_key not in by_parent[p])
            if not copies:
                return CarryDecision(NONE, f"the new revision's autotune cache ({new_key}) is "
                                           "already there", inputs=rest)
            return CarryDecision(COPY, f"same architecture and key flags: the old revision's "
                                       f"autotune cache {old_key} copied to {new_key} ("
                                       + ", ".join(c.parent for c in copies) + ")",
                                 copies=copies, inputs=rest)
    return CarryDecision(SKIP, f"no autotune cache folder matches the old revision's key as "
                               f"rebuilt from {old_path}'s inputs ({tried} dtype and config "
                               "class candidates tried): nothing copied, the new revision "
                               "tunes at its first start")
