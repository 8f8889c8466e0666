"""Scripts shipped to hosts and run there with the host's python3 (stdlib only; except
``model_fetch.py``, which runs with the release venv's python for its huggingface_hub, and
``patch_tool.py``, run by the release venv's python with ``core/patch.py`` shipped beside it).

They are plain files: read them with :func:`script_path` and upload them; never import
them on the controller for their side effects.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["script_path", "CUDA_PROBE"]

_HERE = Path(__file__).resolve().parent


def script_path(name: str) -> Path:
    """Absolute path of a shipped script, e.g. ``script_path("cuda_probe.py")``."""
    path = _HERE / name
    if not path.is_file():
        raise FileNotFoundError(path)
    return path


CUDA_PROBE = _HERE / "cuda_probe.py"
