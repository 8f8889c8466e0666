"""Scripts shipped to hosts and run there with the host's python3 (stdlib only; except
``model_fetch.py``, which runs with the release venv's python for its huggingface_hub, and
``patch_tool.py``, run by the release venv's python with ``core/patch.py`` shipped beside it,
and ``allreduce_check.py``, run by the release venv's python for its torch).

They are plain files: read them (``hostops.facts.REMOTE``) and upload them; never import
them on the controller for their side effects.
"""

from pathlib import Path

CUDA_PROBE = Path(__file__).resolve().parent / "cuda_probe.py"
