"""Sample sources of the autotune predicate, in every shape the patch knows, and a fake
site-packages: shared by test_patch.py (the pure analysis) and test_patch_tool.py (the host
side)."""

from __future__ import annotations

import ast
import shutil
import sys
from pathlib import Path

import pytest

from sglang_deploy.core import patch
from sglang_deploy.core.errors import PatchError as PackagePatchError
from sglang_deploy.remote import patch_tool

MARKED = '"flashinfer_cutlass",  # sglang-deploy: autotune patch'
TODO = "# TODO: flashinfer_cutlass will cause some flashinfer compilation errors. To be fixed."

# 0.5.10 .. 0.5.12.post1 shape (trtllm_routed commented just above), plus a decoy list with a
# commented cutlass line in another method: only the predicate's own list counts.
METHOD_SRC = f'''\
import torch


class ModelRunner:
    def _should_run_flashinfer_autotune(self) -> bool:
        """Check if flashinfer autotune should be run."""
        if self.server_args.disable_flashinfer_autotune:
            return False

        backend_str = self.server_args.moe_runner_backend

        if backend_str not in [
            "flashinfer_trtllm",
            # TODO: Enable for flashinfer_trtllm_routed once https://github.com/x/y/issues/2749 is fixed.
            # "flashinfer_trtllm_routed",
            "flashinfer_mxfp4",
            {TODO}
            # "flashinfer_cutlass",
        ]:
            return False

        major, _ = torch.cuda.get_device_capability()
        return major >= 9

    def other(self):
        return [
            "flashinfer_other",
            # "flashinfer_cutlass",
        ]
'''
METHOD_LINE = 18  # 1-based line of '# "flashinfer_cutlass",' in METHOD_SRC

# 0.5.7 .. 0.5.9 shape (no trtllm_routed line)
METHOD_057_SRC = f'''\
class ModelRunner:
    def _should_run_flashinfer_autotune(self) -> bool:
        backend_str = self.server_args.moe_runner_backend
        if backend_str not in [
            "flashinfer_trtllm",
            "flashinfer_mxfp4",
            {TODO}
            # "flashinfer_cutlass",
        ]:
            return False
        return True
'''

# A module-function layout (0.5.15+ shape) that still had the TODO: 8-space items.
MODULE_FN_SRC = f'''\
def should_run_flashinfer_autotune(model_runner, *, for_speculative_draft=False) -> bool:
    mr = model_runner
    backend_str = mr.server_args.moe_runner_backend

    moe_needs_autotune = backend_str in [
        "flashinfer_trtllm",
        "flashinfer_mxfp4",
        {TODO}
        # "flashinfer_cutlass",
    ]
    return moe_needs_autotune
'''

UPSTREAM_SRC = '''\
class ModelRunner:
    def _should_run_flashinfer_autotune(self) -> bool:
        backend_str = self.server_args.moe_runner_backend
        moe_needs_autotune = backend_str in [
            "flashinfer_trtllm",
            "flashinfer_trtllm_routed",
            "flashinfer_mxfp4",
            "flashinfer_cutedsl",
            "flashinfer_cutlass",
        ]
        model_uses_fp4 = self.model_config.quantization in (
            "modelopt_fp4",
            "modelopt_mixed",
        )
        return moe_needs_autotune or model_uses_fp4
'''

UPSTREAM_FN_SRC = '''\
def should_run_flashinfer_autotune(model_runner, *, for_speculative_draft=False) -> bool:
    moe_needs_autotune = model_runner.backend in [
        "flashinfer_trtllm",
        "flashinfer_cutlass",
        "flashinfer_megamoe",
    ]
    return moe_needs_autotune
'''

# 0.5.6.x: opt-in flag, no MoE list
OPTIN_SRC = '''\
class ModelRunner:
    def _should_run_flashinfer_autotune(self) -> bool:
        """Check if flashinfer autotune should be run."""
        if not self.server_args.enable_flashinfer_autotune:
            return False
        backend_str = self.server_args.attention_backend
        if backend_str not in ["flashinfer", "trtllm_mla", "trtllm_mha"]:
            return False
        return True
'''

NO_FUNC_SRC = '''\
class ModelRunner:
    def init_device_graphs(self):
        pass
'''


def changed_lines(old: str, new: str) -> list[tuple[int, str, str]]:
    a, b = old.splitlines(), new.splitlines()
    assert len(a) == len(b)
    return [(i + 1, x, y) for i, (x, y) in enumerate(zip(a, b)) if x != y]


def code_of(fn, *args, **kw) -> str:
    with pytest.raises(PackagePatchError) as ei:
        fn(*args, **kw)
    return ei.value.code


def make_site(root: Path, source: str = METHOD_SRC, *, version: str = "0.5.12.post1",
              rel: str = "srt/model_executor/model_runner.py", scm: bool = True) -> Path:
    """A fake site-packages with sglang/<rel> and the version files of 0.5.7+ (scm=True) or
    of <= 0.5.6 (version literal in version.py)."""
    pkg = root / "sglang"
    (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
    (pkg / rel).write_text(source)
    if scm:
        (pkg / "version.py").write_text(
            "try:\n    from sglang._version import __version__\nexcept ImportError:\n"
            '    __version__ = "0.0.0.dev0"\n')
        (pkg / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    else:
        (pkg / "version.py").write_text(f'__version__ = "{version}"\n')
    return root




def ship_tools(folder: Path) -> Path:
    """Copy patch.py and patch_tool.py into FOLDER as the deploy ships them to ROOT/tools;
    returns the script the host runs."""
    folder.mkdir(parents=True)
    shutil.copy(patch.__file__, folder / "patch.py")
    shutil.copy(patch_tool.__file__, folder / "patch_tool.py")
    return folder / "patch_tool.py"


def assert_stdlib_only_imports(module) -> ast.Module:
    """The module-level imports of MODULE's file name only the standard library (it is
    shipped to hosts); returns the parsed file for further checks."""
    tree = ast.parse(Path(module.__file__).read_text())
    names = set()
    for node in tree.body:
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0:
            names.add(node.module.split(".")[0])
    assert names - {"__future__"} <= set(sys.stdlib_module_names), names
    return tree
