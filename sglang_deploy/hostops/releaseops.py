"""pyinfra operations of a release: uv in a tool venv, the release venv from its lock, the
autotune patch, the launch-flag check against the installed sglang, the caches restored, old
releases pruned, the model downloaded. Each fetches what it compares itself (the run's
host-state read of its root when one was made, else a fact of its own: ``facts.host_state``,
``facts.patch_status``) and yields nothing when the host already matches (``host.noop``);
decisions come from the pure modules."""

from __future__ import annotations

import dataclasses
import datetime
import json
import shlex
from pathlib import Path

from pyinfra import host, logger, state
from pyinfra.api import FunctionCommand, operation
from pyinfra.api.command import FileUploadCommand
from pyinfra.facts.files import File

from sglang_deploy.controller import flagcache
from sglang_deploy.core import flags as flagmod
from sglang_deploy.core import hardening, jit, modelfetch, smoke
from sglang_deploy.core.errors import FlagError, PatchError, RuntimeSetupError
from sglang_deploy.core.hostrecords import Hardening
from sglang_deploy.core.unit import device_allow
from sglang_deploy.hostops import facts
from sglang_deploy.hostops.facts import FileCount, ServerArgsSource, UvVersion
from sglang_deploy.hostops.operations import _sh, private_upload, reported, write_json_record
from sglang_deploy.integration import streamed


def _source(wheelhouse: str | None, index_url: str | None) -> list[str]:
    """pip/uv options: offline from WHEELHOUSE (a folder on the host), else INDEX_URL."""
    if wheelhouse:
        return ["--no-index", "--find-links", wheelhouse]
    return ["--index-url", index_url] if index_url else []


def _present_uv(root: str) -> str | None:
    """The tool venv's uv version: from the run's host-state read of ROOT, else ``UvVersion``."""
    hs = facts.known_state(host, root=root)
    return hs.uv_version if hs is not None else host.get_fact(UvVersion, venv=f"{root}/tools/venv")


@operation()
def tool_venv(root: str, python: str, uv_version: str, wheelhouse: str | None = None,
              index_url: str | None = None):
    """
    Bring uv onto the host, in a small tool venv made with the system python; compared with
    the uv found there (the run's host-state read of ROOT, else the ``UvVersion`` fact).

    + root: sglang root folder (the venv goes to ``ROOT/tools/venv``)
    + python: system python used to make the venv
    + uv_version: exact uv version wanted
    + wheelhouse: install offline from this folder on the host
    + index_url: package index to use otherwise

    **Example:**

    .. code:: python

        tool_venv(root="/opt/sglang", python="/usr/bin/python3", uv_version="0.13.9",
                  wheelhouse="/srv/wheelhouse")
    """
    if _present_uv(root) == uv_version:
        host.noop(f"uv {uv_version} is present")
        return
    venv = f"{root}/tools/venv"
    yield f"rm -rf {shlex.quote(venv)} && {_sh(python, '-m', 'venv', venv)}"
    yield _sh(f"{venv}/bin/pip", "install", "--disable-pip-version-check", "--no-input", "-q",
              *_source(wheelhouse, index_url), f"uv=={uv_version}")


def _explain_failure(cmd: str, release_id: str, rel: str) -> str:
    """CMD, and if it fails: a message naming the release, the free space and the fix, on
    stderr (pyinfra shows it under the failed command), then CMD's exit status."""
    msg = (f"sglang-deploy: installing release {release_id} failed (exit $rc; free space in "
           f"{rel}: $(df -h --output=avail {shlex.quote(rel)} 2>/dev/null | tail -n 1 | tr -d ' ')). "
           "The half-made release has no .complete marker: it is never used, the service keeps "
           "its current release, and the next run installs it again. Fix: read the error above "
           "(No space left on device: free disk space; a missing or mismatched wheel: fill the "
           "wheelhouse or check the index and the lock), then re-run the deploy.")
    return f'{cmd} || {{ rc=$?; echo "{msg}" >&2; exit $rc; }}'


def _release_complete(root: str, release_id: str) -> bool:
    """Whether ROOT holds RELEASE_ID complete: from the run's host-state read of ROOT, else
    pyinfra's ``File`` fact of its ``.complete`` marker."""
    hs = facts.known_state(host, root=root)
    if hs is not None:
        return hs.releases.complete(release_id)
    return bool(host.get_fact(File, path=f"{root}/releases/{release_id}/.complete"))


@operation()
def release_venv(root: str, release_id: str, python: str, lock_path: str,
                 wheelhouse: str | None = None, index_url: str | None = None,
                 uv_cache: str | None = None, meta: dict | None = None,
                 packages: int | None = None):
    """
    Install one release venv, exactly the lock (``uv pip sync --require-hashes``).

    A release lives in ``ROOT/releases/ID/venv`` and counts only once ``.complete`` exists,
    so an install that was interrupted is thrown away and redone by the next run (as the
    run's host-state read of ROOT found it, else pyinfra's ``File`` fact of the marker).

    + root: sglang root folder
    + release_id: the release id (hash of the lock file)
    + python: the system python the venv is made from
    + lock_path: path of the lock file ON THE HOST (uploaded before)
    + wheelhouse: install offline from this folder on the host (no index)
    + index_url: package index otherwise
    + uv_cache: uv's cache folder on the host
    + meta: extra fields written into ``release.json``
    + packages: how many packages the lock pins (for the progress lines)

    **Example:**

    .. code:: python

        release_venv(root="/opt/sglang", release_id="3f2a...", python="/usr/bin/python3",
                     lock_path="/opt/sglang/releases/3f2a.../requirements.lock")
    """
    if _release_complete(root, release_id):
        host.noop(f"release {release_id} is installed")
        return
    rel = f"{root}/releases/{release_id}"
    uv = f"{root}/tools/venv/bin/uv"
    source = (["--offline"] if wheelhouse else []) + _source(wheelhouse, index_url)
    env = f"UV_CACHE_DIR={shlex.quote(uv_cache)} " if uv_cache else ""
    installed = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    release_meta = json.dumps({"id": release_id, "installed_at": installed, **(meta or {})},
                              sort_keys=True)
    yield f"rm -rf {shlex.quote(rel + '/venv')} {shlex.quote(rel + '/.complete')}"
    yield _explain_failure(f"{env}{_sh(uv, 'venv', '-q', '--python', python, rel + '/venv')}",
                           release_id, rel)
    # the watcher prints what is installed every 5 s: shown live under the host
    watch = _sh(python, f"{root}/tools/progress_watch.py", "--venv", rel + "/venv",
                *(["--packages", str(packages)] if packages else []), "--")
    sync = _explain_failure(
        f"{env}{watch} {_sh(uv, 'pip', 'sync', '-q', '--require-hashes', '--python', rel + '/venv/bin/python', *source, lock_path)}",
        release_id, rel)
    yield FunctionCommand(streamed.run_with_progress, (sync, f"installing release {release_id}"), {})
    yield jit.lib64_links_command(rel + "/venv")
    yield f"printf '%s\\n' {shlex.quote(release_meta)} > {shlex.quote(rel + '/release.json')}"
    yield f"touch {shlex.quote(rel + '/.complete')}"


@operation()
def autotune_patch(root: str, release_id: str, python: str, site: str, tool: str, record: str):
    """
    Apply the FlashInfer autotune patch to a release venv, version-aware (``patch_tool.py``),
    unless its status says it is applied or not needed (``facts.patch_status``: none for a
    release the run's read of ROOT found incomplete, the release's patch record when the file
    is still the bytes it describes, else ``patch_tool.py status`` on the host).

    + root: sglang root folder
    + release_id: the release whose venv is patched
    + python: the release venv's python
    + site: its site-packages folder
    + tool: path of the shipped ``patch_tool.py`` on the host (``patch.py`` beside it)
    + record: where the patch state record is written (JSON)

    **Example:**

    .. code:: python

        autotune_patch(root="/opt/sglang", release_id="3f2a...", python=".../venv/bin/python",
                       site=".../site-packages", tool="/opt/sglang/tools/patch_tool.py",
                       record=".../autotune-patch.json")
    """
    status = facts.patch_status(host, root, release_id, python, site, tool)
    state = (status or {}).get("state")
    if state in ("already-applied", "enabled-upstream"):
        host.noop(f"autotune patch: {state} ({status.get('file')})")
        return
    if status is not None and state not in (None, "needed"):
        raise PatchError(what="a known autotune allow-list in the installed sglang",
                         found=f"{state}: {status.get('error') or status.get('message')}",
                         fix="pin an sglang version the patcher knows (0.5.7 .. 0.5.23) or set "
                             "sglang_autotune_patch: false")
    yield _sh(python, tool, "apply", site, "--json", "--record", record)


def server_args_flag_spec(site: str, cache_dir: str) -> flagmod.FlagSpec | None:
    """The flags ``server_args.py`` of the release at SITE declares: fetched and parsed only
    when the controller's cache (``flagcache``, by sha256) does not hold them; None if the
    file is missing."""
    src = host.get_fact(ServerArgsSource, site=site)
    if src is None:
        return None
    return flagcache.spec_for(cache_dir, src["text"], src["sha256"])


def _check_flags_on_host(site: str, settings_flags: dict, version: str, cache_dir: str):
    spec = server_args_flag_spec(site, cache_dir)
    if spec is None:
        raise FlagError(what="sglang/srt/server_args.py in the release venv",
                        found=f"missing under {site}", fix="re-run the deploy to reinstall")
    flagmod.check_flags(settings_flags, spec, version, forbidden={})
    logger.info(f"{host.print_prefix}launch flags checked against sglang {version}")


@operation()
def launch_flags_check(site: str, flag_map: dict, version: str, spec: flagmod.FlagSpec | None,
                       cache_dir: str):
    """
    Check every launch flag against the flags the installed sglang defines (read statically
    from its ``server_args.py``), before the unit changes.

    + site: site-packages of the release venv on the host
    + flag_map: the full flag mapping that will be rendered
    + version: the sglang version of the release
    + spec: the flags of the installed release's ``server_args.py`` if it exists already,
      else None (then the check runs on the host right after the install)
    + cache_dir: the controller's cache of parsed ``server_args.py`` files (``flagcache``)

    **Example:**

    .. code:: python

        launch_flags_check(site=site, flag_map=flags, version="0.5.12.post1", spec=None,
                           cache_dir=".sglang-deploy/cache/flagspec")
    """
    if spec is not None:
        flagmod.check_flags(flag_map, spec, version, forbidden={})
        host.noop(f"{len(flag_map)} launch flags are defined by sglang {version}")
        return
    yield FunctionCommand(reported(_check_flags_on_host), (site, flag_map, version, cache_dir), {})


def _present_files(cache_dir: str) -> int:
    """Files in CACHE_DIR: from the run's host-state read that counted it, else ``FileCount``."""
    hs = facts.known_state(host, cache=cache_dir)
    if hs is not None and hs.cache_files is not None:
        return hs.cache_files
    return host.get_fact(FileCount, path=cache_dir)


@operation()
def cache_seeded(seed: str, cache_dir: str, user: str):
    """
    Unpack a cache archive (``sglang-deploy cache save``) into the service's cache folder
    when that folder is empty (a new or rebuilt host). Never overwrites a live cache.

    + seed: path of the ``.tar.gz`` ON THE CONTROLLER (relative to the deploy folder)
    + cache_dir: the service's cache folder on the host (``sglang_cache_dir``)
    + user: the service user, owner of everything unpacked

    **Example:**

    .. code:: python

        cache_seeded(seed="backups/gpu-node-1-cache.tar.gz", cache_dir="/var/cache/sglang",
                     user="sglang")
    """
    present_files = _present_files(cache_dir)
    if present_files:
        host.noop(f"{cache_dir} already holds {present_files} files: not seeded")
        return
    path = Path(state.cwd or ".") / seed
    if not path.is_file():
        raise RuntimeSetupError(what="the cache archive `sglang_cache_seed` on the controller",
                                found=f"no file {path}",
                                fix="make one with `sglang-deploy cache save INVENTORY HOST FILE` "
                                    "or unset sglang_cache_seed")
    tmp = "/root/.sglang-cache-seed.tar.gz"
    yield FileUploadCommand(str(path), tmp, remote_temp_filename=None)
    q = shlex.quote
    yield (f"install -d -m 750 {q(cache_dir)} && tar -C {q(cache_dir)} -xzf {q(tmp)} "
           f"--no-same-owner && chown -R {q(user)}:{q(user)} {q(cache_dir)} && rm -f {q(tmp)}")


def releases_to_prune(releases: dict, keep: int, protected: set[str]) -> list[str]:
    """Pure: the release ids to delete so that at most KEEP remain, oldest first, never a
    PROTECTED one (current, known-good, the one being deployed) nor an unknown-age one."""
    dated = sorted((meta["installed_at"], rid) for rid, meta in releases.items()
                   if meta.get("installed_at") and rid not in protected)
    return [rid for _, rid in dated][:max(0, len(releases) - keep)]


@operation()
def releases_pruned(root: str, keep: int, protected: set[str], installing: str | None = None,
                    python: str = "python3"):
    """
    Delete old release venvs beyond ``keep`` (oldest first); the current, the known-good
    and the release being deployed are never deleted, so a rollback always has its venv.
    The releases (with their ``installed_at``) are the host's under ROOT
    (``facts.host_state``: the run's read of ROOT, else ``SglangHostState`` of ROOT).

    + root: sglang root folder
    + keep: how many releases to keep (``sglang_keep_releases``)
    + protected: release ids that must stay
    + installing: the release this run installs, counted as the newest even before it exists
    + python: the system python (a read of ROOT of its own runs ``hoststate.py`` with it)

    **Example:**

    .. code:: python

        releases_pruned(root="/opt/sglang", keep=3, protected={"3f2a...", "9be1..."},
                        installing="3f2a...", python="/usr/bin/python3")
    """
    hs = facts.host_state(host, root, python)
    releases = {**(hs.releases.metas() if hs is not None else {}),
                **({installing: {"installed_at": "now"}} if installing else {})}
    doomed = releases_to_prune(releases, keep, protected)
    if not doomed:
        host.noop(f"{len(releases)} release(s) kept (at most {keep})")
        return
    yield "rm -rf " + " ".join(shlex.quote(f"{root}/releases/{rid}") for rid in doomed)


def _fetch_on_host(spec: modelfetch.FetchSpec, group: str | None):
    # the command names the token FILE only, so it may be shown (-vv); its output is not
    ok, output = streamed.run_logged(modelfetch.fetch_command(spec))  # progress shown live
    result, rc = modelfetch.parse_output(output.stdout)
    error = modelfetch.diagnose(spec, result, rc if ok else None, output.stderr)
    if error is not None:
        raise error
    if group:  # the service user reads the model through its group
        host.run_shell_command(f"chgrp -R {shlex.quote(group)} {shlex.quote(spec.path)} && "
                               f"chmod -R g+rX {shlex.quote(spec.path)}")
    logger.info(f"{host.print_prefix}model {spec.repo}@{(result or {}).get('commit') or spec.revision}"
                f": {(result or {}).get('files')} files in {spec.path}")


@operation()
def model_download(spec: modelfetch.FetchSpec, root: str, python: str = "python3",
                   token: str | None = None, group: str | None = None):
    """
    Download the model with huggingface_hub (``remote/model_fetch.py`` run by the release
    venv's python) when the folder is incomplete (every shard of its index at full size, as
    ``facts.host_state`` finds the folder: the run's read of it or of the folder whose sibling
    revision it is, else ``SglangHostState`` of ROOT with that model), then check every shard
    against the index.

    The token goes into a root-only file (``spec.token_file``, removed after the download),
    never into argv, the environment of another process, or pyinfra's output.

    + spec: ``modelfetch.FetchSpec`` (repo, revision, path, python, tool, token file, endpoint,
      deadline)
    + root: sglang root folder (a read of its own is ``hoststate.py state --root ROOT``)
    + python: the system python that read runs with
    + token: the Hugging Face token (from the controller's environment), None: anonymous
    + group: group given read access to the downloaded files (the service user's)

    **Example:**

    .. code:: python

        model_download(spec=FetchSpec(repo="org/model", revision="main", path="/srv/models/m",
                                      python=".../venv/bin/python",
                                      tool="/opt/sglang/tools/model_fetch.py",
                                      token_file="/etc/sglang/.hf-token"),
                       root="/opt/sglang", python="/usr/bin/python3",
                       token=settings.secrets.get("HF_TOKEN"), group="sglang")
    """
    hs = facts.host_state(host, root, python, model=spec.path)
    if modelfetch.model_complete(facts.model_state(hs, spec.path), spec.path):
        host.noop(f"model folder {spec.path} is complete")
        return
    if token and spec.token_file:
        yield from private_upload(token + "\n", spec.token_file)
    elif spec.token_file:
        spec = dataclasses.replace(spec, token_file=None)
    yield FunctionCommand(reported(_fetch_on_host), (spec, group), {})




def smoke_doors(hp) -> dict:
    """The smoke's door arguments for HP's host (its ``hostplan.HostPlan``): the /dev/nvidia*
    nodes its pre-flight listed, the unit's DeviceAllow list, where the host keeps what the
    smoke sees of the sandbox, and the release."""
    listing = ((hp.gpu_snapshot or {}).get("dev-nvidia.txt") or {}).get("out")
    return {"devices": hardening.smoke_devices(listing),
            "device_allow": device_allow(hp.settings.gpu_expected_count),
            "record": hp.layout.hardening_record, "release": hp.release_id,
            "required": tuple(hp.settings.sglang_hardening_required)}


def _control(command: str | None) -> list[str]:
    """The smoke's control run outside the sandbox (``release_smoke.py --control``): the nodes
    outside DeviceAllow that open without it."""
    if not command:
        return []
    _, output = host.run_shell_command(command, print_output=False)
    try:
        return list(json.loads(output.stdout.strip().splitlines()[-1])["outside"])
    except (ValueError, IndexError, KeyError, TypeError):
        return []


def _smoke_on_host(command, control: str | None = None, record: str | None = None,
                   release: str = "", required: tuple[str, ...] = ()) -> None:
    """COMMAND: the smoke's command line, from the nodes to try outside DeviceAllow (the
    CONTROL run's); RECORD: where the host keeps what the smoke saw of the sandbox; REQUIRED:
    the properties that must be in force there (``sglang_hardening_required``)."""
    prefix = host.print_prefix  # the progress callback runs outside the host's context

    def on_line(line: str) -> None:
        if line.startswith(smoke.PROGRESS):
            logger.info(f"{prefix}{line}")

    _, output = streamed.run_streamed(command(_control(control)), on_line)
    result = smoke.parse_result(output.stdout)
    rec = None
    if record and result and result.get("sandbox"):
        now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        rec = hardening.record(result["sandbox"], release, now)
        write_json_record(record, rec)
        for line in hardening.lines(host.name, hardening.summary(Hardening.from_json(rec))):
            logger.warning(f"{prefix}hardening: {line}")
    if result is None or not result.get("ok"):
        raise smoke.error_for(result, f"host {host.name}", output.stdout + "\n" + output.stderr)
    error = hardening.required_error(rec or {}, list(required), host.name)
    if error is not None:
        raise error
    logger.info(f"{prefix}release smoke: {smoke.summary(result)}")


@operation()
def release_smoke(unit_text: str, python: str, tool: str, steps: list[str], flags: list[str],
                  env: dict | None = None, devices: list[str] | None = None,
                  device_allow: tuple[str, ...] = (), record: str | None = None,
                  release: str = "", required: tuple[str, ...] = ()):
    """
    Prove the new release before it goes live: ``release_smoke.py`` (``import sglang``,
    sglang's own parser on the launch flags, the server's entry modules) run by the release
    venv's python under the unit's own sandbox, user and environment (``systemd-run`` with
    every non-lifecycle [Service] setting of the rendered unit), the GPUs hidden from it. A
    failure stops the host before ``current`` flips or the service restarts: the previous
    release keeps serving. With DEVICES it first touches the GPUs' doors under that sandbox
    (opens every node, cuInit + cuDeviceGetCount; no context, no GPU memory) and reads which
    hardening is really in force, kept in RECORD on the host (``core.hardening``).

    + unit_text: the rendered unit of the new release
    + python: the new release venv's python
    + tool: path of the shipped ``release_smoke.py`` on the host
    + steps: ``sglang_smoke``
    + flags: the launch flags, without ``--api-key`` (no argv ever names it)
    + env: ``sglang_smoke_env``, over the unit's environment
    + devices: the /dev/nvidia* nodes the pre-flight found (``hardening.smoke_devices``)
    + device_allow: the unit's DeviceAllow nodes
    + record: where the host keeps what the smoke saw (``Layout.hardening_record``)
    + release: the release id, for that record
    + required: ``sglang_hardening_required``: properties that must be in force (else it fails)

    **Example:**

    .. code:: python

        release_smoke(unit_text=unit, python=".../venv/bin/python",
                      tool="/opt/sglang/tools/release_smoke.py",
                      steps=["import", "flags", "entrypoints"], flags=["--tp-size", "8"],
                      devices=["/dev/nvidia0", "/dev/nvidiactl"],
                      device_allow=("/dev/nvidia0", "/dev/nvidiactl"),
                      record="/opt/sglang/hardening.json", release="3f2a...")
    """
    def command(outside: list[str]) -> str:
        argv = smoke.smoke_argv(python, tool, steps, flags, devices=devices or (),
                                device_allow=device_allow, outside=outside)
        return _sh(*smoke.systemd_run_argv(unit_text, argv,
                                           {"CUDA_VISIBLE_DEVICES": "", **(env or {})}))

    control = None
    if devices:
        control = _sh(*smoke.control_argv(python, tool, devices, device_allow))
    yield FunctionCommand(reported(_smoke_on_host),
                          (command, control, record, release, tuple(required)), {})
