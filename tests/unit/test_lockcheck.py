"""The release proof without a GPU: lock directives and header, the testbed lock derived from
production, the smoke's verdicts (real smoke outputs in tests/fixtures/smoke, made with the
production lock as it was at 48a8d87 and as fixed) and the unit's sandbox as systemd-run
properties."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest

from sglang_deploy.core import lockfile, smoke
from sglang_deploy.core.unit import UnitSpec, device_allow, render_unit
from sglang_deploy.remote import release_smoke

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests/fixtures/smoke"


def _fixture(name: str) -> dict:
    return json.loads((FIXTURES / name).read_text())


def _pins(path: Path) -> dict[str, str]:
    return {p.name: p.version for p in lockfile.parse_lock(path.read_text(), str(path))}


# ------------------------------------------------------------------ lock inputs and headers

def test_input_directives_are_read_from_comment_lines():
    text = ("sglang==0.5.12.post1\n# why kernels is bounded\n# constraint: kernels<0.15\n"
            "# lock-options: --no-deps --prerelease allow\n# versions-from: prod.txt\n"
            "# a plain comment: with a colon\n")
    d = lockfile.parse_input(text)
    assert d.constraints == ("kernels<0.15",)
    assert d.options == ("--no-deps", "--prerelease", "allow")
    assert d.versions_from == ("prod.txt",)


def test_header_records_target_and_bounds_and_reads_back():
    lines = lockfile.header_lines("x86_64-manylinux_2_36", "3.11", constraints=["kernels<0.15"],
                                  constraint_files=["extra.txt"], versions_from=["locks/p.txt"],
                                  options=["--no-deps"])
    text = lockfile.with_header("# made by uv\n#    cmd\nsglang==1 \\\n    --hash=sha256:"
                                + "a" * 64 + "\n", lines)
    h = lockfile.parse_header(text)
    assert (h.platform, h.python, h.partial) == ("x86_64-manylinux_2_36", "3.11", True)
    assert h.bounds == ("constraint kernels<0.15", "constraints file extra.txt",
                        "versions of locks/p.txt")
    # a second lock run replaces the lines instead of stacking them
    again = lockfile.with_header(text, lines[:1])
    assert again.count("# sglang-deploy lock: ") == 1 and "# bounded by:" not in again
    assert again.startswith("# made by uv\n#    cmd\n# sglang-deploy lock: ")


def test_production_lock_is_bounded_for_kernels_and_says_so():
    text = (ROOT / "locks/glm5-blackwell.txt").read_text()
    assert "constraint kernels<0.15" in lockfile.parse_header(text).bounds
    kernels = _pins(ROOT / "locks/glm5-blackwell.txt")["kernels"]
    assert tuple(int(x) for x in kernels.split(".")[:2]) < (0, 15), kernels
    src = lockfile.parse_input((ROOT / "locks/glm5-blackwell.in").read_text())
    assert "kernels<0.15" in src.constraints


def test_testbed_lock_is_derived_from_production_and_agrees_with_it():
    prod = _pins(ROOT / "locks/glm5-blackwell.txt")
    testbed = _pins(ROOT / "locks/testbed.txt")
    assert "glm5-blackwell.txt" in lockfile.parse_input(
        (ROOT / "locks/testbed.in").read_text()).versions_from
    assert lockfile.parse_header((ROOT / "locks/testbed.txt").read_text()).bounds == (
        "versions of locks/glm5-blackwell.txt",)
    outside = sorted(n for n in testbed if n not in prod)
    differ = {n: (v, prod[n]) for n, v in testbed.items() if n in prod and prod[n] != v}
    assert not outside, f"testbed packages the production lock lacks: {outside}"
    assert not differ, f"testbed versions that differ from production: {differ}"


def test_pins_as_constraints_drops_hashes():
    text = "a==1.0 \\\n    --hash=sha256:" + "b" * 64 + "\nc-d==2 --hash=sha256:" + "e" * 64 + "\n"
    assert lockfile.pins_as_constraints(text) == "a==1.0\nc-d==2\n"


# ------------------------------------------------------------------ the smoke's verdicts

def test_import_failure_names_the_error_and_the_packages_that_meet_there():
    result = _fixture("kernels-0.17.2-import.json")
    assert smoke.parse_result("noise\n" + json.dumps(result) + "\n") == result
    err = smoke.error_for(result, "lock locks/glm5-blackwell.txt")
    text = str(err)
    assert "`import sglang` works" in text
    assert "ValueError: Either a revision or a version must be specified." in text
    assert "kernels/layer/layer.py:117" in text
    assert "kernels 0.17.2, required by sglang 0.5.12.post1 without a bound" in text
    assert "transformers 5.6.0, required by" in text and "sglang 0.5.12.post1 ==5.6.0" in text
    assert "# constraint:" in err.fix and "sglang-deploy lock" in err.fix


def test_flag_typo_gets_sglangs_own_argparse_error_without_the_usage_block():
    err = smoke.error_for(_fixture("flag-typo.json"), "host gpu-1")
    assert err.found == "sglang serve: error: unrecognized arguments: --tp-sise 3"
    assert "sglang_flags" in err.fix


def test_passed_smoke_without_gpu_summarises_each_step():
    result = _fixture("passed-no-gpu.json")
    assert result["ok"]
    line = smoke.summary(result)
    assert line.startswith("sglang 0.5.12.post1: import: ok, flags: ok")
    assert "stopped at the absent CUDA driver" in line


def test_no_result_reports_the_last_output():
    err = smoke.error_for(None, "host gpu-1", "Traceback\nOSError: systemd-run failed\n")
    assert "OSError: systemd-run failed" in err.found


def test_smoke_argv_puts_flags_after_the_separator():
    assert smoke.smoke_argv("/v/python", "/t/s.py", ["import", "flags"], ["--tp-size", "8"],
                            ["m.x"]) == ["/v/python", "/t/s.py", "--steps", "import,flags",
                                         "--module", "m.x", "--", "--tp-size", "8"]


# ------------------------------------------------------------------ the unit's sandbox

def _unit() -> str:
    return render_unit(UnitSpec(
        release_id="r1", sglang_version="0.5.12.post1", patch_state="applied",
        served_model_name="glm-5", user="sglang", home="/var/lib/sglang",
        secrets_file="/etc/sglang/secrets.env",
        environment=(("HOME", "/var/lib/sglang"), ("SGLANG_CACHE_DIR", "/var/cache/sglang")),
        argv=("/opt/sglang/releases/r1/venv/bin/python", "-m", "sglang.launch_server"),
        stop_timeout_s=120, restart_sec=30,
        writable_paths=("/var/cache/sglang", "/var/lib/sglang"), device_allow=device_allow(8)))


def test_sandbox_properties_are_every_non_lifecycle_setting_of_the_rendered_unit():
    unit = _unit()
    props = smoke.sandbox_properties(unit)
    keys = [p.split("=", 1)[0] for p in props]
    for k in ("User", "Group", "NoNewPrivileges", "ProtectSystem", "ProtectHome",
              "ReadWritePaths", "SystemCallFilter", "RestrictAddressFamilies", "DevicePolicy",
              "DeviceAllow", "CapabilityBoundingSet", "UMask", "Environment", "LimitMEMLOCK"):
        assert k in keys, k
    for k in ("ExecStart", "Restart", "KillMode", "TimeoutStopSec", "Type"):
        assert k not in keys, k
    assert keys.count("SystemCallFilter") == 2  # the allow list and the ~deny list
    # every [Service] line of the unit is either passed or a lifecycle setting
    service = smoke.unit_service_settings(unit)
    assert len(props) + sum(k in smoke.LIFECYCLE for k, _ in service) == len(service)


def test_systemd_run_argv_waits_pipes_and_makes_the_secrets_file_optional():
    argv = smoke.systemd_run_argv(_unit(), ["/v/python", "s.py"], {"CUDA_VISIBLE_DEVICES": ""})
    assert argv[:5] == ["systemd-run", "--quiet", "--wait", "--pipe", "--collect"]
    assert "EnvironmentFile=-/etc/sglang/secrets.env" in argv
    assert argv[-3:] == ["--", "/v/python", "s.py"]
    # the smoke's own environment comes after the unit's, so it wins
    assert argv.index("Environment=CUDA_VISIBLE_DEVICES=") > argv.index("User=sglang")


# ------------------------------------------------------------------ the smoke script itself

def _drop(name: str) -> None:
    for mod in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[mod]


@pytest.fixture
def fake_sglang(tmp_path, monkeypatch):
    """A throw-away ``sglang`` package in TMP_PATH, gone from sys.modules afterwards (other
    modules' tests look the real wheel's files up by the name)."""
    def make(body: str) -> Path:
        pkg = tmp_path / "sglang"
        pkg.mkdir()
        (pkg / "__init__.py").write_text(body)
        monkeypatch.syspath_prepend(str(tmp_path))
        _drop("sglang")
        return pkg

    yield make
    _drop("sglang")


def test_script_reports_an_import_failure_as_step_import(fake_sglang):
    fake_sglang("raise ValueError('broken on import')\n")
    result = release_smoke.run(["import", "flags"], [], [])
    assert not result["ok"]
    assert result["error"]["step"] == "import"
    assert result["error"]["message"] == "broken on import"
    assert [s["status"] for s in result["steps"]] == ["failed"]


def test_script_tolerates_only_the_absent_driver_library(fake_sglang, monkeypatch):
    pkg = fake_sglang("__version__ = '9.9'\n")
    (pkg / "needs_driver.py").write_text(
        f"raise ImportError({release_smoke.LIBCUDA_ABSENT!r})\n")
    (pkg / "other_error.py").write_text(
        "raise ImportError('libcudart.so.13: cannot open shared object file')\n")
    monkeypatch.setattr(release_smoke, "libcuda_loads", lambda: False)
    ok = release_smoke.run(["import", "entrypoints"], [], ["sglang.needs_driver"])
    assert ok["ok"] and ok["steps"][-1]["status"] == "driver-absent"
    bad = release_smoke.run(["import", "entrypoints"], [], ["sglang.other_error"])
    assert not bad["ok"] and bad["error"]["step"] == "import sglang.other_error"
    # where the driver library loads, its name in an error is a real failure
    monkeypatch.setattr(release_smoke, "libcuda_loads", lambda: True)
    for mod in ("sglang.needs_driver",):
        sys.modules.pop(mod, None)
    real = release_smoke.run(["import", "entrypoints"], [], ["sglang.needs_driver"])
    assert not real["ok"]


def test_no_accelerator_is_recognised_only_from_get_device():
    def get_device():
        raise RuntimeError(release_smoke.NO_ACCELERATOR)

    def elsewhere():
        raise RuntimeError(release_smoke.NO_ACCELERATOR)

    for fn, expected in ((get_device, True), (elsewhere, False)):
        try:
            fn()
        except RuntimeError as exc:
            assert release_smoke.no_accelerator(exc) is expected
    assert not release_smoke.no_accelerator(RuntimeError("No accelerator"))


@pytest.mark.parametrize("steps", ["import,bogus", "nope"])
def test_script_refuses_unknown_steps(steps, capsys):
    with pytest.raises(SystemExit) as exc:
        release_smoke.main(["--steps", steps])
    assert exc.value.code == 2
    assert "unknown step" in capsys.readouterr().err


def test_packages_of_maps_frames_to_installed_distributions():
    import packaging.version  # a real installed distribution in this venv

    try:
        packaging.version.Version("not a version")
    except packaging.version.InvalidVersion as exc:
        pkgs = release_smoke.packages_of(exc)
    names = [p["name"] for p in pkgs]
    assert "packaging" in names
    assert isinstance(types.SimpleNamespace(**pkgs[0]).version, str)


# ------------------------------------------------------------------ whose flags are smoked

def _project(tmp_path: Path) -> Path:
    (tmp_path / "group_data").mkdir()
    (tmp_path / "group_data" / "all.py").write_text(
        "sglang_model_path = '/srv/models/m'\nsglang_lock = 'locks/a.txt'\n"
        "sglang_flags = {'tp-size': 8}\n")
    (tmp_path / "locks").mkdir()
    text = (ROOT / "locks/glm5-blackwell.txt").read_text()
    for name in ("a.txt", "b.txt"):
        (tmp_path / "locks" / name).write_text(text)
    (tmp_path / "inv.py").write_text(
        "hosts = [('h1', {}), ('h2', {'sglang_flags': {'tp-size': 4}}),\n"
        "         ('h3', {'sglang_lock': 'locks/b.txt'})]\n")
    return tmp_path


def test_the_smoke_parses_the_flags_of_the_hosts_that_use_the_lock(tmp_path):
    from sglang_deploy.controller import releasecheck

    cwd = _project(tmp_path)
    sets = releasecheck.flag_sets(cwd / "locks/a.txt", "inv.py", str(cwd))
    assert sorted(fs.hosts for fs in sets) == [["h1"], ["h2"]]  # h3 uses another lock
    assert {tuple(fs.argv[fs.argv.index("--tp-size"):][:2]) for fs in sets} == {
        ("--tp-size", "8"), ("--tp-size", "4")}
    assert all("--api-key" not in fs.argv for fs in sets)
    # without --inventory: group_data/ alone
    alone = releasecheck.flag_sets(cwd / "locks/a.txt", None, str(cwd))
    assert [fs.hosts for fs in alone] == [["group_data"]]


def test_a_lock_no_host_uses_yet_is_smoked_with_every_hosts_flags(tmp_path, capsys):
    from sglang_deploy.controller import releasecheck

    cwd = _project(tmp_path)
    (cwd / "locks" / "new.txt").write_text((cwd / "locks" / "a.txt").read_text())
    sets = releasecheck.flag_sets(cwd / "locks/new.txt", "inv.py", str(cwd))
    assert sorted(h for fs in sets for h in fs.hosts) == ["h1", "h2", "h3"]
    assert "no host of inv.py uses" in capsys.readouterr().err
