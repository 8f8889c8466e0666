"""Staging: deploy.py's stages run "stage only", everything that does not touch the serving
server, so that a rollout installs on every host before it drains the first.

The run spec's mode ``stage`` (``core/runspec.py``; the rollout's staging run over all its
hosts at once) makes deploy.py run the pre-flight, the whole runtime stage (the release venv, the
patch, the model files, the wheel cache) and, of the service stage, the launch-flag check,
the JIT toolchain check and the release smoke under the unit's sandbox (GPUs hidden); then
it writes the staging record (``core.staging``) and stops: no P2P copies (the server holds
the GPUs), no secrets, no unit, no ``current`` switch, no restart, no verification.

The mode ``roll`` (the rollout's rolling runs, right after staging) lets the service stage skip the JIT check and the smoke when the host's record says they
proved exactly what they would prove again. deploy.py alone ignores records: it runs every
check itself (in one pyinfra run, operation by operation across hosts: every host's
install, model, JIT check and smoke come before any host's restart).
"""

from __future__ import annotations

from io import StringIO

from pyinfra import host

from sglang_deploy.core import flags as flagmod
from sglang_deploy.core import jit, service
from sglang_deploy.core import staging as stagingcore
from sglang_deploy.hostops import operations as ops
from sglang_deploy.hostops import releaseops
from sglang_deploy.integration.integration import this_run
from sglang_deploy.stages import jitcheck


def stage_only() -> bool:
    """This run stages only (the rollout's staging run): nothing serving is touched."""
    return this_run().spec.stage_only


def trusts_record() -> bool:
    """This run follows a staging run of the same rollout: a matching record stands."""
    return this_run().spec.trusts_staging


def record_path(layout, release_id: str) -> str:
    """Where the staging record of RELEASE_ID lives (removed with its release)."""
    return f"{layout.release_dir(release_id)}/staged.json"


def _inputs(hp, unit_text: str, smoke: bool) -> dict:
    s = hp.settings
    return {"release": hp.release_id, "unit": unit_text, "smoke": smoke,
            "flags": flagmod.render_flags(service.flag_map(s)), "steps": list(s.sglang_smoke),
            "smoke_env": dict(s.sglang_smoke_env or {}), "jit_env": dict(hp.environment()),
            "caps": _caps(hp), "doors": releaseops.smoke_doors(hp)}


def _caps(hp) -> list[str]:
    return jit.compute_caps(((hp.gpu_snapshot or {}).get("query-gpu.csv") or {}).get("out"))


def checks_before_start(hp, unit_text: str, reasons: list[str], gate: dict | None = None
                        ) -> None:
    """The checks a (re)start of HP's host (its ``hostplan.HostPlan``) needs that run without
    the GPUs: the JIT toolchain, and the release smoke when the release or the flags change
    (or nothing runs). Staging: then the record of what they proved. A rolling run after
    staging: skipped when the record matches. GATE: a group's node's ``_if`` (its group
    restarts, for any node's reason): both checks are added whatever this node's own
    reasons, and run when the group restarts."""
    s, lay, hs = hp.settings, hp.layout, hp.hoststate
    active = hs.service.unit_active
    if gate is None and active and not reasons:
        return
    smoke = gate is not None or bool(set(reasons) - {"secrets"}) or not active
    inputs = _inputs(hp, unit_text, smoke)
    path = record_path(lay, hp.release_id)
    record = hs.paths.get(path)
    if trusts_record() and stagingcore.proven(record and record.as_json(), inputs):
        host.noop("JIT toolchain and release smoke: proven by this rollout's staging run")
        return
    jitcheck.jit_toolchain_check(
        name="JIT toolchain (nvcc, ninja, c++) in the service's environment",
        python=hp.venv_python, tool=lay.tool("jit_check.py"), site=hp.site,
        env=dict(hp.environment()), venv_bin=lay.venv_bin(hp.release_id), caps=_caps(hp),
        **(gate or {}))
    if smoke:  # a new release or new flags: proven under the unit's sandbox before the switch
        releaseops.release_smoke(
            name=f"Release smoke of {hp.release_id} under the unit's sandbox",
            unit_text=unit_text, python=hp.venv_python, tool=lay.tool("release_smoke.py"),
            steps=s.sglang_smoke,
            # no --api-key, not even a placeholder: argv never names it
            flags=flagmod.render_flags(service.flag_map(s)),
            env=s.sglang_smoke_env, **releaseops.smoke_doors(hp), **(gate or {}))
    if stage_only():
        ops.file_content(name=f"Staging record of release {hp.release_id}", mode="644",
                         src=StringIO(stagingcore.record_text(inputs)), dest=path)
