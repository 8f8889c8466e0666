"""Testbed networking: one bridge in the root namespace, one netns + veth per host.

    controller (root netns)  tbbr0 10.213.0.1/24
        |-- v<name> (veth, bridge port)  <->  eth0 in netns <name>: 10.213.0.(10+i)/24

The containers have no route to anything but the bridge (no NAT): like an air-gapped
site, they get what they install from the read-only wheelhouse bind mount.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(["ip", *args], check=False, capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)} failed: {r.stderr.strip()}")
    return r


def link_exists(name: str) -> bool:
    return _ip("link", "show", "dev", name, check=False).returncode == 0


def ensure_bridge(bridge: str, gateway_cidr: str) -> None:
    if not link_exists(bridge):
        _ip("link", "add", bridge, "type", "bridge")
    _ip("addr", "replace", gateway_cidr, "dev", bridge)
    _ip("link", "set", bridge, "up")


def delete_bridge(bridge: str) -> None:
    _ip("link", "del", bridge, check=False)


def veth_name(host: str) -> str:
    name = f"v{host}"
    if len(name) > 15:
        raise ValueError(f"host name {host!r} too long for an interface name (max 14 chars)")
    return name


def host_mac(address: str) -> str:
    """A fixed, locally administered MAC per address: a re-created (wiped) host keeps its MAC,
    so the controller's neighbour (ARP) entry stays right and reconnects are immediate."""
    a, b, c, d = (int(x) for x in address.split("."))
    return f"02:74:{a:02x}:{b:02x}:{c:02x}:{d:02x}"


def ensure_host_net(host: str, bridge: str, address_cidr: str, gateway: str) -> None:
    """netns HOST with eth0 = ADDRESS, its peer v<HOST> on BRIDGE. Idempotent."""
    address = address_cidr.split("/")[0]
    veth = veth_name(host)
    if not Path("/run/netns", host).exists():
        _ip("netns", "add", host)
    if not link_exists(veth):
        _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", host)
    _ip("link", "set", veth, "master", bridge)
    _ip("link", "set", veth, "up")
    _ip("-n", host, "addr", "replace", address_cidr, "dev", "eth0")
    _ip("-n", host, "link", "set", "eth0", "address", host_mac(address))
    _ip("neigh", "flush", "to", address, "dev", bridge, check=False)
    _ip("-n", host, "link", "set", "lo", "up")
    _ip("-n", host, "link", "set", "eth0", "up")
    _ip("-n", host, "route", "replace", "default", "via", gateway)


def delete_host_net(host: str) -> None:
    """Drop v<HOST> and the netns HOST (either may be gone already)."""
    _ip("link", "del", veth_name(host), check=False)
    _ip("netns", "del", host, check=False)


# --------------------------------------------------------------------------- port blocks
#: the blackhole rules of `python -m testbed block` sit before the `local` table, which moves
#: from priority 0 (the kernel's default) to LOCAL_PREF in the host's own namespace
BLOCK_PREF, LOCAL_PREF = "5", "10"


def block_port(netns: str, port: str, dev: str = "eth0") -> None:
    """Drop TCP packets to PORT ("N" or a range "LOW-HIGH") arriving on DEV in NETNS, as a firewall's DROP rule does: the
    other hosts' connects to that port time out (no refusal), the host itself still reaches
    it over loopback. Policy routing (iproute2 only: the containers and this machine have no
    nftables/iptables): a blackhole rule matched before the `local` table. Idempotent."""
    rules = _ip("-n", netns, "rule", "show").stdout
    if f"{LOCAL_PREF}:\tfrom all lookup local" not in rules:
        _ip("-n", netns, "rule", "add", "pref", LOCAL_PREF, "lookup", "local")
    _ip("-n", netns, "rule", "del", "pref", "0", "lookup", "local", check=False)
    port = str(port)
    if not re.fullmatch(r"\d+(-\d+)?", port):
        raise ValueError(f"a port or a range LOW-HIGH, not {port!r}")
    if port not in blocked_ports(netns):
        _ip("-n", netns, "rule", "add", "pref", BLOCK_PREF, "iif", dev, "ipproto", "tcp",
            "dport", port, "blackhole")


def unblock_port(netns: str, port: str, dev: str = "eth0") -> None:
    """Undo block_port for PORT (the moved `local` rule stays: same lookups)."""
    port = str(port)
    while port in blocked_ports(netns):
        _ip("-n", netns, "rule", "del", "pref", BLOCK_PREF, "iif", dev, "ipproto", "tcp",
            "dport", str(port), "blackhole")


def blocked_ports(netns: str) -> list[str]:
    """The ports and ranges block_port dropped in NETNS."""
    out = _ip("-n", netns, "rule", "show", check=False).stdout
    return re.findall(r"ipproto tcp dport (\d+(?:-\d+)?) blackhole", out)
