/* Fast path of the testbed's nvidia-smi stand-in: installed as /usr/bin/nvidia-smi.
 *
 * nvidia_smi.py (python3 stdlib) is the reference implementation; every call of it costs
 * ~11 ms of CPU, almost all interpreter start-up, and the testbed hosts share two cores.
 * This program answers the requests the deploy makes on every run BYTE-IDENTICALLY to
 * nvidia_smi.py (same stdout, same exit code) and execv()s the Python stand-in with the
 * same arguments for everything else:
 *
 *   --query-gpu=F1,F2,... --format=csv[,noheader][,nounits]   (also "--query-gpu F",
 *       "--format F", either order) for the fields index, name, gpu_name, uuid, gpu_uuid,
 *       driver_version, count, memory.total, memory.used, memory.free, compute_cap,
 *       pci.bus_id, gpu_bus_id
 *   topo -m | --matrix
 *   topo -p2p X | -p2pX | -p2p=X | --p2pstatus X ...   for X in r, w, n, a, p
 *
 * Anything else (another field, -i/--id, the table, -L, --version, a parse error, a gpu.env
 * or replay file with non-ASCII bytes, absurdly large numbers, ...) falls back to Python:
 * when in doubt, the fast path does not guess.  The order of the checks is that of run()
 * in nvidia_smi.py: gpu.env, arguments, REPLAY_DIR, SCENARIO=driver-mismatch, nvidiactl
 * exists, nvidiactl open refused, no GPUs, output.
 *
 * The Python stand-in is $TESTBED_SMI_FALLBACK when set (unit tests), else SMI_FALLBACK
 * (compile-time; build.py passes the installed launcher's path).
 *
 * libc only, no cuda.h; no strtol/scanf (glibc >= 2.38 maps those to new symbol versions
 * and the binary must run on bookworm's glibc 2.36).  See testbed/gpu/README.md.
 */

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "gpu_uuid.h"

#ifndef SMI_FALLBACK
#define SMI_FALLBACK "/usr/lib/testbed-gpu/nvidia-smi.py"
#endif

#define MAX_GPUS 1024               /* more GPUs than this: fall back */
#define MAX_FILE (4u << 20)         /* gpu.env / replay files larger than this: fall back */
#define MAX_FIELDS 64
#define INT_DIGITS_MAX 15           /* integers with more digits: fall back */

static char **g_argv;

/* ------------------------------------------------------------------ fallback */

static void fallback(void) __attribute__((noreturn));
static void fallback(void) {
    const char *p = getenv("TESTBED_SMI_FALLBACK");
    if (!p || !*p) p = SMI_FALLBACK;
    execv(p, g_argv);
    int e = errno;
    dprintf(2, "nvidia-smi (testbed fast path): cannot run the Python stand-in %s: %s\n", p,
            strerror(e));
    _exit(127);
}

/* ------------------------------------------------------------------ output buffer */

typedef struct {
    char *p;
    size_t n, cap;
} buf_t;

static void bput(buf_t *b, const char *s, size_t n) {
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 4096;
        while (cap < b->n + n + 1) cap *= 2;
        char *q = realloc(b->p, cap);
        if (!q) fallback();
        b->p = q;
        b->cap = cap;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

static void bputs(buf_t *b, const char *s) { bput(b, s, strlen(s)); }

static void bprintf(buf_t *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void bprintf(buf_t *b, const char *fmt, ...) {
    char tmp[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof tmp) fallback(); /* never with the formats used here */
    bput(b, tmp, (size_t)n);
}

static int finish(int code, const char *s, size_t n) {
    while (n > 0) {
        ssize_t w = write(1, s, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            break;
        }
        s += w;
        n -= (size_t)w;
    }
    return code;
}

/* ------------------------------------------------------------------ python str semantics */

/* str.isspace() for ASCII; str.splitlines() boundaries for ASCII (\r\n is two boundaries
 * with an empty line between them here, harmless: empty lines are skipped) */
static int py_space(unsigned char c) { return c == ' ' || (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x1f); }
static int py_linebreak(unsigned char c) { return c == '\n' || c == '\r' || c == 11 || c == 12 || (c >= 0x1c && c <= 0x1e); }

/* strip characters in [*s, *e) while pred */
static void strip_ws(const char **s, const char **e) {
    while (*s < *e && py_space((unsigned char)**s)) (*s)++;
    while (*e > *s && py_space((unsigned char)(*e)[-1])) (*e)--;
}

static void strip_char(const char **s, const char **e, char c) {
    while (*s < *e && **s == c) (*s)++;
    while (*e > *s && (*e)[-1] == c) (*e)--;
}

static int all_ascii(const char *p, size_t n) {
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == 0 || c >= 0x80) return 0;
    }
    return 1;
}

/* Read a whole file.  0: ok; -1: cannot be opened/read (python: OSError); -2: too large. */
static int read_file(const char *path, char **out, size_t *len) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    size_t cap = 8192, n = 0;
    char *p = malloc(cap + 1);
    if (!p) fallback();
    for (;;) {
        if (n == cap) {
            if (cap >= MAX_FILE) {
                free(p);
                close(fd);
                return -2;
            }
            cap *= 2;
            char *q = realloc(p, cap + 1);
            if (!q) fallback();
            p = q;
        }
        ssize_t r = read(fd, p + n, cap - n);
        if (r < 0) {
            if (errno == EINTR) continue;
            free(p);
            close(fd);
            return -1;
        }
        if (r == 0) break;
        n += (size_t)r;
    }
    close(fd);
    p[n] = 0;
    *out = p;
    *len = n;
    return 0;
}

/* os.path.join(a, b) for a relative b */
static char *path_join(const char *a, const char *b) {
    size_t la = strlen(a), lb = strlen(b);
    char *p = malloc(la + lb + 2);
    if (!p) fallback();
    memcpy(p, a, la);
    size_t n = la;
    if (la && a[la - 1] != '/') p[n++] = '/';
    memcpy(p + n, b, lb + 1);
    return p;
}

/* ------------------------------------------------------------------ gpu.env (load_env) */

enum {
    K_GPU_COUNT, K_GPU_NAME, K_GPU_MEMORY_MIB, K_GPU_CC, K_DRIVER_VERSION, K_SOCKETS,
    K_CPUS_PER_SOCKET, K_SCENARIO, K_REPLAY_DIR, K_HOSTNAME, K_N
};
static const char *const key_names[K_N] = {
    "GPU_COUNT", "GPU_NAME", "GPU_MEMORY_MIB", "GPU_CC", "DRIVER_VERSION", "SOCKETS",
    "CPUS_PER_SOCKET", "SCENARIO", "REPLAY_DIR", "HOSTNAME",
};
/* nvidia_smi.py DEFAULTS */
static const char *const defaults[K_N] = {
    "8", "NVIDIA RTX PRO 6000 Blackwell Server Edition", "97887", "12.0", "580.95.05", "2",
    "32", "healthy", "", "",
};
static const char *cfg[K_N];

static void load_env(void) {
    for (int k = 0; k < K_N; k++) cfg[k] = defaults[k];
    const char *path = getenv("TESTBED_GPU_ENV");
    if (!path || !*path) path = "/etc/testbed/gpu.env";
    char *data;
    size_t n;
    int rc = read_file(path, &data, &n);
    if (rc == -1) return;       /* OSError: no lines */
    if (rc == -2) fallback();
    if (!all_ascii(data, n)) fallback(); /* utf-8 decoding, unicode whitespace: python's job */
    char *end = data + n;
    char *line = data;
    while (line < end) {
        char *le = line;
        while (le < end && !py_linebreak((unsigned char)*le)) le++;
        char *next = le < end ? le + 1 : end;
        /* line = line.strip() */
        const char *s = line, *e = le;
        strip_ws(&s, &e);
        const char *eq = memchr(s, '=', (size_t)(e - s));
        if (s < e && *s != '#' && eq) {
            const char *ks = s, *ke = eq;
            strip_ws(&ks, &ke);
            const char *vs = eq + 1, *ve = e;
            /* if " #" in value or "\t#" in value: value = value.split("#", 1)[0] */
            int comment = 0;
            for (const char *p = vs + 1; p < ve; p++) {
                if (*p == '#' && (p[-1] == ' ' || p[-1] == '\t')) { comment = 1; break; }
            }
            if (comment) ve = memchr(vs, '#', (size_t)(ve - vs));
            /* value.strip().strip('"').strip("'") */
            strip_ws(&vs, &ve);
            strip_char(&vs, &ve, '"');
            strip_char(&vs, &ve, '\'');
            for (int k = 0; k < K_N; k++) {
                size_t kl = strlen(key_names[k]);
                if ((size_t)(ke - ks) == kl && !memcmp(ks, key_names[k], kl)) {
                    *(char *)ve = 0; /* ve <= le: inside this line (or the final NUL) */
                    cfg[k] = vs;
                }
            }
        }
        line = next;
    }
}

/* _int(): int(cfg.get(key) or DEFAULTS[key]), the default when that raises ValueError.
 * Python's int(): surrounding whitespace, one sign, digits with single '_' between them. */
static long long py_int(int key) {
    const char *v = cfg[key];
    if (!*v) v = defaults[key];
    const char *s = v, *e = v + strlen(v);
    strip_ws(&s, &e);
    int neg = 0;
    if (s < e && (*s == '+' || *s == '-')) neg = *s++ == '-';
    long long val = 0;
    int digits = 0, ok = s < e;
    for (const char *p = s; p < e && ok; p++) {
        if (*p >= '0' && *p <= '9') {
            if (++digits > INT_DIGITS_MAX) fallback();
            val = val * 10 + (*p - '0');
        } else if (*p == '_' && p > s && p[-1] != '_' && p + 1 < e) {
            /* between two digits: the next one is checked on the next round */
        } else {
            ok = 0;
        }
    }
    if (ok && e[-1] == '_') ok = 0;
    if (!ok) {
        /* ValueError: the default (always a plain small number) */
        val = 0;
        for (const char *p = defaults[key]; *p; p++) val = val * 10 + (*p - '0');
        return val;
    }
    return neg ? -val : val;
}

/* ------------------------------------------------------------------ machine */

static const int bus_numbers[8] = {0x01, 0x25, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1};
static int bus_number(long long i) { return i < 8 ? bus_numbers[i] : (int)((0x01 + 0x10 * i) & 0xFF); }

static const char *scenario;
static long long n_gpus, configured, sockets, cpus_per_socket, mem_mib;
static const char *host;

static long long socket_of(long long i) { return i * sockets / (configured > 1 ? configured : 1); }

static void machine(void) {
    scenario = *cfg[K_SCENARIO] ? cfg[K_SCENARIO] : "healthy";
    configured = py_int(K_GPU_COUNT);
    long long count = configured;
    if (!strcmp(scenario, "gpu-missing")) count = count - 1 > 0 ? count - 1 : 0;
    n_gpus = count > 0 ? count : 0; /* range(count) */
    if (n_gpus > MAX_GPUS) fallback();
    mem_mib = py_int(K_GPU_MEMORY_MIB);
    sockets = py_int(K_SOCKETS);
    if (sockets < 1) sockets = 1;
    cpus_per_socket = py_int(K_CPUS_PER_SOCKET);
    if (cpus_per_socket < 1) cpus_per_socket = 1;
    if (sockets > 1000000 || cpus_per_socket > 1000000000) fallback();
    host = cfg[K_HOSTNAME];
}

static const char *hostname(void) {
    static struct utsname u;
    if (!*host) {
        if (uname(&u) != 0) fallback();
        if (!all_ascii(u.nodename, strlen(u.nodename))) fallback();
        host = u.nodename;
    }
    return host;
}

/* format_uuid(gpu_uuid_bytes(host, index)): gpu_uuid.h, as libcuda_stub.c's cuDeviceGetUuid */
static void gpu_uuid(long long index, char out[41]) {
    unsigned char raw[16];
    gpu_uuid_bytes(hostname(), index, raw);
    static const char hex[] = "0123456789abcdef";
    char *o = out;
    memcpy(o, "GPU-", 4);
    o += 4;
    for (int i = 0; i < 16; i++) {
        if (i == 4 || i == 6 || i == 8 || i == 10) *o++ = '-';
        *o++ = hex[raw[i] >> 4];
        *o++ = hex[raw[i] & 15];
    }
    *o = 0;
}

/* ------------------------------------------------------------------ requests */

enum { F_INDEX, F_NAME, F_UUID, F_DRIVER, F_COUNT, F_MEM_TOTAL, F_MEM_USED, F_MEM_FREE, F_CC, F_BUS_ID };
static const struct {
    const char *name, *head;
    int unit_mib;
    int id;
} field_table[] = {
    {"index", "index", 0, F_INDEX},
    {"name", "name", 0, F_NAME},
    {"gpu_name", "name", 0, F_NAME},
    {"uuid", "uuid", 0, F_UUID},
    {"gpu_uuid", "uuid", 0, F_UUID},
    {"driver_version", "driver_version", 0, F_DRIVER},
    {"count", "count", 0, F_COUNT},
    {"memory.total", "memory.total", 1, F_MEM_TOTAL},
    {"memory.used", "memory.used", 1, F_MEM_USED},
    {"memory.free", "memory.free", 1, F_MEM_FREE},
    {"compute_cap", "compute_cap", 0, F_CC},
    {"pci.bus_id", "pci.bus_id", 0, F_BUS_ID},
    {"gpu_bus_id", "pci.bus_id", 0, F_BUS_ID},
};
#define N_FIELD_TABLE (sizeof field_table / sizeof field_table[0])

enum { MODE_QUERY, MODE_TOPO_M, MODE_P2P };
static int mode;
static char cap;                    /* p2p capability */
static int fields[MAX_FIELDS], n_fields;
static int noheader, nounits;

/* [f.strip() for f in v.split(",") if f.strip()], each a known field */
static void parse_fields(const char *v) {
    const char *p = v;
    for (;;) {
        const char *c = strchr(p, ',');
        const char *s = p, *e = c ? c : p + strlen(p);
        strip_ws(&s, &e);
        if (s < e) {
            size_t i;
            for (i = 0; i < N_FIELD_TABLE; i++) {
                size_t l = strlen(field_table[i].name);
                if ((size_t)(e - s) == l && !memcmp(s, field_table[i].name, l)) break;
            }
            if (i == N_FIELD_TABLE || n_fields == MAX_FIELDS) fallback();
            fields[n_fields++] = (int)i;
        }
        if (!c) break;
        p = c + 1;
    }
    if (!n_fields) fallback();
}

/* [f.strip() for f in v.split(",")]: csv required, noheader/nounits, nothing else */
static void parse_format(const char *v) {
    int csv = 0;
    const char *p = v;
    for (;;) {
        const char *c = strchr(p, ',');
        const char *s = p, *e = c ? c : p + strlen(p);
        strip_ws(&s, &e);
        size_t l = (size_t)(e - s);
        if (l == 3 && !memcmp(s, "csv", 3)) csv = 1;
        else if (l == 8 && !memcmp(s, "noheader", 8)) noheader = 1;
        else if (l == 7 && !memcmp(s, "nounits", 7)) nounits = 1;
        else fallback();
        if (!c) break;
        p = c + 1;
    }
    if (!csv) fallback();
}

static int is_cap(const char *s) { return s[0] && !s[1] && strchr("rwnap", s[0]); }

/* The request shapes the fast path knows; everything else falls back. */
static void parse(int argc, char **argv) {
    if (argc >= 2 && !strcmp(argv[1], "topo")) {
        if (argc == 3 && (!strcmp(argv[2], "-m") || !strcmp(argv[2], "--matrix"))) {
            mode = MODE_TOPO_M;
            return;
        }
        if (argc != 3 && argc != 4) fallback();
        const char *a = argv[2], *tail;
        if (!strncmp(a, "-p2p", 4)) tail = a + 4;
        else if (!strncmp(a, "--p2pstatus", 11)) tail = a + 11;
        else fallback();
        while (*tail == '=') tail++;
        const char *c;
        if (*tail) {
            if (argc != 3) fallback();
            c = tail;
        } else {
            if (argc != 4) fallback();
            c = argv[3];
        }
        if (!is_cap(c)) fallback();
        mode = MODE_P2P;
        cap = c[0];
        return;
    }
    const char *q = NULL, *f = NULL;
    for (int i = 1; i < argc;) {
        const char *a = argv[i];
        const char **slot;
        size_t l;
        if (!strncmp(a, "--query-gpu", 11)) { slot = &q; l = 11; }
        else if (!strncmp(a, "--format", 8)) { slot = &f; l = 8; }
        else fallback();
        if (*slot) fallback(); /* repeated option */
        if (a[l] == '=') {
            *slot = a + l + 1;
            i += 1;
        } else if (!a[l] && i + 1 < argc) {
            *slot = argv[i + 1];
            i += 2;
        } else {
            fallback();
        }
    }
    if (!q || !f) fallback();
    mode = MODE_QUERY;
    parse_fields(q);
    parse_format(f);
}

/* ------------------------------------------------------------------ outputs */

static const char TOPO_LEGEND[] =
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n";

static const char P2P_LEGEND[] =
    "Legend:\n"
    "\n"
    "  X    = Self\n"
    "  OK   = Status Ok\n"
    "  CNS  = Chipset not supported\n"
    "  GNS  = GPU not supported\n"
    "  TNS  = Topology not supported\n"
    "  NS   = Not supported\n"
    "  DR   = Disabled by regkey\n"
    "  U    = Unknown\n";

static const char NO_DRIVER[] =
    "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. "
    "Make sure that the latest NVIDIA driver is installed and running. \n";

static void render_query(buf_t *b) {
    if (!noheader) {
        for (int j = 0; j < n_fields; j++) {
            if (j) bputs(b, ", ");
            bputs(b, field_table[fields[j]].head);
            if (field_table[fields[j]].unit_mib) bputs(b, " [MiB]");
        }
        bputs(b, "\n");
    }
    for (long long i = 0; i < n_gpus; i++) {
        for (int j = 0; j < n_fields; j++) {
            if (j) bputs(b, ", ");
            switch (field_table[fields[j]].id) {
            case F_INDEX: bprintf(b, "%lld", i); break;
            case F_NAME: bputs(b, cfg[K_GPU_NAME]); break;
            case F_UUID: {
                char u[41];
                gpu_uuid(i, u);
                bputs(b, u);
                break;
            }
            case F_DRIVER: bputs(b, cfg[K_DRIVER_VERSION]); break;
            case F_COUNT: bprintf(b, "%lld", n_gpus); break;
            case F_MEM_TOTAL: case F_MEM_FREE: bprintf(b, "%lld", mem_mib); break; /* used = 0 */
            case F_MEM_USED: bputs(b, "0"); break;
            case F_CC: bputs(b, cfg[K_GPU_CC]); break;
            case F_BUS_ID: bprintf(b, "00000000:%02X:00.0", bus_number(i)); break;
            }
            if (field_table[fields[j]].unit_mib && !nounits) bputs(b, " MiB");
        }
        bputs(b, "\n");
    }
}

static void render_topo_m(buf_t *b) {
    bputs(b, "\t");
    for (long long i = 0; i < n_gpus; i++) bprintf(b, "GPU%lld\t", i);
    bputs(b, "CPU Affinity\tNUMA Affinity\tGPU NUMA ID\n");
    long long c = cpus_per_socket, s = sockets;
    for (long long i = 0; i < n_gpus; i++) {
        long long si = socket_of(i);
        bprintf(b, "GPU%lld", i);
        for (long long j = 0; j < n_gpus; j++)
            bputs(b, j == i ? "\t X " : socket_of(j) == si ? "\tNODE" : "\tSYS");
        bprintf(b, "\t%lld-%lld,%lld-%lld\t%lld\t\tN/A\n", si * c, si * c + c - 1, (s + si) * c,
                (s + si) * c + c - 1, si);
    }
    bputs(b, "\n");
    bputs(b, TOPO_LEGEND);
}

static void render_p2p(buf_t *b) {
    const char *other = (cap == 'n' || cap == 'a' || !strcmp(scenario, "p2p-unsupported")) ? "NS\t" : "OK\t";
    bputs(b, " \t");
    for (long long i = 0; i < n_gpus; i++) bprintf(b, "GPU%lld\t", i);
    bputs(b, "\n");
    for (long long i = 0; i < n_gpus; i++) {
        bprintf(b, " GPU%lld\t", i);
        for (long long j = 0; j < n_gpus; j++) bputs(b, j == i ? "X\t" : other);
        bputs(b, "\n");
    }
    bputs(b, "\n");
    bputs(b, P2P_LEGEND);
}

/* ------------------------------------------------------------------ main */

int main(int argc, char **argv) {
    g_argv = argv;
    if (argc < 1) fallback();
    load_env();
    parse(argc, argv);

    /* REPLAY_DIR: the recorded file verbatim, before the scenarios */
    const char *replay_name = mode == MODE_QUERY ? "query-gpu.csv"
                              : mode == MODE_TOPO_M ? "topo-m.txt"
                              : cap == 'r' ? "topo-p2p-r.txt"
                              : cap == 'w' ? "topo-p2p-w.txt" : NULL;
    if (*cfg[K_REPLAY_DIR] && replay_name) {
        char *path = path_join(cfg[K_REPLAY_DIR], replay_name);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            char *data;
            size_t n;
            if (read_file(path, &data, &n) != 0 || !all_ascii(data, n)) fallback();
            return finish(0, data, n);
        }
        free(path);
    }

    machine();
    if (!strcmp(scenario, "driver-mismatch")) {
        const char *drv = cfg[K_DRIVER_VERSION];
        const char *dot = strchr(drv, '.');
        size_t l = dot && strchr(dot + 1, '.') ? (size_t)(strchr(dot + 1, '.') - drv) : strlen(drv);
        buf_t b = {0};
        bputs(&b, "Failed to initialize NVML: Driver/library version mismatch\nNVML library version: ");
        bput(&b, drv, l);
        bputs(&b, "\n");
        return finish(18, b.p, b.n);
    }

    const char *dev = getenv("TESTBED_DEV_ROOT");
    if (!dev || !*dev) dev = "/dev";
    char *ctl = path_join(dev, "nvidiactl");
    struct stat st;
    if (stat(ctl, &st) != 0) return finish(9, NO_DRIVER, sizeof NO_DRIVER - 1);
    int fd = open(ctl, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
    } else if (errno == EPERM || errno == EACCES) {
        static const char denied[] = "Failed to initialize NVML: Unknown Error\n";
        return finish(255, denied, sizeof denied - 1);
    }
    free(ctl);

    if (n_gpus == 0) {
        static const char none[] = "No devices were found\n";
        return finish(6, none, sizeof none - 1);
    }
    buf_t b = {0};
    if (mode == MODE_QUERY) render_query(&b);
    else if (mode == MODE_TOPO_M) render_topo_m(&b);
    else render_p2p(&b);
    return finish(0, b.p, b.n);
}
