#!/usr/bin/python3
"""Stand-in for /usr/bin/nvidia-smi inside a testbed container (stdlib only, python3.11).

Answers in the formats of the real tool (see tests/fixtures/nvidia-smi/ for the real
samples it mimics): the default table, --query-gpu CSV, -L, --version, topo -m and
topo -p2p r|w|n|a|p.  Configuration comes from /etc/testbed/gpu.env (KEY=VALUE, re-read on
every call; path overridable with $TESTBED_GPU_ENV), device nodes are looked up under
$TESTBED_DEV_ROOT (default /dev).  See testbed/gpu/README.md.
"""

from __future__ import annotations

import hashlib
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

# request -> file printed verbatim from REPLAY_DIR when it exists there
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


def load_env() -> dict[str, str]:
    """Read gpu.env: KEY=VALUE lines; '#' starts a comment (also after a value)."""
    cfg = dict(DEFAULTS)
    path = os.environ.get("TESTBED_GPU_ENV") or "/etc/testbed/gpu.env"
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


def gpu_uuid(host: str, index: int) -> str:
    """Stable per (host, index)."""
    h = hashlib.sha256(f"testbed-gpu:{host}:{index}".encode()).hexdigest()
    return f"GPU-{h[0:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def bus_number(index: int) -> int:
    return BUS_NUMBERS[index] if index < len(BUS_NUMBERS) else (0x01 + 0x10 * index) & 0xFF


class Gpu:
    """One simulated GPU (its readings are fixed per index)."""

    def __init__(self, index: int, name: str, mem: int, host: str, socket: int) -> None:
        self.index, self.name, self.mem, self.socket = index, name, mem, socket
        self.uuid = gpu_uuid(host, index)
        self.bus_id = f"00000000:{bus_number(index):02X}:00.0"
        self.temp = 30 + index % 3
        self.power = 30.0 + (index * 37 % 100) / 100.0 + index % 4


class Machine:
    def __init__(self, cfg: dict[str, str]) -> None:
        self.cfg = cfg
        self.scenario = cfg["SCENARIO"] or "healthy"
        configured = _int(cfg, "GPU_COUNT")
        count = max(0, configured - 1) if self.scenario == "gpu-missing" else configured
        host = cfg["HOSTNAME"] or os.uname().nodename
        self.sockets = max(1, _int(cfg, "SOCKETS"))
        self.cpus_per_socket = max(1, _int(cfg, "CPUS_PER_SOCKET"))
        mem = _int(cfg, "GPU_MEMORY_MIB")
        # the socket split uses the configured count: a missing GPU does not move the others
        self.gpus = [Gpu(i, cfg["GPU_NAME"], mem, host, i * self.sockets // max(1, configured))
                     for i in range(count)]
        # gpu-lost: the last GPU's node is there, NVML cannot get its handle
        self.lost = [self.gpus.pop()] if self.scenario == "gpu-lost" and self.gpus else []

    def cpu_affinity(self, sock: int) -> str:
        c, s = self.cpus_per_socket, self.sockets
        return f"{sock * c}-{sock * c + c - 1},{(s + sock) * c}-{(s + sock) * c + c - 1}"


# --------------------------------------------------------------------------- outputs


def render_table(m: Machine, gpus: list[Gpu]) -> str:
    drv, cuda = m.cfg["DRIVER_VERSION"], m.cfg["CUDA_VERSION"]
    bar = "+" + "-" * 89 + "+"
    sep = "+-----------------------------------------+------------------------+----------------------+"
    major = drv.split(".")[0]
    # drivers >= 580 print '+---' under the version line, older ones '|---'
    under_header = sep if not major.isdigit() or int(major) >= 580 else "|" + sep[1:-1] + "|"
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
    for g in gpus:
        name = g.name if len(g.name) <= 27 else g.name[:24] + "..."
        pwr, total = f"{int(g.power)}W", f"{g.mem}MiB"
        ecc = field_values(m, g)["ecc.errors.uncorrected.volatile.total"]
        if m.scenario == "smi-err" and g.index == FAULTY_GPU:
            pwr, ecc = "ERR!", "ERR!"  # the table's word for a reading NVML failed
        out += [
            f"|{g.index:>4}  {name:<27}{'On':>6}  |   {g.bus_id} Off |{ecc:>21} |",
            (f"| N/A   {str(g.temp) + 'C':>3}    P8{pwr:>16} /  600W "
             f"|{'0MiB':>11} / {total:>9} |{'0%':>8}{'Default':>13} |"),
            f"|{'':41}|{'':24}|{'Disabled':>21} |",
            sep,
        ]
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


# --query-gpu: fields with the same value on every GPU, fields whose values carry a unit
# (unless nounits), and the other names nvidia-smi accepts for a field
CONSTANT_FIELDS = {
    "pci.domain": "0x0000", "pci.device": "0x00", "pci.device_id": "0x2BB510DE",
    "persistence_mode": "Enabled", "compute_mode": "Default", "pstate": "P8",
    "mig.mode.current": "Disabled", "mig.mode.pending": "Disabled",
    "memory.used": "0", "memory.reserved": "0", "utilization.gpu": "0", "utilization.memory": "0",
    "power.limit": "600.00", "ecc.mode.current": "Enabled",
    "ecc.errors.corrected.volatile.total": "0", "ecc.errors.uncorrected.volatile.total": "0",
    "pcie.link.gen.current": "5", "pcie.link.gen.max": "5",
    "pcie.link.width.current": "16", "pcie.link.width.max": "16", "fan.speed": "[N/A]",
    # health (the values of a healthy datacenter GPU with row remapping, as the real H100/H200
    # captures of driver 590 print them: tests/fixtures/gpuhealth/)
    "ecc.errors.corrected.aggregate.total": "0", "ecc.errors.uncorrected.aggregate.total": "0",
    "retired_pages.pending": "[N/A]", "remapped_rows.correctable": "0",
    "remapped_rows.uncorrectable": "0", "remapped_rows.pending": "No",
    "remapped_rows.failure": "No", "gpu_recovery_action": "None",
}
#: the GPU the health fault scenarios hit (ecc-uncorrectable, remap-pending, smi-err)
FAULTY_GPU = 1
#: scenario -> the faulty GPU's field values (health fault profiles)
FAULTS = {
    "ecc-uncorrectable": {"ecc.errors.uncorrected.volatile.total": "2",
                          "ecc.errors.uncorrected.aggregate.total": "2"},
    "remap-pending": {"remapped_rows.uncorrectable": "1", "remapped_rows.pending": "Yes"},
    "smi-err": {"power.draw": "[Unknown Error]",
                "ecc.errors.uncorrected.volatile.total": "[Unknown Error]"},
}
#: fields only the GPU health read asks for: health-query-error fails a query naming one
HEALTH_ONLY = ("ecc.errors.uncorrected.aggregate.total", "remapped_rows.pending",
               "gpu_recovery_action")
#: the text and exit status of nvidia-smi when it cannot get a lost GPU's handle (real text:
#: tests/fixtures/gpuhealth/query_lost_gpu0_616.92.txt; 15 = "GPU is lost", nvidia-smi(1))
LOST_EXIT = 15


def lost_line(g: Gpu) -> str:
    return (f"Unable to determine the device handle for GPU{g.index}: {g.bus_id[4:]}: "
            "GPU is lost.  Reboot the system to recover this GPU\n")


UNITS = {"memory.total": "MiB", "memory.used": "MiB", "memory.free": "MiB",
         "memory.reserved": "MiB", "utilization.gpu": "%", "utilization.memory": "%",
         "power.draw": "W", "power.limit": "W", "fan.speed": "%"}
ALIASES = {"gpu_name": "name", "gpu_serial": "serial", "gpu_uuid": "uuid",
           "gpu_bus_id": "pci.bus_id"}


def field_values(m: Machine, g: Gpu) -> dict[str, str]:
    """Every --query-gpu field of GPU g, by its header name (a fault scenario's values on
    FAULTY_GPU)."""
    faults = FAULTS.get(m.scenario, {}) if g.index == FAULTY_GPU else {}
    return {
        **CONSTANT_FIELDS,
        "timestamp": time.strftime("%Y/%m/%d %H:%M:%S.000"),
        "driver_version": m.cfg["DRIVER_VERSION"],
        "count": str(len(m.gpus)),
        "index": str(g.index),
        "name": g.name,
        "serial": str(1790000000000 + g.index),
        "uuid": g.uuid,
        "pci.bus_id": g.bus_id,
        "pci.bus": f"0x{bus_number(g.index):02X}",
        "compute_cap": m.cfg["GPU_CC"],
        "memory.total": str(g.mem),
        "memory.free": str(g.mem),
        "temperature.gpu": str(g.temp),
        "power.draw": f"{g.power:.2f}",
        **faults,
    }


def render_query(m: Machine, fields: list[str], fmt: list[str], gpus: list[Gpu]) -> str:
    heads = [ALIASES.get(f, f) for f in fields]
    rows = [field_values(m, g) for g in gpus]
    for f, head in zip(fields, heads):
        if head not in rows[0]:
            raise Exit(2, f'Field "{f}" is not a valid field to query.\n\n')
    if "csv" not in fmt:
        raise Exit(2, "ERROR: Invalid format. Please run 'nvidia-smi -h'.\n")
    lines = [] if "noheader" in fmt else [
        ", ".join(f"{h} [{UNITS[h]}]" if h in UNITS else h for h in heads)]
    for row in rows:
        vals = [row[h] for h in heads]
        if "nounits" not in fmt:
            vals = [f"{v} {UNITS[h]}" if h in UNITS and not v.startswith("[") else v
                    for h, v in zip(heads, vals)]
        lines.append(", ".join(vals))
    return "\n".join(lines) + "\n"


def render_list(gpus: list[Gpu]) -> str:
    return "".join(f"GPU {g.index}: {g.name} (UUID: {g.uuid})\n" for g in gpus)


def render_version(m: Machine) -> str:
    drv = m.cfg["DRIVER_VERSION"]
    return (
        f"NVIDIA-SMI version  : {drv}\n"
        f"NVML version        : {nvml_version(drv)}\n"
        f"DRIVER version      : {drv}\n"
        f"CUDA Version        : {m.cfg['CUDA_VERSION']}\n"
    )


def nvml_version(driver: str) -> str:
    return ".".join(driver.split(".")[:2])


#: driver 580 underlines the header rows of topo -m and topo -p2p, even into a pipe (the H200
#: capture, tests/fixtures/real-gpu/: '\tESC[4mGPU0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
#: ESC[0m' and ' \tESC[4mGPU0\tESC[0m')
UNDERLINE, RESET = "\x1b[4m", "\x1b[0m"


def render_topo_m(m: Machine) -> str:
    names = [f"GPU{g.index}" for g in m.gpus]
    header = "\t".join(names + ["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"])
    lines = ["\t" + UNDERLINE + header + RESET]
    for g in m.gpus:
        cells = [" X " if h is g else "NODE" if h.socket == g.socket else "SYS" for h in m.gpus]
        cells += [m.cpu_affinity(g.socket), str(g.socket), "", "N/A"]
        lines.append(f"GPU{g.index}\t" + "\t".join(cells))
    return "\n".join(lines) + "\n\n" + TOPO_LEGEND


def render_p2p(m: Machine, cap: str) -> str:
    # PCIe cards: no NVLink (n), no P2P atomics over PCIe (a)
    other = "NS" if cap in ("n", "a") or m.scenario == "p2p-unsupported" else "OK"
    lines = [" \t" + UNDERLINE + "".join(f"GPU{g.index}\t" for g in m.gpus) + RESET]
    for a in m.gpus:
        lines.append(f" GPU{a.index}\t" + "".join(("X" if b is a else other) + "\t" for b in m.gpus))
    return "\n".join(lines) + "\n\n" + P2P_LEGEND


# --------------------------------------------------------------------------- CLI


def _select(m: Machine, ids: str | None) -> list[Gpu]:
    if not m.gpus:
        raise Exit(6, "No devices were found\n")
    if ids is None:
        return m.gpus
    chosen = []
    for token in ids.split(","):
        token = token.strip().upper()
        match = [g for g in m.gpus if token in (str(g.index), g.uuid.upper(), g.bus_id, g.bus_id[4:])]
        if not match:
            raise Exit(6, "No devices were found\n")
        chosen += [g for g in match if g not in chosen]
    return chosen


# option -> (request key, value: None when the option takes an argument)
OPTIONS = {
    "--query-gpu": ("fields", None), "--format": ("format", None),
    "-i": ("ids", None), "--id": ("ids", None),
    "-L": ("mode", "list"), "--list-gpus": ("mode", "list"), "--version": ("mode", "version"),
}
TOPO_OPTIONS = {
    "-m": ("mode", "topo-m"), "--matrix": ("mode", "topo-m"),
    "-p2p": ("cap", None), "--p2pstatus": ("cap", None),
    "-i": ("ids", None), "--id": ("ids", None),
}


def parse(args: list[str]) -> dict:
    topo = bool(args) and args[0] == "topo"
    options, helpcmd = (TOPO_OPTIONS, "nvidia-smi topo -h") if topo else (OPTIONS, "nvidia-smi -h")
    req: dict = {"mode": "table", "ids": None, "fields": None, "format": None, "cap": None}
    rest = args[1:] if topo else list(args)
    while rest:
        arg = rest.pop(0)
        opt, eq, value = arg.partition("=")
        glued = [o for o in ("-p2p", "-i") if o in options and opt.startswith(o) and opt != o]
        if glued and opt not in options:  # -p2pr, -i3
            opt, eq, value = glued[0], "=", opt[len(glued[0]):]
        if opt not in options:
            raise Exit(2, f"ERROR: Option {arg} is not recognized. Please run '{helpcmd}'.\n")
        key, fixed = options[opt]
        if fixed is None and not eq:
            if not rest:
                raise Exit(2, f"ERROR: Option {opt} requires an argument. "
                              "Please run 'nvidia-smi -h'.\n")
            value = rest.pop(0)
        req[key] = fixed or value
    if req["cap"] is not None:
        if req["cap"] not in ("r", "w", "n", "a", "p"):
            raise Exit(2, f"ERROR: Invalid P2P capability \"{req['cap']}\". "
                          "Please run 'nvidia-smi topo -h'.\n")
        req["mode"] = "p2p"
    if topo and req["mode"] == "table":
        raise Exit(2, "ERROR: Option topo requires a sub-option. "
                      "Please run 'nvidia-smi topo -h'.\n")
    if req["fields"] is not None:
        req["mode"] = "query"
        req["fields"] = [f.strip() for f in req["fields"].split(",") if f.strip()]
        if not req["format"]:
            raise Exit(2, "ERROR: Option --format must be specified with --query-gpu. "
                          "Please run 'nvidia-smi -h'.\n")
        req["format"] = [f.strip() for f in req["format"].split(",")]
    return req


def _open_denied(path: str) -> bool:
    """The open is refused (EPERM/EACCES: the container's device cgroup). The stand-in nodes
    have no driver behind them: a permitted open answers ENXIO."""
    try:
        os.close(os.open(path, os.O_RDWR | os.O_NONBLOCK))
    except PermissionError:
        return True
    except OSError:
        pass
    return False


def run(args: list[str]) -> tuple[int, str]:
    cfg = load_env()
    try:
        req = parse(args)
        key = f"p2p-{req['cap']}" if req["mode"] == "p2p" else req["mode"]
        if cfg["REPLAY_DIR"] and key in REPLAY_FILES:
            path = os.path.join(cfg["REPLAY_DIR"], REPLAY_FILES[key])
            if os.path.isfile(path):
                with open(path, encoding="utf-8", newline="") as fh:
                    return 0, fh.read()
        m = Machine(cfg)
        if m.scenario == "driver-mismatch":
            return 18, ("Failed to initialize NVML: Driver/library version mismatch\n"
                        f"NVML library version: {nvml_version(cfg['DRIVER_VERSION'])}\n")
        ctl = os.path.join(os.environ.get("TESTBED_DEV_ROOT") or "/dev", "nvidiactl")
        if not os.path.exists(ctl):
            return 9, NO_DRIVER
        if _open_denied(ctl):
            # the device cgroup refuses the node: what the real nvidia-smi prints then
            return 255, "Failed to initialize NVML: Unknown Error\n"
        if req["mode"] == "version":
            return 0, render_version(m)
        if req["mode"] == "query" and m.scenario == "health-query-error" \
                and any(f in HEALTH_ONLY for f in req["fields"]):
            return 255, "Failed to initialize NVML: Unknown Error\n"  # as cgroup-denied prints it
        gpus = _select(m, req["ids"])
        lost = "".join(lost_line(g) for g in m.lost) if req["ids"] is None else ""
        if lost and req["mode"] == "table":  # nvidia-smi prints only the handle error
            return LOST_EXIT, lost
        if req["mode"] == "query":
            text = render_query(m, req["fields"], req["format"], gpus)
            return (LOST_EXIT, text + lost) if lost else (0, text)
        if req["mode"] == "list":
            return (LOST_EXIT, render_list(gpus) + lost) if lost else (0, render_list(gpus))
        if req["mode"] == "topo-m":
            return 0, render_topo_m(m)
        if req["mode"] == "p2p":
            return 0, render_p2p(m, req["cap"])
        return 0, render_table(m, gpus)
    except Exit as e:
        return e.code, e.text


def main() -> int:
    code, text = run(sys.argv[1:])
    sys.stdout.write(text)
    sys.stdout.flush()
    return code


if __name__ == "__main__":
    sys.exit(main())
