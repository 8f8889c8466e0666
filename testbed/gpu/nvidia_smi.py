#!/usr/bin/python3
"""Stand-in for /usr/bin/nvidia-smi inside a testbed container (stdlib only, python3.11).

Answers in the formats of the real tool (see tests/fixtures/nvidia-smi/ for the real
samples it mimics): the default table, --query-gpu CSV, -L, --version, topo -m and
topo -p2p r|w|n|a|p.  Configuration comes from /etc/testbed/gpu.env (KEY=VALUE, re-read on
every call; path overridable with $TESTBED_GPU_ENV), device nodes are looked up under
$TESTBED_DEV_ROOT (default /dev).  See testbed/gpu/README.md.
"""

from __future__ import annotations

import os
import sys
import time

DEFAULTS = {
    "GPU_COUNT": "8",
    "GPU_NAME": "NVIDIA RTX PRO 6000 Blackwell Server Edition",
    "GPU_MEMORY_MIB": "97887",
    "GPU_CC": "12.0",
    "DRIVER_VERSION": "580.95.05",
    "CUDA_VERSION": "13.0",
    "SOCKETS": "2",
    "CPUS_PER_SOCKET": "32",
    "P2P_GBPS": "40",
    "SCENARIO": "healthy",
    "REPLAY_DIR": "",
    "HOSTNAME": "",
}

# Bus numbers of a typical 8-GPU PCIe server (one GPU per root port), as in the real sample.
BUS_NUMBERS = [0x01, 0x25, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1]

TOPO_LEGEND = """\
Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks
"""

P2P_LEGEND = """\
Legend:

  X    = Self
  OK   = Status Ok
  CNS  = Chipset not supported
  GNS  = GPU not supported
  TNS  = Topology not supported
  NS   = Not supported
  DR   = Disabled by regkey
  U    = Unknown
"""

NO_DRIVER = (
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running. \n"
)

REPLAY_FILES = {
    "table": "nvidia-smi.txt",
    "query": "query-gpu.csv",
    "topo-m": "topo-m.txt",
    "p2p-r": "topo-p2p-r.txt",
    "p2p-w": "topo-p2p-w.txt",
}


class Exit(Exception):
    def __init__(self, code: int, text: str = "") -> None:
        super().__init__(text)
        self.code = code
        self.text = text


# --------------------------------------------------------------------------- config


def load_env(path: str | None = None) -> dict[str, str]:
    """Read gpu.env: KEY=VALUE lines; '#' starts a comment (also after a value)."""
    cfg = dict(DEFAULTS)
    path = path or os.environ.get("TESTBED_GPU_ENV") or "/etc/testbed/gpu.env"
    try:
        with open(path, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        lines = []
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        if " #" in value or "\t#" in value:
            value = value.split("#", 1)[0]
        value = value.strip().strip('"').strip("'")
        cfg[key.strip()] = value
    return cfg


def _int(cfg: dict[str, str], key: str) -> int:
    try:
        return int(cfg.get(key) or DEFAULTS[key])
    except ValueError:
        return int(DEFAULTS[key])


def fnv1a64(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h ^= b
        h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def mix64(z: int) -> int:
    """splitmix64 finaliser (spreads FNV's similar outputs for similar inputs)."""
    m = 0xFFFFFFFFFFFFFFFF
    z = (z + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def gpu_uuid_bytes(host: str, index: int) -> bytes:
    """16 bytes, stable per (host, index); libcuda_stub.c computes the same bytes."""
    out = b""
    for half in (0, 1):
        h = mix64(fnv1a64(f"testbed-gpu:{host}:{index}:{half}".encode()))
        out += h.to_bytes(8, "big")
    return out


def format_uuid(raw: bytes) -> str:
    h = raw.hex()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def bus_number(index: int) -> int:
    return BUS_NUMBERS[index] if index < len(BUS_NUMBERS) else (0x01 + 0x10 * index) & 0xFF


class Gpu:
    def __init__(self, cfg: dict[str, str], index: int, count: int, host: str) -> None:
        self.index = index
        self.name = cfg["GPU_NAME"]
        self.mem = _int(cfg, "GPU_MEMORY_MIB")
        self.used = 0
        self.uuid = format_uuid(gpu_uuid_bytes(host, index))
        self.bus_id = f"00000000:{bus_number(index):02X}:00.0"
        sockets = max(1, _int(cfg, "SOCKETS"))
        self.socket = index * sockets // max(1, count)
        self.temp = 30 + index % 3
        self.power = 30.0 + (index * 37 % 100) / 100.0 + index % 4
        self.power_limit = 600.0


class Machine:
    def __init__(self, cfg: dict[str, str]) -> None:
        self.cfg = cfg
        self.scenario = cfg.get("SCENARIO", "healthy") or "healthy"
        count = _int(cfg, "GPU_COUNT")
        if self.scenario == "gpu-missing":
            count = max(0, count - 1)
        self.configured = _int(cfg, "GPU_COUNT")
        host = cfg.get("HOSTNAME") or os.uname().nodename
        # socket split is computed on the configured count: a missing GPU does not move others
        self.gpus = [Gpu(cfg, i, self.configured, host) for i in range(count)]
        self.sockets = max(1, _int(cfg, "SOCKETS"))
        self.cpus_per_socket = max(1, _int(cfg, "CPUS_PER_SOCKET"))

    def cpu_affinity(self, sock: int) -> str:
        c, s = self.cpus_per_socket, self.sockets
        return f"{sock * c}-{sock * c + c - 1},{(s + sock) * c}-{(s + sock) * c + c - 1}"


# --------------------------------------------------------------------------- outputs


def render_table(m: Machine) -> str:
    cfg = m.cfg
    drv, cuda = cfg["DRIVER_VERSION"], cfg["CUDA_VERSION"]
    bar = "+" + "-" * 89 + "+"
    sep = "+-----------------------------------------+------------------------+----------------------+"
    try:
        major = int(drv.split(".")[0])
    except ValueError:
        major = 580
    under_header = sep if major >= 580 else "|" + sep[1:-1] + "|"
    out = [
        time.asctime(),
        bar,
        f"| NVIDIA-SMI {drv:<23}Driver Version: {drv:<15}CUDA Version: {cuda:<9}|",
        under_header,
        "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |",
        "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |",
        "|                                         |                        |               MIG M. |",
        "|=========================================+========================+======================|",
    ]
    for g in m.gpus:
        name = g.name if len(g.name) <= 27 else g.name[:24] + "..."
        out.append(f"|{g.index:>4}  {name:<27}{'On':>6}  |   {g.bus_id} {'Off':>3} |{'0':>21} |")
        pwr = f"{int(g.power)}W"
        cap = f"{int(g.power_limit)}W"
        used = f"{g.used}MiB"
        total = f"{g.mem}MiB"
        out.append(
            f"| {'N/A':>3}   {str(g.temp) + 'C':>3}    {'P8':>2}{pwr:>16} / {cap:>5} "
            f"|{used:>11} / {total:>9} |{'0%':>8}{'Default':>13} |"
        )
        out.append(f"|{'':41}|{'':24}|{'Disabled':>21} |")
        out.append(sep)
    out += [
        " " * 89,
        bar,
        "| Processes:                                                                              |",
        "|  GPU   GI   CI        PID   Type   Process name                              GPU Memory |",
        "|        ID   ID                                                               Usage      |",
        "|=========================================================================================|",
        "|  No running processes found                                                             |",
        bar,
    ]
    return "\n".join(out) + "\n"


# field -> (header, unit, getter); unit is appended to values unless nounits
def _fields(m: Machine) -> dict[str, tuple[str, str, object]]:
    cfg = m.cfg
    return {
        "timestamp": ("timestamp", "", lambda g: time.strftime("%Y/%m/%d %H:%M:%S.000")),
        "driver_version": ("driver_version", "", lambda g: cfg["DRIVER_VERSION"]),
        "count": ("count", "", lambda g: str(len(m.gpus))),
        "name": ("name", "", lambda g: g.name),
        "gpu_name": ("name", "", lambda g: g.name),
        "serial": ("serial", "", lambda g: f"{1790000000000 + g.index}"),
        "gpu_serial": ("serial", "", lambda g: f"{1790000000000 + g.index}"),
        "uuid": ("uuid", "", lambda g: g.uuid),
        "gpu_uuid": ("uuid", "", lambda g: g.uuid),
        "pci.bus_id": ("pci.bus_id", "", lambda g: g.bus_id),
        "gpu_bus_id": ("pci.bus_id", "", lambda g: g.bus_id),
        "pci.domain": ("pci.domain", "", lambda g: "0x0000"),
        "pci.bus": ("pci.bus", "", lambda g: f"0x{bus_number(g.index):02X}"),
        "pci.device": ("pci.device", "", lambda g: "0x00"),
        "pci.device_id": ("pci.device_id", "", lambda g: "0x2BB510DE"),
        "index": ("index", "", lambda g: str(g.index)),
        "persistence_mode": ("persistence_mode", "", lambda g: "Enabled"),
        "compute_mode": ("compute_mode", "", lambda g: "Default"),
        "compute_cap": ("compute_cap", "", lambda g: cfg["GPU_CC"]),
        "pstate": ("pstate", "", lambda g: "P8"),
        "mig.mode.current": ("mig.mode.current", "", lambda g: "Disabled"),
        "mig.mode.pending": ("mig.mode.pending", "", lambda g: "Disabled"),
        "memory.total": ("memory.total", "MiB", lambda g: str(g.mem)),
        "memory.used": ("memory.used", "MiB", lambda g: str(g.used)),
        "memory.free": ("memory.free", "MiB", lambda g: str(g.mem - g.used)),
        "memory.reserved": ("memory.reserved", "MiB", lambda g: "0"),
        "utilization.gpu": ("utilization.gpu", "%", lambda g: "0"),
        "utilization.memory": ("utilization.memory", "%", lambda g: "0"),
        "temperature.gpu": ("temperature.gpu", "", lambda g: str(g.temp)),
        "power.draw": ("power.draw", "W", lambda g: f"{g.power:.2f}"),
        "power.limit": ("power.limit", "W", lambda g: f"{g.power_limit:.2f}"),
        "ecc.mode.current": ("ecc.mode.current", "", lambda g: "Enabled"),
        "ecc.errors.corrected.volatile.total": (
            "ecc.errors.corrected.volatile.total", "", lambda g: "0"),
        "ecc.errors.uncorrected.volatile.total": (
            "ecc.errors.uncorrected.volatile.total", "", lambda g: "0"),
        "pcie.link.gen.current": ("pcie.link.gen.current", "", lambda g: "5"),
        "pcie.link.gen.max": ("pcie.link.gen.max", "", lambda g: "5"),
        "pcie.link.width.current": ("pcie.link.width.current", "", lambda g: "16"),
        "pcie.link.width.max": ("pcie.link.width.max", "", lambda g: "16"),
        "fan.speed": ("fan.speed", "%", lambda g: "[N/A]"),
    }


def render_query(m: Machine, fields: list[str], fmt: list[str], gpus: list[Gpu]) -> str:
    table = _fields(m)
    for f in fields:
        if f not in table:
            raise Exit(2, f'Field "{f}" is not a valid field to query.\n\n')
    if "csv" not in fmt:
        raise Exit(2, "ERROR: Invalid format. Please run 'nvidia-smi -h'.\n")
    noheader, nounits = "noheader" in fmt, "nounits" in fmt
    lines = []
    if not noheader:
        heads = []
        for f in fields:
            head, unit, _ = table[f]
            heads.append(f"{head} [{unit}]" if unit else head)
        lines.append(", ".join(heads))
    for g in gpus:
        vals = []
        for f in fields:
            _, unit, get = table[f]
            v = get(g)  # type: ignore[operator]
            if unit and not nounits and not v.startswith("["):
                v = f"{v} %" if unit == "%" else f"{v} {unit}"
            vals.append(v)
        lines.append(", ".join(vals))
    return "\n".join(lines) + "\n"


def render_list(gpus: list[Gpu]) -> str:
    return "".join(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n" for g in gpus)


def render_version(m: Machine) -> str:
    drv = m.cfg["DRIVER_VERSION"]
    nvml = ".".join(drv.split(".")[:2])
    return (
        f"NVIDIA-SMI version  : {drv}\n"
        f"NVML version        : {nvml}\n"
        f"DRIVER version      : {drv}\n"
        f"CUDA Version        : {m.cfg['CUDA_VERSION']}\n"
    )


def render_topo_m(m: Machine) -> str:
    names = [f"GPU{g.index}" for g in m.gpus]
    lines = ["\t" + "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])]
    for g in m.gpus:
        cells = []
        for h in m.gpus:
            if h.index == g.index:
                cells.append(" X ")
            elif h.socket == g.socket:
                cells.append("NODE")
            else:
                cells.append("SYS")
        cells += [m.cpu_affinity(g.socket), str(g.socket), "", "N/A"]
        lines.append(f"GPU{g.index}\t" + "\t".join(cells))
    return "\n".join(lines) + "\n\n" + TOPO_LEGEND


def p2p_code(m: Machine, cap: str, a: Gpu, b: Gpu) -> str:
    if a.index == b.index:
        return "X"
    if cap in ("n", "a"):  # PCIe cards: no NVLink, no P2P atomics over PCIe
        return "NS"
    if m.scenario == "p2p-unsupported":
        return "NS"
    return "OK"


def render_p2p(m: Machine, cap: str) -> str:
    lines = [" \t" + "".join(f"GPU{g.index}\t" for g in m.gpus)]
    for a in m.gpus:
        lines.append(f" GPU{a.index}\t" + "".join(p2p_code(m, cap, a, b) + "\t" for b in m.gpus))
    return "\n".join(lines) + "\n\n" + P2P_LEGEND


# --------------------------------------------------------------------------- CLI


def _select(m: Machine, ids: str | None) -> list[Gpu]:
    if not m.gpus:
        raise Exit(6, "No devices were found\n")
    if ids is None:
        return m.gpus
    chosen = []
    for token in ids.split(","):
        token = token.strip()
        match = [
            g for g in m.gpus
            if token == str(g.index) or token.upper() == g.uuid.upper()
            or token.upper() in (g.bus_id, g.bus_id[4:])
        ]
        if not match:
            raise Exit(6, "No devices were found\n")
        chosen += [g for g in match if g not in chosen]
    return chosen


def _value(args: list[str], i: int, opt: str) -> tuple[str, int]:
    """Value of an option given as --opt=V or --opt V; returns (value, next index)."""
    a = args[i]
    if "=" in a:
        return a.split("=", 1)[1], i + 1
    if i + 1 >= len(args):
        raise Exit(2, f"ERROR: Option {opt} requires an argument. Please run 'nvidia-smi -h'.\n")
    return args[i + 1], i + 2


def parse(args: list[str]) -> dict:
    req: dict = {"mode": "table", "ids": None, "fields": None, "format": None, "cap": None}
    if args and args[0] == "topo":
        rest = args[1:]
        i = 0
        while i < len(rest):
            a = rest[i]
            if a in ("-m", "--matrix"):
                req["mode"] = "topo-m"
                i += 1
            elif a.startswith(("-p2p", "--p2pstatus")):
                base = "-p2p" if a.startswith("-p2p") else "--p2pstatus"
                tail = a[len(base):].lstrip("=")
                if tail:
                    cap, i = tail, i + 1
                elif i + 1 < len(rest):
                    cap, i = rest[i + 1], i + 2
                else:
                    raise Exit(2, "ERROR: Option -p2p requires an argument. Please run 'nvidia-smi -h'.\n")
                if cap not in ("r", "w", "n", "a", "p"):
                    raise Exit(2, f"ERROR: Invalid P2P capability \"{cap}\". Please run 'nvidia-smi topo -h'.\n")
                req["mode"], req["cap"] = "p2p", cap
            elif a.startswith(("-i", "--id")):
                req["ids"], i = _value(rest, i, a)
            else:
                raise Exit(2, f"ERROR: Option {a} is not recognized. Please run 'nvidia-smi topo -h'.\n")
        if req["mode"] == "table":
            raise Exit(2, "ERROR: Option topo requires a sub-option. Please run 'nvidia-smi topo -h'.\n")
        return req
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--query-gpu"):
            v, i = _value(args, i, "--query-gpu")
            req["mode"] = "query"
            req["fields"] = [f.strip() for f in v.split(",") if f.strip()]
        elif a.startswith("--format"):
            v, i = _value(args, i, "--format")
            req["format"] = [f.strip() for f in v.split(",")]
        elif a in ("-i", "--id") or a.startswith(("--id=", "-i=")):
            req["ids"], i = _value(args, i, a)
        elif a.startswith("-i") and len(a) > 2:
            req["ids"], i = a[2:], i + 1
        elif a in ("-L", "--list-gpus"):
            req["mode"], i = "list", i + 1
        elif a in ("--version",):
            req["mode"], i = "version", i + 1
        else:
            raise Exit(2, f"ERROR: Option {a} is not recognized. Please run 'nvidia-smi -h'.\n")
    if req["mode"] == "query" and not req["format"]:
        raise Exit(2, "ERROR: Option --format must be specified with --query-gpu. "
                      "Please run 'nvidia-smi -h'.\n")
    return req


def _replay_key(req: dict) -> str | None:
    if req["mode"] in ("table", "query", "topo-m"):
        return req["mode"]
    if req["mode"] == "p2p" and req["cap"] in ("r", "w"):
        return f"p2p-{req['cap']}"
    return None


def run(args: list[str]) -> tuple[int, str]:
    cfg = load_env()
    try:
        req = parse(args)
        replay = cfg.get("REPLAY_DIR", "")
        key = _replay_key(req)
        if replay and key:
            path = os.path.join(replay, REPLAY_FILES[key])
            if os.path.isfile(path):
                with open(path, encoding="utf-8", newline="") as fh:
                    return 0, fh.read()
        m = Machine(cfg)
        if m.scenario == "driver-mismatch":
            nvml = ".".join(cfg["DRIVER_VERSION"].split(".")[:2])
            return 18, ("Failed to initialize NVML: Driver/library version mismatch\n"
                        f"NVML library version: {nvml}\n")
        dev = os.environ.get("TESTBED_DEV_ROOT") or "/dev"
        if not os.path.exists(os.path.join(dev, "nvidiactl")):
            return 9, NO_DRIVER
        if _open_denied(os.path.join(dev, "nvidiactl")):
            # the device cgroup refuses the node: what the real nvidia-smi prints then
            return 255, "Failed to initialize NVML: Unknown Error\n"
        if req["mode"] == "version":
            return 0, render_version(m)
        gpus = _select(m, req["ids"])
        if req["mode"] == "query":
            return 0, render_query(m, req["fields"], req["format"], gpus)
        if req["mode"] == "list":
            return 0, render_list(gpus)
        if req["mode"] == "topo-m":
            return 0, render_topo_m(m)
        if req["mode"] == "p2p":
            return 0, render_p2p(m, req["cap"])
        sub = Machine(cfg)
        sub.gpus = gpus
        return 0, render_table(sub)
    except Exit as e:
        return e.code, e.text


def _open_denied(path: str) -> bool:
    """The open is refused (EPERM/EACCES: the container's device cgroup). The stand-in nodes
    have no driver behind them: a permitted open answers ENXIO."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))
    except PermissionError:
        return True
    except OSError:
        return False
    return False


def main() -> int:
    code, text = run(sys.argv[1:])
    sys.stdout.write(text)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
