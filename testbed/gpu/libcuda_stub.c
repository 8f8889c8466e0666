/*
 * libcuda.so.1 stand-in for the sglang-deploy testbed (no GPU anywhere).
 *
 * Built against the REAL cuda.h: every function below is defined with the exact
 * signature the header declares, and the header's macros map the plain names to the
 * versioned symbols the real driver exports (cuMemAlloc -> cuMemAlloc_v2,
 * cuCtxCreate -> cuCtxCreate_v4, ...).  Device memory is host memory; the
 * CUdeviceptr is the host address.  Behaviour comes from /etc/testbed/gpu.env
 * ($TESTBED_GPU_ENV), re-read at every cuInit; device nodes are checked under
 * $TESTBED_DEV_ROOT (default /dev).  See testbed/gpu/README.md.
 */
#include <cuda.h>

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define MAX_DEV 64
#define MIB (1024ULL * 1024ULL)
#define PREFAULT_MAX (1024ULL * MIB)

/* ------------------------------------------------------------------ config */

typedef struct {
    int gpu_count;
    char gpu_name[256];
    unsigned long long mem_mib;
    int cc_major, cc_minor;
    int cuda_version; /* 13000 */
    int sockets;
    double p2p_gbps;
    char scenario[64];
    char hostname[256];
} config_t;

static config_t cfg;
static int cfg_loaded;

static long parse_long(const char *s, long dflt) {
    long v = 0;
    int any = 0, neg = 0;
    while (*s == ' ' || *s == '\t') s++;
    if (*s == '-') { neg = 1; s++; }
    while (*s >= '0' && *s <= '9') { v = v * 10 + (*s - '0'); s++; any = 1; }
    return any ? (neg ? -v : v) : dflt;
}

static double parse_double(const char *s, double dflt) {
    double v = 0, scale = 1;
    int any = 0;
    while (*s == ' ' || *s == '\t') s++;
    while (*s >= '0' && *s <= '9') { v = v * 10 + (*s - '0'); s++; any = 1; }
    if (*s == '.') {
        s++;
        while (*s >= '0' && *s <= '9') { scale /= 10; v += (*s - '0') * scale; s++; any = 1; }
    }
    return any ? v : dflt;
}

/* "12.0" -> 12, 0 ; "13.0" -> 13000 via major*1000 + minor*10 */
static void parse_version(const char *s, int *major, int *minor) {
    *major = (int)parse_long(s, 0);
    const char *dot = strchr(s, '.');
    *minor = dot ? (int)parse_long(dot + 1, 0) : 0;
}

static void set_key(const char *key, const char *val) {
    int a, b;
    if (!strcmp(key, "GPU_COUNT")) cfg.gpu_count = (int)parse_long(val, 8);
    else if (!strcmp(key, "GPU_NAME")) snprintf(cfg.gpu_name, sizeof cfg.gpu_name, "%s", val);
    else if (!strcmp(key, "GPU_MEMORY_MIB")) cfg.mem_mib = (unsigned long long)parse_long(val, 97887);
    else if (!strcmp(key, "GPU_CC")) { parse_version(val, &a, &b); cfg.cc_major = a; cfg.cc_minor = b; }
    else if (!strcmp(key, "CUDA_VERSION")) { parse_version(val, &a, &b); cfg.cuda_version = a * 1000 + b * 10; }
    else if (!strcmp(key, "SOCKETS")) cfg.sockets = (int)parse_long(val, 2);
    else if (!strcmp(key, "P2P_GBPS")) cfg.p2p_gbps = parse_double(val, 40.0);
    else if (!strcmp(key, "SCENARIO")) snprintf(cfg.scenario, sizeof cfg.scenario, "%s", val);
    else if (!strcmp(key, "HOSTNAME")) snprintf(cfg.hostname, sizeof cfg.hostname, "%s", val);
}

static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r' || s[n - 1] == '\n')) s[--n] = 0;
    if (n >= 2 && ((s[0] == '"' && s[n - 1] == '"') || (s[0] == '\'' && s[n - 1] == '\''))) {
        s[n - 1] = 0;
        s++;
    }
    return s;
}

static void load_config(void) {
    memset(&cfg, 0, sizeof cfg);
    cfg.gpu_count = 8;
    snprintf(cfg.gpu_name, sizeof cfg.gpu_name, "NVIDIA RTX PRO 6000 Blackwell Server Edition");
    cfg.mem_mib = 97887;
    cfg.cc_major = 12;
    cfg.cc_minor = 0;
    cfg.cuda_version = 13000;
    cfg.sockets = 2;
    cfg.p2p_gbps = 40.0;
    snprintf(cfg.scenario, sizeof cfg.scenario, "healthy");
    const char *path = getenv("TESTBED_GPU_ENV");
    if (!path || !*path) path = "/etc/testbed/gpu.env";
    FILE *f = fopen(path, "r");
    if (f) {
        char line[1024];
        while (fgets(line, sizeof line, f)) {
            char *l = trim(line);
            if (!*l || *l == '#') continue;
            char *eq = strchr(l, '=');
            if (!eq) continue;
            *eq = 0;
            char *val = eq + 1;
            /* trailing comment: "value   # text" */
            for (char *p = val; *p; p++) {
                if (*p == '#' && p > val && (p[-1] == ' ' || p[-1] == '\t')) { *p = 0; break; }
            }
            set_key(trim(l), trim(val));
        }
        fclose(f);
    }
    if (!cfg.hostname[0]) {
        gethostname(cfg.hostname, sizeof cfg.hostname - 1);
    }
    if (cfg.gpu_count < 0) cfg.gpu_count = 0;
    if (cfg.gpu_count > MAX_DEV) cfg.gpu_count = MAX_DEV;
    if (cfg.sockets < 1) cfg.sockets = 1;
    cfg_loaded = 1;
}

static int scenario(const char *name) { return strcmp(cfg.scenario, name) == 0; }

/* ------------------------------------------------------------------ state */

struct CUctx_st {
    int dev;           /* ordinal */
    int primary;
    int alive;
    int refcount;      /* primary contexts only */
    uint64_t peers;    /* bit per ordinal: peer access enabled from this context */
};

typedef struct {
    uintptr_t base;
    size_t size;
    int dev;
    struct CUctx_st *ctx;
} alloc_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;            /* cuInit succeeded */
static CUresult init_error = CUDA_ERROR_NOT_INITIALIZED;
static int dev_count;
static int dev_phys[MAX_DEV];      /* ordinal -> physical index (/dev/nvidiaN) */
static struct CUctx_st primary[MAX_DEV];
static unsigned long long dev_used[MAX_DEV];
static alloc_t *allocs;
static size_t n_allocs, cap_allocs;

static __thread CUcontext ctx_stack[128];
static __thread int ctx_depth;

#define REQUIRE_INIT() do { if (!initialized) return CUDA_ERROR_NOT_INITIALIZED; } while (0)

static int valid_dev(CUdevice d) { return d >= 0 && d < dev_count; }
static int valid_ctx(CUcontext c) { return c && c->alive; }
static CUcontext current(void) { return ctx_depth > 0 ? ctx_stack[ctx_depth - 1] : NULL; }

static int node_exists(const char *name) {
    const char *root = getenv("TESTBED_DEV_ROOT");
    char path[1024];
    if (!root || !*root) root = "/dev";
    snprintf(path, sizeof path, "%s/%s", root, name);
    return access(path, F_OK) == 0;
}

/* The container's device cgroup refused the node (the open fails with EPERM/EACCES). The
 * stand-in nodes have no kernel driver behind them, so a PERMITTED open answers ENXIO. */
static int node_denied(const char *name) {
    const char *root = getenv("TESTBED_DEV_ROOT");
    char path[1024];
    if (!root || !*root) root = "/dev";
    snprintf(path, sizeof path, "%s/%s", root, name);
    int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return 0;
    }
    return errno == EPERM || errno == EACCES;
}

/* ------------------------------------------------------------------ PCI bus ids, sockets */

static const int bus_numbers[8] = {0x01, 0x25, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1};
static int bus_number(int phys) { return phys < 8 ? bus_numbers[phys] : ((0x01 + 0x10 * phys) & 0xFF); }
static int socket_of(int phys) { return phys * cfg.sockets / (cfg.gpu_count > 0 ? cfg.gpu_count : 1); }

/* ------------------------------------------------------------------ errors */

typedef struct { CUresult code; const char *name; const char *text; } err_t;
#define E(c, t) { c, #c, t }
static const err_t errors[] = {
    E(CUDA_SUCCESS, "no error"),
    E(CUDA_ERROR_INVALID_VALUE, "invalid argument"),
    E(CUDA_ERROR_OUT_OF_MEMORY, "out of memory"),
    E(CUDA_ERROR_NOT_INITIALIZED, "initialization error"),
    E(CUDA_ERROR_DEINITIALIZED, "driver shutting down"),
    E(CUDA_ERROR_STUB_LIBRARY, "CUDA driver is a stub library"),
    E(CUDA_ERROR_DEVICE_UNAVAILABLE, "CUDA-capable device(s) is/are busy or unavailable"),
    E(CUDA_ERROR_NO_DEVICE, "no CUDA-capable device is detected"),
    E(CUDA_ERROR_INVALID_DEVICE, "invalid device ordinal"),
    E(CUDA_ERROR_INVALID_IMAGE, "device kernel image is invalid"),
    E(CUDA_ERROR_INVALID_CONTEXT, "invalid device context"),
    E(CUDA_ERROR_NO_BINARY_FOR_GPU, "no kernel image is available for execution on the device"),
    E(CUDA_ERROR_ECC_UNCORRECTABLE, "uncorrectable ECC error encountered"),
    E(CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported between these two devices"),
    E(CUDA_ERROR_NVLINK_UNCORRECTABLE, "uncorrectable NVLink error detected during the execution"),
    E(CUDA_ERROR_OPERATING_SYSTEM, "OS call failed or operation not supported on this OS"),
    E(CUDA_ERROR_INVALID_HANDLE, "invalid resource handle"),
    E(CUDA_ERROR_NOT_FOUND, "named symbol not found"),
    E(CUDA_ERROR_NOT_READY, "device not ready"),
    E(CUDA_ERROR_ILLEGAL_ADDRESS, "an illegal memory access was encountered"),
    E(CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "peer access is already enabled"),
    E(CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "peer access has not been enabled"),
    E(CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "cannot set while device is active in this process"),
    E(CUDA_ERROR_CONTEXT_IS_DESTROYED, "context is destroyed"),
    E(CUDA_ERROR_LAUNCH_FAILED, "unspecified launch failure"),
    E(CUDA_ERROR_NOT_PERMITTED, "operation not permitted"),
    E(CUDA_ERROR_NOT_SUPPORTED, "operation not supported"),
    E(CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized"),
    E(CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "system has unsupported display driver / cuda driver combination"),
    E(CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "forward compatibility was attempted on non supported HW"),
    E(CUDA_ERROR_UNKNOWN, "unknown error"),
};
#undef E

static const err_t *find_error(CUresult e) {
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == e) return &errors[i];
    return NULL;
}

EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
    const err_t *e = find_error(error);
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    *pStr = e ? e->text : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
    const err_t *e = find_error(error);
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    *pStr = e ? e->name : NULL;
    return e ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ------------------------------------------------------------------ init / version / devices */

static void free_allocs_of(struct CUctx_st *ctx) {
    size_t j = 0;
    for (size_t i = 0; i < n_allocs; i++) {
        if (allocs[i].ctx == ctx) {
            dev_used[allocs[i].dev] -= allocs[i].size;
            free((void *)allocs[i].base);
        } else {
            allocs[j++] = allocs[i];
        }
    }
    n_allocs = j;
}

EXPORT CUresult CUDAAPI cuInit(unsigned int Flags) {
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    load_config();
    CUresult rc = CUDA_SUCCESS;
    int count = cfg.gpu_count;
    if (scenario("gpu-missing") && count > 0) count--;
    int n = 0;
    for (int i = 0; i < count; i++) {
        char name[32];
        snprintf(name, sizeof name, "nvidia%d", i);
        if (node_exists(name) && !node_denied(name)) dev_phys[n++] = i;
    }
    if (scenario("driver-mismatch")) rc = CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    /* like the real driver: nvidiactl that cannot be opened -> 999 at initialisation */
    else if (node_exists("nvidiactl") && node_denied("nvidiactl")) rc = CUDA_ERROR_UNKNOWN;
    else if (!node_exists("nvidiactl") || n == 0) rc = CUDA_ERROR_NO_DEVICE;
    else if (scenario("uvm-missing") || !node_exists("nvidia-uvm") || node_denied("nvidia-uvm"))
        rc = CUDA_ERROR_UNKNOWN;
    if (rc == CUDA_SUCCESS) {
        if (!initialized) {
            for (int i = 0; i < MAX_DEV; i++) {
                primary[i].dev = i;
                primary[i].primary = 1;
                primary[i].alive = 0;
                primary[i].refcount = 0;
                primary[i].peers = 0;
            }
        }
        dev_count = n;
        initialized = 1;
    } else {
        initialized = 0;
        dev_count = 0;
    }
    init_error = rc;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
    if (!cfg_loaded) {
        pthread_mutex_lock(&lock);
        if (!cfg_loaded) load_config();
        pthread_mutex_unlock(&lock);
    }
    *driverVersion = cfg.cuda_version;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDeviceGetCount(int *count) {
    REQUIRE_INIT();
    if (!count) return CUDA_ERROR_INVALID_VALUE;
    *count = dev_count;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice *device, int ordinal) {
    REQUIRE_INIT();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(ordinal)) return CUDA_ERROR_INVALID_DEVICE;
    *device = ordinal;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDeviceGetName(char *name, int len, CUdevice dev) {
    REQUIRE_INIT();
    if (!name || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(name, (size_t)len, "%s", cfg.gpu_name);
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev) {
    REQUIRE_INIT();
    if (!pi) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    if ((int)attrib <= 0 || attrib >= CU_DEVICE_ATTRIBUTE_MAX) return CUDA_ERROR_INVALID_VALUE;
    int phys = dev_phys[dev];
    int v = 0;
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: v = cfg.cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: v = cfg.cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: v = 188; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: v = bus_number(phys); break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: v = 1024; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: v = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: v = 49152; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: v = 101376; break;
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED: v = 1; break;
    case CU_DEVICE_ATTRIBUTE_TCC_DRIVER: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_MODE: v = CU_COMPUTEMODE_DEFAULT; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: v = 512; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: v = 128 * 1024 * 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: v = 1536; break;
    case CU_DEVICE_ATTRIBUTE_HOST_NATIVE_ATOMIC_SUPPORTED: v = 0; break;
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: v = 1; break;
    default: v = 0; break;
    }
    *pi = v;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
    REQUIRE_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)(cfg.mem_mib * MIB);
    return CUDA_SUCCESS;
}

/* The GPU UUID: 16 bytes per (host, index), the bytes of nvidia_smi.py's gpu_uuid_bytes, so
 * that the driver and nvidia-smi name each GPU alike. Half h of the UUID:
 * mix64(fnv1a64("testbed-gpu:<host>:<index>:<h>")), big-endian. */
static uint64_t fnv1a64(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001B3ULL;
    }
    return h;
}

static uint64_t mix64(uint64_t z) { /* splitmix64's finaliser */
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static void gpu_uuid_bytes(const char *host, long long index, unsigned char raw[16]) {
    for (int half = 0; half < 2; half++) {
        char tail[64];
        int tl = snprintf(tail, sizeof tail, ":%lld:%d", index, half);
        uint64_t x = 0xCBF29CE484222325ULL;
        x = fnv1a64(x, "testbed-gpu:", 12);
        x = fnv1a64(x, host, strlen(host));
        x = fnv1a64(x, tail, (size_t)tl);
        x = mix64(x);
        for (int i = 0; i < 8; i++) raw[half * 8 + i] = (unsigned char)(x >> (56 - 8 * i));
    }
}

EXPORT CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) {
    REQUIRE_INIT();
    if (!uuid) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    gpu_uuid_bytes(cfg.hostname, dev_phys[dev], (unsigned char *)uuid->bytes);
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev) {
    REQUIRE_INIT();
    if (!pciBusId || len <= 0) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    snprintf(pciBusId, (size_t)len, "0000:%02X:00.0", bus_number(dev_phys[dev]));
    return CUDA_SUCCESS;
}

static int peer_capable(CUdevice a, CUdevice b) {
    return a != b && !scenario("p2p-unsupported");
}

EXPORT CUresult CUDAAPI cuDeviceCanAccessPeer(int *canAccessPeer, CUdevice dev, CUdevice peerDev) {
    REQUIRE_INIT();
    if (!canAccessPeer) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev) || !valid_dev(peerDev)) return CUDA_ERROR_INVALID_DEVICE;
    *canAccessPeer = peer_capable(dev, peerDev);
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDeviceGetP2PAttribute(int *value, CUdevice_P2PAttribute attrib,
                                                CUdevice srcDevice, CUdevice dstDevice) {
    REQUIRE_INIT();
    if (!value) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(srcDevice) || !valid_dev(dstDevice) || srcDevice == dstDevice)
        return CUDA_ERROR_INVALID_DEVICE;
    int can = peer_capable(srcDevice, dstDevice);
    switch (attrib) {
    case CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK:
        *value = socket_of(dev_phys[srcDevice]) == socket_of(dev_phys[dstDevice]) ? 0 : 1;
        break;
    case CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED: *value = can; break;
    case CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED: *value = 0; break;
    case CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED: *value = can; break;
    case CU_DEVICE_P2P_ATTRIBUTE_ONLY_PARTIAL_NATIVE_ATOMIC_SUPPORTED: *value = 0; break;
    default: return CUDA_ERROR_INVALID_VALUE;
    }
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ contexts */

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    primary[dev].refcount++;
    primary[dev].alive = 1;
    pthread_mutex_unlock(&lock);
    *pctx = &primary[dev];
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev) {
    REQUIRE_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&lock);
    if (primary[dev].refcount <= 0) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--primary[dev].refcount == 0) {
        free_allocs_of(&primary[dev]);
        primary[dev].alive = 0;
        primary[dev].peers = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev) {
    REQUIRE_INIT();
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    free_allocs_of(&primary[dev]);
    primary[dev].peers = 0;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active) {
    REQUIRE_INIT();
    if (!flags || !active) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *flags = 0;
    *active = primary[dev].alive && primary[dev].refcount > 0;
    return CUDA_SUCCESS;
}

static CUresult push(CUcontext ctx) {
    if (ctx_depth >= (int)(sizeof ctx_stack / sizeof ctx_stack[0])) return CUDA_ERROR_OUT_OF_MEMORY;
    ctx_stack[ctx_depth++] = ctx;
    return CUDA_SUCCESS;
}

static CUresult create_ctx(CUcontext *pctx, CUdevice dev) {
    REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    struct CUctx_st *c = calloc(1, sizeof *c);
    if (!c) return CUDA_ERROR_OUT_OF_MEMORY;
    c->dev = dev;
    c->alive = 1;
    CUresult rc = push(c);
    if (rc != CUDA_SUCCESS) { free(c); return rc; }
    *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuCtxCreate(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                    unsigned int flags, CUdevice dev) {
    (void)ctxCreateParams;
    (void)flags;
    return create_ctx(pctx, dev);
}

EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) {
    REQUIRE_INIT();
    if (!valid_ctx(ctx) || ctx->primary) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    free_allocs_of(ctx);
    ctx->alive = 0;  /* the handle stays allocated: a stale handle must not crash */
    pthread_mutex_unlock(&lock);
    /* remove from this thread's stack */
    int j = 0;
    for (int i = 0; i < ctx_depth; i++)
        if (ctx_stack[i] != ctx) ctx_stack[j++] = ctx_stack[i];
    ctx_depth = j;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
    REQUIRE_INIT();
    if (!ctx) {
        if (ctx_depth > 0) ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0) return push(ctx);
    ctx_stack[ctx_depth - 1] = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext *pctx) {
    REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    *pctx = current();
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) {
    REQUIRE_INIT();
    if (!valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    return push(ctx);
}

EXPORT CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) {
    REQUIRE_INIT();
    if (ctx_depth == 0) return CUDA_ERROR_INVALID_CONTEXT;
    CUcontext c = ctx_stack[--ctx_depth];
    if (pctx) *pctx = c;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuCtxGetDevice(CUdevice *device) {
    REQUIRE_INIT();
    if (!device) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = current();
    if (!valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    *device = c->dev;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuCtxSynchronize(void) {
    REQUIRE_INIT();
    if (!valid_ctx(current())) return CUDA_ERROR_INVALID_CONTEXT;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
    REQUIRE_INIT();
    CUcontext c = current();
    if (!valid_ctx(c) || !valid_ctx(peerContext)) return CUDA_ERROR_INVALID_CONTEXT;
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (peerContext->dev == c->dev) return CUDA_ERROR_INVALID_DEVICE;
    if (!peer_capable(c->dev, peerContext->dev)) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    uint64_t bit = 1ULL << peerContext->dev;
    if (c->peers & bit) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    c->peers |= bit;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuCtxDisablePeerAccess(CUcontext peerContext) {
    REQUIRE_INIT();
    CUcontext c = current();
    if (!valid_ctx(c) || !valid_ctx(peerContext)) return CUDA_ERROR_INVALID_CONTEXT;
    uint64_t bit = 1ULL << peerContext->dev;
    if (!(c->peers & bit)) return CUDA_ERROR_PEER_ACCESS_NOT_ENABLED;
    c->peers &= ~bit;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ memory */

EXPORT CUresult CUDAAPI cuMemGetInfo(size_t *free_bytes, size_t *total) {
    REQUIRE_INIT();
    if (!free_bytes || !total) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = current();
    if (!valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    unsigned long long t = cfg.mem_mib * MIB;
    pthread_mutex_lock(&lock);
    unsigned long long used = dev_used[c->dev];
    pthread_mutex_unlock(&lock);
    *total = (size_t)t;
    *free_bytes = (size_t)(used > t ? 0 : t - used);
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
    REQUIRE_INIT();
    if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = current();
    if (!valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    CUresult rc = CUDA_SUCCESS;
    void *p = NULL;
    if (dev_used[c->dev] + bytesize > cfg.mem_mib * MIB) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else if (posix_memalign(&p, 256, bytesize) != 0) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        /* device memory is resident: fault the pages in now so that copies are not
           timed with page faults (huge allocations stay lazy to spare host memory) */
        if (bytesize <= PREFAULT_MAX) memset(p, 0, bytesize);
        if (n_allocs == cap_allocs) {
            size_t ncap = cap_allocs ? cap_allocs * 2 : 64;
            alloc_t *na = realloc(allocs, ncap * sizeof *na);
            if (!na) { free(p); rc = CUDA_ERROR_OUT_OF_MEMORY; }
            else { allocs = na; cap_allocs = ncap; }
        }
        if (rc == CUDA_SUCCESS) {
            allocs[n_allocs++] = (alloc_t){(uintptr_t)p, bytesize, c->dev, c};
            dev_used[c->dev] += bytesize;
            *dptr = (CUdeviceptr)(uintptr_t)p;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT CUresult CUDAAPI cuMemFree(CUdeviceptr dptr) {
    REQUIRE_INIT();
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_allocs; i++) {
        if (allocs[i].base == (uintptr_t)dptr) {
            dev_used[allocs[i].dev] -= allocs[i].size;
            free((void *)allocs[i].base);
            allocs[i] = allocs[--n_allocs];
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* device owning [p, p+n), or -1 when it is not (entirely) device memory */
static int owner(uintptr_t p, size_t n) {
    int dev = -1;
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < n_allocs; i++) {
        if (p >= allocs[i].base && p + n <= allocs[i].base + allocs[i].size) {
            dev = allocs[i].dev;
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return dev;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* A copy between two different devices: paced to P2P_GBPS (1/100 of it in p2p-slow),
   silently corrupted in p2p-corrupt. */
static void peer_copy(void *dst, const void *src, size_t n) {
    double t0 = now_s();
    memmove(dst, src, n);
    if (scenario("p2p-corrupt") && n > 0) {
        unsigned char *d = dst;
        for (size_t i = 0; i < n; i += 4096) d[i] ^= 0xFF;
        d[n - 1] ^= 0xA5;
    }
    double gbps = cfg.p2p_gbps;
    if (scenario("p2p-slow")) gbps /= 100.0;
    if (gbps > 0) {
        double want = (double)n / (gbps * 1e9);
        double left = want - (now_s() - t0);
        if (left > 0) {
            struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
            while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
        }
    }
}

static CUresult copy_dd(CUdeviceptr dst, CUdeviceptr src, size_t n, int need_both) {
    int dd = owner((uintptr_t)dst, n), sd = owner((uintptr_t)src, n);
    if (need_both && (dd < 0 || sd < 0)) return CUDA_ERROR_INVALID_VALUE;
    if (n == 0) return CUDA_SUCCESS;
    if (dd >= 0 && sd >= 0 && dd != sd) peer_copy((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    else memmove((void *)(uintptr_t)dst, (const void *)(uintptr_t)src, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemcpyHtoD(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount) {
    REQUIRE_INIT();
    if (!srcHost || owner((uintptr_t)dstDevice, ByteCount) < 0) return CUDA_ERROR_INVALID_VALUE;
    memcpy((void *)(uintptr_t)dstDevice, srcHost, ByteCount);
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemcpyDtoH(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount) {
    REQUIRE_INIT();
    if (!dstHost || owner((uintptr_t)srcDevice, ByteCount) < 0) return CUDA_ERROR_INVALID_VALUE;
    memcpy(dstHost, (const void *)(uintptr_t)srcDevice, ByteCount);
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemcpyDtoD(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount) {
    REQUIRE_INIT();
    return copy_dd(dstDevice, srcDevice, ByteCount, 1);
}

EXPORT CUresult CUDAAPI cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t ByteCount) {
    REQUIRE_INIT();
    if (!dst || !src) return CUDA_ERROR_INVALID_VALUE;
    return copy_dd(dst, src, ByteCount, 0);
}

EXPORT CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                     CUcontext srcContext, size_t ByteCount) {
    REQUIRE_INIT();
    if (!valid_ctx(dstContext) || !valid_ctx(srcContext)) return CUDA_ERROR_INVALID_CONTEXT;
    int dd = owner((uintptr_t)dstDevice, ByteCount), sd = owner((uintptr_t)srcDevice, ByteCount);
    if (dd != dstContext->dev || sd != srcContext->dev) return CUDA_ERROR_INVALID_VALUE;
    if (ByteCount == 0) return CUDA_SUCCESS;
    if (dd != sd) peer_copy((void *)(uintptr_t)dstDevice, (const void *)(uintptr_t)srcDevice, ByteCount);
    else memmove((void *)(uintptr_t)dstDevice, (const void *)(uintptr_t)srcDevice, ByteCount);
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuMemsetD8(CUdeviceptr dstDevice, unsigned char uc, size_t N) {
    REQUIRE_INIT();
    if (owner((uintptr_t)dstDevice, N) < 0) return CUDA_ERROR_INVALID_VALUE;
    memset((void *)(uintptr_t)dstDevice, uc, N);
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ legacy exports
 * The real driver also exports the older ABI names.  Only those whose signature is
 * identical to the current one (or trivially adaptable) are provided; the 32-bit
 * cuMemAlloc, cuMemcpy... and cuDeviceTotalMem (v1) are deliberately absent: use the _v2 names.
 */
#undef cuCtxDestroy
#undef cuCtxPushCurrent
#undef cuCtxPopCurrent
#undef cuDevicePrimaryCtxRelease
#undef cuDevicePrimaryCtxReset
#undef cuDeviceGetUuid
EXPORT CUresult CUDAAPI cuCtxDestroy(CUcontext ctx) __attribute__((alias("cuCtxDestroy_v2")));
EXPORT CUresult CUDAAPI cuCtxPushCurrent(CUcontext ctx) __attribute__((alias("cuCtxPushCurrent_v2")));
EXPORT CUresult CUDAAPI cuCtxPopCurrent(CUcontext *pctx) __attribute__((alias("cuCtxPopCurrent_v2")));
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease(CUdevice dev)
    __attribute__((alias("cuDevicePrimaryCtxRelease_v2")));
EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset(CUdevice dev)
    __attribute__((alias("cuDevicePrimaryCtxReset_v2")));
EXPORT CUresult CUDAAPI cuDeviceGetUuid(CUuuid *uuid, CUdevice dev) __attribute__((alias("cuDeviceGetUuid_v2")));

/* cuCtxCreate_v2: the pre-CUDA-12.5 signature, what most ctypes callers use. */
EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev);
EXPORT CUresult CUDAAPI cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)flags;
    return create_ctx(pctx, dev);
}
