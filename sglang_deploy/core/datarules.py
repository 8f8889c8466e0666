"""Data rules (pure): what a key's value must look like beyond its type, and what one key
asks of another, as declarations checked by one generic function.

``core/data.py`` declares its ``RULES`` beside ``KEYS``, as ansible's ``argument_spec`` does
(``elements``, ``required_if``...): an ``Each`` checks the value of each of its keys, a
``Secrets`` reads the secrets that ``*_env`` keys name from the environment handed in (the
caller's: core reads no environment), a ``RequiredIf`` is a cross-key rule (when one key's
value matches, one of several others must hold). ``check`` runs them in their order; the first
rule broken raises ``DataError`` naming its key.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, Protocol

from sglang_deploy.core.errors import DataError, SglangDeployError

_SCALAR = (str, int, float, bool)

#: environment variable names that hold secrets: refused in `sglang_env` (they would land in
#: the unit file, readable by every local user); the `*_env` keys carry them instead
SECRET_ENV_NAME = re.compile(
    r"^(HF_TOKEN|HUGGING_FACE_HUB_TOKEN|HUGGINGFACE_TOKEN|(.*_)?(KEY|TOKEN|SECRET|PASSWORD|PASSWD))$",
    re.IGNORECASE)


#: a value check: (name, value, the key's default) -> a replacement value, or None
Checker = Callable[[str, Any, Any], Any]


@dataclass
class Checked:
    """What the rules see and leave: the values (by key) and the secrets read so far."""

    values: dict[str, Any]
    environ: Mapping[str, str]
    secrets: dict[str, str]


@dataclass(frozen=True)
class Each:
    """CHECK(name, value, default) on each of KEYS' values, in order: it raises DataError, or
    returns a replacement value (None: the value stays)."""

    keys: tuple[str, ...]
    check: Checker

    def apply(self, state: Checked, defaults: Mapping[str, Any]) -> None:
        for name in self.keys:
            new = self.check(name, state.values[name], defaults.get(name))
            if new is not None:
                state.values[name] = new


@dataclass(frozen=True)
class Secrets:
    """Each (data key, secret name): the key names an environment variable of the controller
    that must hold the one-line secret (a key set to null names none)."""

    pairs: tuple[tuple[str, str], ...]

    def apply(self, state: Checked, defaults: Mapping[str, Any]) -> None:
        for key_name, secret_name in self.pairs:
            var = state.values[key_name]
            if var is None:
                continue
            secret = state.environ.get(var)
            if not secret:
                named_by = ", ".join(f"`{k}`" for k, _ in self.pairs if state.values[k] == var)
                raise DataError(key=key_name,
                                what=f"the controller's environment variable `{var}` (named by "
                                     f"{named_by}) to hold the secret",
                                found=f"environment variable `{var}` is not set on the controller",
                                fix=f"export {var}=... in the shell that runs the deploy "
                                    f"(never put the secret itself into data files)")
            if "\n" in secret or "\0" in secret:
                raise DataError(key=key_name, what="a secret must be one line",
                                found=f"`{var}` contains a newline or NUL",
                                fix=f"set {var} to the secret without newlines")
            state.secrets[secret_name] = secret


@dataclass(frozen=True)
class RequiredIf:
    """ansible's ``required_if``: when WHEN holds for KEY's value, one of ONE_OF must be set (a
    data key, true or non-empty, or ``secret:NAME``, a secret read); else DataError on NAMES
    (default KEY). WHAT, FOUND and FIX may name the value as ``{value}``."""

    key: str
    when: Callable[[Any], bool]
    one_of: tuple[str, ...]
    what: str
    found: str
    fix: str
    names: str | None = None

    def holds(self, state: Checked, need: str) -> bool:
        if need.startswith("secret:"):
            return need[len("secret:"):] in state.secrets
        return bool(state.values[need])

    def apply(self, state: Checked, defaults: Mapping[str, Any]) -> None:
        value = state.values[self.key]
        if self.when(value) and not any(self.holds(state, need) for need in self.one_of):
            raise DataError(key=self.names or self.key, what=self.what.format(value=value),
                            found=self.found.format(value=value), fix=self.fix.format(value=value))


class Rule(Protocol):
    """What ``check`` applies (``Each``, ``Secrets``, ``RequiredIf``)."""

    def apply(self, state: Checked, defaults: Mapping[str, Any]) -> None: ...


def check(rules: Iterable[Rule], values: dict[str, Any], environ: Mapping[str, str],
          defaults: Mapping[str, Any]) -> dict[str, str]:
    """Apply RULES in order to VALUES (replacements written back into it); return the secrets
    read from ENVIRON. DEFAULTS: each key's default (for the fix of a bad value)."""
    state = Checked(values=values, environ=environ, secrets={})
    for rule in rules:
        rule.apply(state, defaults)
    return state.secrets


# --- value checks (each: name, value, the key's default) -------------------------------------

def absolute_path(name: str, value: str | None, default: Any = None) -> None:
    if value is None:
        return
    if not value.strip() or not PurePosixPath(value).is_absolute() or "\n" in value:
        raise DataError(key=name, what=f"`{name}` must be an absolute path on the host",
                        found=repr(value), fix=f"set `{name}` to an absolute path like /srv/models/NAME")


def env_mapping(name: str, value: dict[str, Any], default: Any = None) -> None:
    """Keys are environment variable names, values one-line scalars."""
    for k, v in value.items():
        if not isinstance(k, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", k):
            raise DataError(key=name, what=f"`{name}` keys must be environment variable names",
                            found=repr(k), fix=f"rename the key {k!r} in `{name}`")
        if not isinstance(v, _SCALAR) or "\n" in str(v):
            raise DataError(key=name, what=f"`{name}.{k}` must be a one-line scalar",
                            found=repr(v), fix=f"set `{name}.{k}` to a string or number")


def _secret_fix(k: str) -> str:
    if "HF" in k.upper() or "HUGGING" in k.upper():
        return ("remove it and set `sglang_hf_token_env` to the name of a controller "
                "environment variable holding the token")
    if "API_KEY" in k.upper():
        return ("remove it and set `sglang_api_key_env` to the name of a controller "
                "environment variable holding the key")
    return ("remove it: secrets are never data; the API key goes through "
            "`sglang_api_key_env`, the Hugging Face token through "
            "`sglang_hf_token_env` (root-only secrets file)")


def no_secrets(name: str, value: dict[str, Any], default: Any = None) -> None:
    for k in value:
        if SECRET_ENV_NAME.match(k):
            raise DataError(key=name, what=f"no secret in `{name}` (it lands in the unit file, "
                                           "readable by every local user)",
                            found=f"`{k}` in `{name}`", fix=_secret_fix(k))


def elements_in(*allowed: str) -> Checker:
    """A list whose every element is one of ALLOWED (ansible's ``elements`` + ``choices``)."""

    def checker(name: str, value: list[Any], default: Any = None) -> None:
        if not all(s in allowed for s in value):
            raise DataError(key=name, what=f"a list of steps of {', '.join(allowed)}",
                            found=repr(value), fix=f"e.g. {_json_list(default)}")

    return checker


def _json_list(items: list[Any]) -> str:
    return "[" + ", ".join(f'"{x}"' for x in items) + "]"


def distinct_positive_ints(name: str, value: list[Any], default: Any = None) -> None:
    if not value or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1
                            for c in value) or len(set(value)) != len(value):
        raise DataError(key=name, what="a list of distinct positive integers",
                        found=repr(value), fix=f"e.g. {default}")


def plain_name(name: str, value: str, default: Any = None) -> None:
    if not re.fullmatch(r"[a-z_][a-z0-9_-]{0,31}", value):
        raise DataError(key=name, what=f"`{name}` must be a plain lower-case name",
                        found=repr(value), fix=f"set `{name}` to e.g. `{default}`")


def non_empty_strings(name: str, value: list[Any], default: Any = None) -> None:
    if not all(isinstance(x, str) and x for x in value):
        raise DataError(key=name, what="a list of non-empty strings",
                        found=repr(value), fix=f"e.g. {_json_list(default)}")


def phase_timeouts(phases: tuple[str, ...]) -> Checker:
    """A mapping of some of PHASES to positive seconds; returned over the default's."""

    def checker(name: str, value: dict[str, Any], default: dict[str, Any]) -> dict[str, Any]:
        for ph, secs in value.items():
            if ph not in phases:
                raise DataError(key=name, what=f"phases are {', '.join(phases)}",
                                found=f"unknown phase {ph!r}", fix="rename or remove it")
            if isinstance(secs, bool) or not isinstance(secs, (int, float)) or secs <= 0:
                raise DataError(key=name, what=f"`{ph}` must be a positive number",
                                found=repr(secs), fix=f"set {name}.{ph} to seconds > 0")
        return {**default, **value}

    return checker


def launch_flags(owned: Mapping[str, str]) -> Checker:
    """Well-formed launch flags, none of them one of OWNED (flag -> the key that sets it)."""

    def checker(name: str, value: dict[str, Any], default: Any = None) -> None:
        from sglang_deploy.core import flags as flagmod  # shape of the launch flags

        try:
            flagmod.check_shape(value)
        except SglangDeployError as exc:
            raise DataError(key=name, what=f"well-formed launch flags ({exc.what})",
                            found=exc.found, fix=exc.fix, details=exc.details) from exc
        for key in value:
            flag = flagmod.normalise_name(key)
            if flag in owned:
                raise DataError(key=name, what=f"`{flag}` is set through `{owned[flag]}`",
                                found=f"`{flag}` in {name}",
                                fix=f"remove it from {name} and set `{owned[flag]}`",
                                details={"key": str(key), "data_key": name})

    return checker


def http_url(name: str, value: str | None, default: Any = None) -> None:
    if value is not None and not re.fullmatch(r"https?://[^\s/?#]+(/[^\s?#]*)?", value):
        raise DataError(key=name, what="an http(s) URL without query",
                        found=repr(value), fix="e.g. https://hf-mirror.example.org or null")
