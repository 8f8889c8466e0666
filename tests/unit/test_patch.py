"""Unit tests of sglang_deploy.core.patch (the pure analysis) on small synthetic sources."""

from __future__ import annotations

import ast

import pytest
from patchsources import (
    MARKED,
    METHOD_057_SRC,
    METHOD_LINE,
    METHOD_SRC,
    MODULE_FN_SRC,
    NO_FUNC_SRC,
    OPTIN_SRC,
    TODO,
    UPSTREAM_FN_SRC,
    UPSTREAM_SRC,
    PackagePatchError,
    assert_stdlib_only_imports,
    changed_lines,
    code_of,
)

from sglang_deploy.core import patch as P

# ----------------------------------------------------------------------------- pure core


def apply_text(source: str) -> tuple[str, str]:
    """(new source, state) as the host tool writes it: ``applied`` when the plan changed it."""
    plan = P.analyse(source, "<source>")
    return (plan.new_source, "applied") if plan.state == P.NEEDED else (source, plan.state)


def test_method_shape_with_trtllm_routed_above():
    plan = P.analyse(METHOD_SRC, "sglang/srt/model_executor/model_runner.py")
    assert plan.state == "needed"
    assert plan.function == "ModelRunner._should_run_flashinfer_autotune"
    assert plan.line == METHOD_LINE
    assert plan.old_line == ' ' * 12 + '# "flashinfer_cutlass",'
    assert plan.new_line == " " * 12 + MARKED
    new, state = apply_text(METHOD_SRC)
    assert state == "applied"
    assert changed_lines(METHOD_SRC, new) == [(METHOD_LINE, plan.old_line, plan.new_line)]
    # the trtllm_routed line and the TODO stay commented, the decoy list is untouched
    assert '            # "flashinfer_trtllm_routed",\n' in new
    assert f"            {TODO}\n" in new
    assert new.count('# "flashinfer_cutlass",') == 1  # the decoy one
    compile(new, "model_runner.py", "exec")


def test_diff_is_one_line_unified_diff():
    plan = P.analyse(METHOD_SRC, "sglang/srt/model_executor/model_runner.py")
    lines = plan.diff.splitlines()
    assert lines[0] == "--- a/sglang/srt/model_executor/model_runner.py"
    assert lines[1] == "+++ b/sglang/srt/model_executor/model_runner.py"
    assert [x for x in lines[2:] if x.startswith(("-", "+"))] == [
        "-" + " " * 12 + '# "flashinfer_cutlass",',
        "+" + " " * 12 + MARKED,
    ]


def test_057_shape():
    new, state = apply_text(METHOD_057_SRC)
    assert state == "applied"
    assert changed_lines(METHOD_057_SRC, new) == [
        (8, ' ' * 12 + '# "flashinfer_cutlass",', " " * 12 + MARKED)
    ]


def test_module_function_shape_keeps_8_spaces():
    plan = P.analyse(MODULE_FN_SRC)
    assert plan.function == "should_run_flashinfer_autotune"
    new, state = apply_text(MODULE_FN_SRC)
    assert state == "applied"
    assert changed_lines(MODULE_FN_SRC, new) == [
        (9, ' ' * 8 + '# "flashinfer_cutlass",', " " * 8 + MARKED)
    ]


def test_second_apply_is_already_applied_and_a_noop():
    once, _ = apply_text(METHOD_SRC)
    plan = P.analyse(once)
    assert (plan.state, plan.marker, plan.line, plan.diff) == ("already-applied", True, METHOD_LINE, "")
    twice, state = apply_text(once)
    assert (twice, state) == (once, "already-applied")


def test_uncommented_by_hand_under_todo_is_already_applied_without_marker():
    src = METHOD_SRC.replace('            # "flashinfer_cutlass",\n        ]:',
                             '            "flashinfer_cutlass",\n        ]:')
    plan = P.analyse(src)
    assert plan.state == "already-applied" and not plan.marker
    assert "by hand" in plan.message
    assert apply_text(src) == (src, "already-applied")


@pytest.mark.parametrize("src", [UPSTREAM_SRC, UPSTREAM_FN_SRC,
                                 UPSTREAM_SRC.replace("class ModelRunner", "class BaseRunner")])
def test_enabled_upstream_untouched(src):
    plan = P.analyse(src)
    assert plan.state == "enabled-upstream" and not plan.marker and plan.diff == ""
    assert apply_text(src) == (src, "enabled-upstream")


def test_crlf_line_endings_are_kept():
    src = METHOD_SRC.replace("\n", "\r\n")
    new, state = apply_text(src)
    assert state == "applied"
    assert new.count("\r\n") == src.count("\r\n") and "\n" not in new.replace("\r\n", "")
    assert f"\r\n{' ' * 12}{MARKED}\r\n" in new
    assert apply_text(new) == (new, "already-applied")


def test_form_feed_and_unicode_separators_do_not_shift_lines():
    # str.splitlines() would split on \f and \u2028; Python's line numbers do not.
    src = "# \u2028 odd \x0c comment\n" + METHOD_SRC
    new, state = apply_text(src)
    assert state == "applied"
    assert changed_lines(src.replace("\u2028", "U").replace("\x0c", "F"),
                         new.replace("\u2028", "U").replace("\x0c", "F"))[0][0] == METHOD_LINE + 1


def test_no_function_is_no_autotune_list_with_actionable_message():
    with pytest.raises(PackagePatchError) as ei:
        P.analyse(NO_FUNC_SRC, "sglang/srt/model_executor/model_runner.py", version="0.5.5")
    err = ei.value
    assert err.code == "no-autotune-list" and err.details["code"] == "no-autotune-list"
    text = str(err)
    assert "0.5.7 .. 0.5.12.post1" in text and ">= 0.5.13" in text
    assert "SGLang 0.5.5" in text and "turn the autotune patch off" in text


def test_optin_scheme_of_056_is_no_autotune_list():
    with pytest.raises(PackagePatchError) as ei:
        P.analyse(OPTIN_SRC, version="0.5.6")
    assert ei.value.code == "no-autotune-list"
    assert "--enable-flashinfer-autotune" in ei.value.found


UNRECOGNISED = {
    "no-list": METHOD_057_SRC.replace(
        'if backend_str not in [\n            "flashinfer_trtllm",\n            "flashinfer_mxfp4",\n'
        f"            {TODO}\n" '            # "flashinfer_cutlass",\n        ]:',
        'if backend_str != "flashinfer_trtllm":'),
    "two-lists": METHOD_057_SRC.replace(
        "        return True", '        x = ["flashinfer_a", "flashinfer_b"]\n        return True'),
    "commented-twice": METHOD_057_SRC.replace(
        '            # "flashinfer_cutlass",\n',
        '            # "flashinfer_cutlass",\n            # "flashinfer_cutlass",\n'),
    "no-todo-above": METHOD_057_SRC.replace(f"            {TODO}\n", ""),
    "todo-elsewhere": METHOD_057_SRC.replace(
        f"            {TODO}\n            # \"flashinfer_cutlass\",\n",
        f"            {TODO}\n            \"flashinfer_x\",\n            # \"flashinfer_cutlass\",\n"),
    "todo-other-indent": METHOD_057_SRC.replace(f"            {TODO}", f"        {TODO}"),
    "commented-other-indent": METHOD_057_SRC.replace(
        '            # "flashinfer_cutlass",', '                # "flashinfer_cutlass",'),
    "enabled-and-commented": METHOD_057_SRC.replace(
        '            "flashinfer_mxfp4",\n', '            "flashinfer_mxfp4",\n            "flashinfer_cutlass",\n'),
    "marker-elsewhere": METHOD_057_SRC.replace(
        '            "flashinfer_mxfp4",', '            "flashinfer_mxfp4",  # sglang-deploy: autotune patch'),
    "no-cutlass": METHOD_057_SRC.replace('            # "flashinfer_cutlass",\n', ""),
    "commented-outside-list": METHOD_057_SRC.replace(
        f'            {TODO}\n            # "flashinfer_cutlass",\n        ]:\n',
        f"        ]:\n            {TODO}\n            # \"flashinfer_cutlass\",\n"),
    "one-line-list": 'class M:\n    def _should_run_flashinfer_autotune(self):\n'
                     '        return self.b in ["flashinfer_trtllm", "flashinfer_cutlass2"]\n',
    "items-share-line": METHOD_057_SRC.replace(
        '            "flashinfer_trtllm",\n            "flashinfer_mxfp4",\n',
        '            "flashinfer_trtllm", "flashinfer_mxfp4",\n'),
    "defined-twice": METHOD_057_SRC + "\n\n" + METHOD_057_SRC.replace("ModelRunner", "Other"),
    "method-and-function": METHOD_057_SRC + "\n\n" + MODULE_FN_SRC,
    "syntax-error": METHOD_057_SRC + "\n    def broken(:\n",
}


@pytest.mark.parametrize("name", sorted(UNRECOGNISED))
def test_unrecognised_shapes_are_refused(name):
    src = UNRECOGNISED[name]
    assert src not in (METHOD_057_SRC,)  # the mutation applied
    with pytest.raises(PackagePatchError) as ei:
        P.analyse(src, "sglang/srt/model_executor/model_runner.py")
    assert ei.value.code == "unrecognised", str(ei.value)
    assert ei.value.fix and "0.5.7 .. 0.5.12.post1" in str(ei.value) or name == "syntax-error"
    with pytest.raises(PackagePatchError):
        apply_text(src)


def test_function_named_in_a_nested_scope_is_not_the_predicate():
    src = "def outer():\n    def should_run_flashinfer_autotune():\n        return 1\n"
    assert code_of(P.analyse, src) == "no-autotune-list"


def test_module_imports_only_the_standard_library():
    """Shipped to the hosts beside patch_tool.py: stdlib only, the package's error guarded
    (imported by ``error_type`` when an error is made)."""
    tree = assert_stdlib_only_imports(P)
    guarded = [n for n in ast.walk(tree) if isinstance(n, ast.Try)]
    assert guarded and any(isinstance(h.type, ast.Name) and h.type.id == "ImportError"
                           for h in guarded[0].handlers)
