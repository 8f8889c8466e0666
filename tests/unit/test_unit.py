"""The systemd unit and the secrets file (sglang_deploy.core.unit): deterministic, quoted, safe."""

import pytest

from sglang_deploy.core.unit import UnitSpec, device_allow, render_secrets_env, render_unit, systemd_quote


def spec(**over):
    base = dict(
        release_id="abc123", sglang_version="0.5.12.post1", patch_state="applied",
        served_model_name="glm-5", user="sglang", home="/var/lib/sglang",
        secrets_file="/etc/sglang/secrets.env",
        environment=(("HOME", "/var/lib/sglang"), ("X", "a b%c$d")),
        argv=("/opt/sglang/releases/abc123/venv/bin/python", "/opt/sglang/tools/launch.py", "-m",
              "sglang.launch_server", "--tp-size", "8", "--served-model-name", "glm 5"),
        stop_timeout_s=120, restart_sec=30, writable_paths=("/var/cache/sglang", "/var/lib/sglang"),
        device_allow=device_allow(2),
    )
    base.update(over)
    return UnitSpec(**base)


def test_render_is_deterministic_and_complete():
    a, b = render_unit(spec()), render_unit(spec())
    assert a == b
    for needle in ("User=sglang", "EnvironmentFile=/etc/sglang/secrets.env", "KillMode=mixed",
                   "TimeoutStopSec=120", "Restart=always", "NoNewPrivileges=yes",
                   "PrivateTmp=yes", "ProtectSystem=strict", "DevicePolicy=closed",
                   "DeviceAllow=/dev/nvidia-uvm rw", "DeviceAllow=/dev/nvidia1 rw",
                   'Environment="X=a b%%c$$d"', '"glm 5"'):
        assert needle in a, needle


def test_success_exit_status_follows_the_version():
    assert "SuccessExitStatus=9 SIGKILL" in render_unit(spec())
    assert "SuccessExitStatus" not in render_unit(spec(sglang_version="0.5.19"))


def test_no_secret_can_reach_the_unit():
    text = render_unit(spec())
    assert "--api-key" not in text


@pytest.mark.parametrize("word, quoted", [
    ("plain", "plain"), ("a b", '"a b"'), ("%h", '"%%h"'), ("$HOME", '"$$HOME"'), ('q"x', '"q\\"x"'),
])
def test_systemd_quote(word, quoted):
    assert systemd_quote(word) == quoted


def test_newlines_never_reach_a_unit():
    with pytest.raises(ValueError):
        systemd_quote("a\nb")


def test_secrets_env_escapes_shell_metacharacters():
    body = render_secrets_env({"SGLANG_API_KEY": 'a"b\\c$d`e\'f g;|&'})
    assert 'SGLANG_API_KEY="a\\"b\\\\c\\$d\\`e\'f g;|&"' in body
    with pytest.raises(ValueError):
        render_secrets_env({"K": "a\nb"})


def test_unit_is_hardened_as_far_as_gpu_access_allows():
    text = render_unit(spec())
    for needle in ("ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes",
                   "NoNewPrivileges=yes", "CapabilityBoundingSet=\n", "ProtectProc=invisible",
                   "RemoveIPC=yes", "ProtectKernelTunables=yes", "ProtectKernelModules=yes",
                   "ProtectKernelLogs=yes", "ProtectClock=yes", "ProtectControlGroups=yes",
                   "RestrictNamespaces=yes", "LockPersonality=yes", "RestrictSUIDSGID=yes",
                   "SystemCallFilter=@system-service pidfd_getfd\n", "SystemCallErrorNumber=EPERM",
                   "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK", "UMask=0077",
                   "ReadWritePaths=/var/cache/sglang /var/lib/sglang\n", "DevicePolicy=closed"):
        assert needle in text, needle
    deny = next(x for x in text.splitlines() if x.startswith("SystemCallFilter=~"))
    assert {"@privileged", "@mount", "@module", "@raw-io", "@reboot", "@swap", "@clock"} <= set(deny[18:].split())
    # impossible with GPUs (see the template's comment): never set
    for absent in ("PrivateDevices=yes", "MemoryDenyWriteExecute=yes", "PrivateNetwork=yes",
                   "ProcSubset=pid"):
        assert absent not in text.splitlines(), absent
    # only the NVIDIA nodes: control, one per GPU, uvm
    assert [x for x in text.splitlines() if x.startswith("DeviceAllow=")] == [
        "DeviceAllow=/dev/nvidiactl rw", "DeviceAllow=/dev/nvidia0 rw", "DeviceAllow=/dev/nvidia1 rw",
        "DeviceAllow=/dev/nvidia-uvm rw", "DeviceAllow=/dev/nvidia-uvm-tools rw"]
