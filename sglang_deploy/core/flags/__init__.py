"""Launch flags: group data mapping -> argv, checked against SGLang's own flag declarations.

Pure module.

* :func:`render_flags` turns ``{"tp-size": 8, "disable-cuda-graph": True}`` into
  ``["--disable-cuda-graph", "--tp-size", "8"]``.  Rules:

  - keys may be written ``--kebab-case``, ``kebab-case`` or ``snake_case``; they are
    normalised to ``--kebab-case``; two keys that normalise to the same flag are refused;
  - ``True`` -> bare flag; ``False``/``None`` -> omitted (with a spec: ``False`` on an
    ``argparse.BooleanOptionalAction`` flag -> ``--no-flag``);
  - numbers -> ``str()``; dicts -> compact JSON (sorted keys);
  - lists -> ONE flag followed by the items (``--flag a b``): every list option of SGLang
    0.5.9 .. 0.5.23 is ``nargs="+"``/``"*"`` and none is ``action="append"`` (repeating a
    ``nargs="+"`` flag keeps only the last occurrence).  With a spec whose flag is declared
    ``action="append"`` the flag is repeated once per item instead;
  - the output is sorted by flag name, so re-renders are byte-identical and diffs stay small.

* :func:`validate_flags` / :func:`check_flags` check a mapping against a spec (a
  :class:`FlagSpec` read from SGLang's own declarations: :mod:`sglang_deploy.core.flags.spec`,
  whose names this module re-exports).

"""

from __future__ import annotations

import difflib
import json
import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sglang_deploy.core.errors import FlagError
from sglang_deploy.core.flags.spec import (  # noqa: F401 (re-exported)
    ArgInfo,
    FlagSpec,
    parse_server_args,
    spec_from_wheel,
    spec_members,
)

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]*$")

#: flags the deploy renders itself (or must never render), with the data key to use instead
FORBIDDEN: dict[str, str] = {
    "--host": "set `sglang_host` instead (the deploy renders --host)",
    "--port": "set `sglang_port` instead (the deploy renders --port)",
    "--api-key": "name the controller environment variable holding the key in "
                 "`sglang_api_key_env`; a key on the command line is readable by every "
                 "local user in /proc/PID/cmdline",
    "--admin-api-key": "secrets never go on the command line (readable in /proc/PID/cmdline)",
    "--config": "the deploy renders every flag into the unit itself; put the options into "
                "`sglang_flags`",
}

#: flags whose fate we read off the real wheels (used when no other spec knows them)
KNOWN_CHANGES: dict[str, str] = {
    "--cuda-graph-max-bs": "removed in 0.5.20; 0.5.23 has --cuda-graph-max-bs-decode and "
                           "--cuda-graph-max-bs-prefill",
    "--disable-cuda-graph": "deprecated in 0.5.23: use --cuda-graph-backend-decode disabled "
                            "and --cuda-graph-backend-prefill disabled",
}

# --------------------------------------------------------------------------------------
# shape and names
# --------------------------------------------------------------------------------------


def normalise_name(key: str) -> str:
    """``tp_size`` / ``tp-size`` / ``--tp-size`` -> ``--tp-size`` (no validation)."""
    return "--" + str(key).strip().removeprefix("--").replace("_", "-")


def _scalar(v: Any) -> bool:
    return v is None or isinstance(v, (str, int, float, bool))


def _json_ok(v: Any) -> bool:
    if _scalar(v):
        return not (isinstance(v, float) and not math.isfinite(v))
    if isinstance(v, list):
        return all(_json_ok(x) for x in v)
    if isinstance(v, dict):
        return all(isinstance(k, str) and _json_ok(x) for k, x in v.items())
    return False


def _shape_error(key: Any, what: str, found: str, fix: str) -> FlagError:
    return FlagError(what=what, found=found, fix=fix,
                     details={"key": str(key), "data_key": "sglang_flags"})


def _has_control(s: str) -> bool:
    return any(c in s for c in "\n\r\0")


def check_shape(mapping: Any) -> None:
    """Raise :class:`FlagError` (naming the key) unless ``mapping`` is a well-formed
    ``{flag: value}``: value str/int/float/bool/None, a list of those (no None/bool), or a
    JSON-able dict (rendered as JSON); no empty names, no newlines, no duplicates."""
    if not isinstance(mapping, Mapping):
        raise _shape_error("sglang_flags", "a mapping of flag name to value",
                           f"{type(mapping).__name__}", "write `sglang_flags` as a dict")
    seen: dict[str, str] = {}
    for key, value in mapping.items():
        if not isinstance(key, str) or not key.strip().lstrip("-").strip():
            raise _shape_error(key, "a non-empty flag name", f"key {key!r}",
                               "write the full flag name, e.g. `tp-size`")
        name = normalise_name(key)
        bare = name[2:]
        if not _NAME_RE.match(bare) or key != key.strip():
            raise _shape_error(key, "a flag name of lower-case letters, digits, `-` or `_`",
                               f"`{key}`", "write the full flag name, e.g. `tp-size`")
        if name in seen:
            raise _shape_error(key, "each flag once",
                               f"`{seen[name]}` and `{key}` are both {name}",
                               "keep one of them")
        seen[name] = key
        if isinstance(value, dict):
            if not _json_ok(value):
                raise _shape_error(key, f"`{key}`: a JSON-able dict",
                                   repr(value)[:200], "use strings, numbers, lists, dicts")
            continue
        if isinstance(value, (list, tuple)):
            for item in value:
                if item is None or isinstance(item, bool) or not _scalar(item):
                    raise _shape_error(key, f"`{key}`: a list of strings or numbers",
                                       f"item {item!r} ({type(item).__name__})",
                                       "write the items as strings or numbers")
                if isinstance(item, str) and (_has_control(item) or not item):
                    raise _shape_error(key, f"`{key}`: one-line, non-empty list items",
                                       repr(item)[:200], "remove the newline")
            if not value:
                raise _shape_error(key, f"`{key}`: a non-empty list", "[]",
                                   "remove the key or give at least one item")
            continue
        if not _scalar(value):
            raise _shape_error(key, f"`{key}`: a string, number, boolean, null or list",
                               f"{type(value).__name__} {value!r}"[:200],
                               "write a plain value")
        if isinstance(value, float) and not math.isfinite(value):
            raise _shape_error(key, f"`{key}`: a finite number", repr(value),
                               "write a finite number")
        if isinstance(value, str) and _has_control(value):
            raise _shape_error(key, f"`{key}`: a one-line value", repr(value)[:200],
                               "remove the newline")


def normalise(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """``{--kebab-name: value}`` sorted by name (checks the shape first)."""
    check_shape(mapping)
    return {normalise_name(k): mapping[k] for k in sorted(mapping, key=normalise_name)}


# --------------------------------------------------------------------------------------
# rendering
# --------------------------------------------------------------------------------------


def _word(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def _looks_negative_number(s: str) -> bool:
    return bool(re.fullmatch(r"-\d+(\.\d*)?([eE][-+]?\d+)?|-\.\d+", s))


def render_flags(mapping: Mapping[str, Any], spec: FlagSpec | None = None) -> list[str]:
    """Render launch flags to argv words, sorted by flag name (see module docstring)."""
    norm = normalise(mapping)
    argv: list[str] = []
    for name, value in norm.items():
        info = spec.get(name) if spec is not None else None
        if value is None:
            continue
        if isinstance(value, bool):
            if value:
                argv.append(name)
            elif info is not None and info.action_name == "BooleanOptionalAction" \
                    and not name.startswith("--no-"):
                argv.append("--no-" + name[2:])
            continue
        if isinstance(value, (list, tuple)):
            items = [_word(v) for v in value]
            for it in items:
                if it.startswith("-") and not _looks_negative_number(it):
                    raise _shape_error(name, f"`{name}`: list items that do not start with `-`",
                                       repr(it), "argparse would read the item as a flag")
            if info is not None and info.action_name == "append":
                for it in items:
                    argv += [name, it]
            else:
                argv += [name, *items]
            continue
        word = _word(value)
        if word.startswith("-") and not _looks_negative_number(word):
            argv.append(f"{name}={word}")  # argparse would take `-x` for an option
        else:
            argv += [name, word]
    return argv


# --------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Problem:
    level: str          # "error" | "warning"
    key: str            # the key as written in the data
    flag: str           # normalised flag name
    message: str
    fix: str = ""

    def __str__(self) -> str:
        return f"{self.flag}: {self.message}" + (f" ({self.fix})" if self.fix else "")


def _close(name: str, candidates: Iterable[str]) -> list[str]:
    return difflib.get_close_matches(name, list(candidates), n=3, cutoff=0.75)


#: what argparse calls on a value, by the ``type=`` that flagspec read
_PARSERS: dict[str, Callable[[str], Any]] = {
    "int": int, "human_readable_int": int, "float": float, "json.loads": json.loads,
    "loads": json.loads}


def _convertible(value: Any, typ: str | None) -> bool:
    """Would the flag's ``type=`` accept VALUE (as rendered)?"""
    parse = _PARSERS.get(typ or "")
    if parse is None or (parse is json.loads and isinstance(value, (dict, list))):
        return True
    if isinstance(value, bool) or (parse is int and not isinstance(value, (int, str))):
        return False
    if typ == "human_readable_int" and isinstance(value, str):
        return bool(re.fullmatch(r"\s*\d+(\.\d+)?\s*[kKmMgGtT]?\s*", value))
    try:
        parse(str(value))
    except ValueError:
        return False
    return True


def _in_choices(value: Any, choices: tuple[Any, ...]) -> bool:
    return str(value) in {str(c) for c in choices}


def validate_flags(mapping: Mapping[str, Any], spec: FlagSpec, version: str | None = None,
                   *, other_specs: Mapping[str, FlagSpec] | None = None,
                   forbidden: Mapping[str, str] | None = None) -> list[Problem]:
    """Check ``mapping`` against ``spec`` (the pinned version's flags); returns problems.

    ``other_specs`` (``{version: spec}``) lets an unknown flag be reported as "exists in
    X" (renamed or removed).  ``forbidden`` defaults to :data:`FORBIDDEN`.
    """
    check_shape(mapping)
    version = version or spec.version or "this version"
    forbidden = FORBIDDEN if forbidden is None else forbidden
    problems: list[Problem] = []
    dests: dict[str, str] = {}
    for key in sorted(mapping, key=normalise_name):
        value = mapping[key]
        name = normalise_name(key)
        if name in forbidden:
            problems.append(Problem("error", key, name,
                                    f"{name} is set by the deploy itself", forbidden[name]))
            continue
        info = spec.get(name)
        if info is None:
            problems.append(_unknown(key, name, spec, version, other_specs))
            continue
        prev = dests.get(info.dest)
        if prev is not None:
            problems.append(Problem("error", key, name,
                                    f"{name} sets the same option as {prev}",
                                    "keep one of them"))
            continue
        dests[info.dest] = name
        if value is None or value is False:
            continue  # omitted
        problems += _value_problems(key, name, value, info, version)
    return problems


def _value_problems(key: str, name: str, value: Any, info: ArgInfo, version: str) -> list[Problem]:
    """What is wrong with VALUE of flag NAME (written KEY; INFO its declaration): deprecation,
    its shape (bare, value, list), each item's type and choices."""
    problems: list[Problem] = []
    if info.deprecated:
        hint = f"use {info.new_flag} instead" if info.new_flag else info.help.strip()
        msg = f"{name} is deprecated in SGLang {version}"
        if info.no_effect:
            msg += " and has no effect"
        problems.append(Problem("warning", key, name, msg, hint[:300]))
    shape = _shape_problem(key, name, value, info)
    if shape is not None or not info.takes_value or value is True:
        return problems + ([shape] if shape is not None else [])
    items = list(value) if isinstance(value, (list, tuple)) else [value]
    for item in items:
        wrong = _item_problem(key, name, item, info, version)
        if wrong is not None:
            return problems + [wrong]
    return problems


def _shape_problem(key: str, name: str, value: Any, info: ArgInfo) -> Problem | None:
    """A bare flag given a value, a value flag given none, a list for a single value."""
    if not info.takes_value:
        if value is not True:
            return Problem("error", key, name,
                           f"{name} is a bare flag and takes no value (got {value!r})",
                           f"write `{key}: true` to set it, `false` to omit it")
        return None
    if value is True:
        if not info.value_optional:
            return Problem("error", key, name, f"{name} needs a value (got true)",
                           f"write `{key}: <value>`")
        return None
    if isinstance(value, (list, tuple)) and not info.is_list:
        return Problem("error", key, name, f"{name} takes one value, not a list",
                       f"write a single value for `{key}`")
    return None


def _item_problem(key: str, name: str, item: Any, info: ArgInfo, version: str) -> Problem | None:
    """One value of flag NAME not of its type, or not one of its choices."""
    if not _convertible(item, info.type):
        return Problem("error", key, name, f"{name} expects {info.type}, got {item!r}",
                       f"write {'an' if str(info.type)[:1] in 'aeiou' else 'a'} {info.type} value")
    if info.choices is not None and not _in_choices(item, info.choices):
        sugg = _close(str(item), [str(c) for c in info.choices])
        fix = (f"did you mean {sugg[0]!r}? " if sugg else "") + \
            "valid: " + ", ".join(str(c) for c in info.choices)[:600]
        return Problem("error", key, name,
                       f"{item!r} is not a valid value of {name} in SGLang {version}", fix)
    return None


def _unknown(key: str, name: str, spec: FlagSpec, version: str,
             other_specs: Mapping[str, FlagSpec] | None) -> Problem:
    prefixes = spec.prefix_matches(name)
    elsewhere = sorted(v for v, s in (other_specs or {}).items() if name in s)
    history = ""
    if elsewhere:
        history = f"it exists in {', '.join(elsewhere)} (renamed or removed since)"
    elif name in KNOWN_CHANGES:
        history = KNOWN_CHANGES[name]
    parts = [f"{name} is not a flag of SGLang {version}"]
    if history:
        parts.append(history)
    if len(prefixes) == 1:
        if history:
            parts.append(f"argparse would silently take it as {prefixes[0]}")
        else:
            parts[0] += f": argparse only accepts it as an abbreviation of {prefixes[0]}"
        return Problem("error", key, name, "; ".join(parts),
                       f"write the full name `{prefixes[0][2:]}`")
    if prefixes:
        parts.append(f"it abbreviates {', '.join(prefixes[:5])}")
        return Problem("error", key, name, "; ".join(parts),
                       f"write the full flag name (one of {', '.join(prefixes[:5])})")
    sugg = _close(name, spec.long_options())
    fix = f"did you mean {sugg[0]}?" if sugg else \
        "see `python -m sglang.launch_server --help` of that version"
    return Problem("error", key, name, "; ".join(parts), fix)


def check_flags(mapping: Mapping[str, Any], spec: FlagSpec, version: str | None = None,
                **kw: Any) -> list[Problem]:
    """Like :func:`validate_flags` but raises :class:`FlagError` on errors; returns the
    warnings."""
    problems = validate_flags(mapping, spec, version, **kw)
    errors = [p for p in problems if p.level == "error"]
    if errors:
        v = version or spec.version or "the pinned version"
        first = errors[0]
        raise FlagError(
            what=f"launch flags that SGLang {v} accepts",
            found="\n".join(str(p.message) for p in errors),
            fix="\n".join(f"{p.flag}: {p.fix}" for p in errors if p.fix),
            details={"key": first.key, "data_key": "sglang_flags",
                     "problems": [p.__dict__ for p in problems]},
        )
    return [p for p in problems if p.level == "warning"]
