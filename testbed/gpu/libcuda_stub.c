/*
 * libcuda.so.1 stand-in for the sglang-deploy testbed (no GPU anywhere): the driver API
 * subset that sglang_deploy/remote/cuda_probe.py calls.
 *
 * Built against the REAL cuda.h: every function below is defined with the exact
 * signature the header declares, and the header's macros map the plain names to the
 * versioned symbols the real driver exports (cuMemAlloc -> cuMemAlloc_v2, ...).  Device
 * memory is host memory; the CUdeviceptr is the host address.  Behaviour comes from
 * /etc/testbed/gpu.env ($TESTBED_GPU_ENV), re-read at every cuInit; device nodes are
 * checked under $TESTBED_DEV_ROOT (default /dev).  See testbed/gpu/README.md.
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

static struct {
    int gpu_count;
    char gpu_name[256];
    unsigned long long mem_mib;
    int cc_major, cc_minor;
    int cuda_version; /* "13.0" -> 13000 */
    double p2p_gbps;
    char scenario[64];
} cfg;
static int cfg_loaded;

static long parse_long(const char *s, long dflt) {
    char *end;
    long v = strtol(s, &end, 10);
    return end == s ? dflt : v;
}

static void set_key(const char *key, const char *val) {
    int a = 0, b = 0;
    if (!strcmp(key, "GPU_COUNT")) cfg.gpu_count = (int)parse_long(val, 8);
    else if (!strcmp(key, "GPU_NAME")) snprintf(cfg.gpu_name, sizeof cfg.gpu_name, "%s", val);
    else if (!strcmp(key, "GPU_MEMORY_MIB")) cfg.mem_mib = (unsigned long long)parse_long(val, 97887);
    else if (!strcmp(key, "GPU_CC") && sscanf(val, "%d.%d", &a, &b) >= 1) {
        cfg.cc_major = a;
        cfg.cc_minor = b;
    } else if (!strcmp(key, "CUDA_VERSION") && sscanf(val, "%d.%d", &a, &b) >= 1) {
        cfg.cuda_version = a * 1000 + b * 10;
    } else if (!strcmp(key, "P2P_GBPS")) {
        char *end;
        double v = strtod(val, &end);
        cfg.p2p_gbps = end == val ? 40.0 : v;
    } else if (!strcmp(key, "SCENARIO")) snprintf(cfg.scenario, sizeof cfg.scenario, "%s", val);
}

/* strip blanks (and the newline), then one pair of surrounding quotes */
static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n && strchr(" \t\r\n", s[n - 1])) s[--n] = 0;
    if (n >= 2 && (s[0] == '"' || s[0] == '\'') && s[n - 1] == s[0]) {
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
    cfg.cuda_version = 13000;
    cfg.p2p_gbps = 40.0;
    snprintf(cfg.scenario, sizeof cfg.scenario, "healthy");
    const char *path = getenv("TESTBED_GPU_ENV");
    FILE *f = fopen(path && *path ? path : "/etc/testbed/gpu.env", "r");
    if (f) {
        char line[1024];
        while (fgets(line, sizeof line, f)) {
            char *l = trim(line), *eq = strchr(l, '=');
            if (*l == '#' || !eq) continue;
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
    if (cfg.gpu_count < 0) cfg.gpu_count = 0;
    if (cfg.gpu_count > MAX_DEV) cfg.gpu_count = MAX_DEV;
    cfg_loaded = 1;
}

static int scenario(const char *name) { return strcmp(cfg.scenario, name) == 0; }

/* ------------------------------------------------------------------ state */

struct CUctx_st {      /* only primary contexts exist */
    int dev;           /* ordinal */
    int refcount;
    uint64_t peers;    /* bit per ordinal: peer access enabled from this context */
};

typedef struct {
    uintptr_t base;
    size_t size;
    int dev;
} alloc_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int initialized;            /* cuInit succeeded */
static int dev_count;
static int dev_phys[MAX_DEV];      /* ordinal -> physical index (/dev/nvidiaN) */
static struct CUctx_st primary[MAX_DEV];
static unsigned long long dev_used[MAX_DEV];
static alloc_t *allocs;
static size_t n_allocs, cap_allocs;

static __thread CUcontext current;

#define REQUIRE_INIT() do { if (!initialized) return CUDA_ERROR_NOT_INITIALIZED; } while (0)

static int valid_dev(CUdevice d) { return d >= 0 && d < dev_count; }
static int valid_ctx(CUcontext c) { return c && c->refcount > 0; }

/* Open the node read-write as the real driver does. EPERM/EACCES: the container's device
 * cgroup refused it. The stand-in nodes have no kernel driver behind them, so a PERMITTED
 * open answers ENXIO: that counts as present. */
enum { NODE_MISSING, NODE_DENIED, NODE_OK };
static int node(const char *name) {
    const char *root = getenv("TESTBED_DEV_ROOT");
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", root && *root ? root : "/dev", name);
    int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd >= 0) {
        close(fd);
        return NODE_OK;
    }
    if (errno == ENOENT || errno == ENOTDIR) return NODE_MISSING;
    return errno == EPERM || errno == EACCES ? NODE_DENIED : NODE_OK;
}

/* PCI bus numbers of an 8-GPU server, as nvidia_smi.py's BUS_NUMBERS */
static const int bus_numbers[8] = {0x01, 0x25, 0x41, 0x61, 0x81, 0xA1, 0xC1, 0xE1};
static int bus_number(int phys) { return phys < 8 ? bus_numbers[phys] : ((0x01 + 0x10 * phys) & 0xFF); }

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

/* *pStr = the name (want_name) or the text of ERROR; NULL and INVALID_VALUE if unknown */
static CUresult error_info(CUresult error, const char **pStr, int want_name) {
    if (!pStr) return CUDA_ERROR_INVALID_VALUE;
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++) {
        if (errors[i].code == error) {
            *pStr = want_name ? errors[i].name : errors[i].text;
            return CUDA_SUCCESS;
        }
    }
    *pStr = NULL;
    return CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult CUDAAPI cuGetErrorString(CUresult error, const char **pStr) {
    return error_info(error, pStr, 0);
}

EXPORT CUresult CUDAAPI cuGetErrorName(CUresult error, const char **pStr) {
    return error_info(error, pStr, 1);
}

/* ------------------------------------------------------------------ init / version / devices */

static void free_allocs_of(int dev) {
    size_t j = 0;
    for (size_t i = 0; i < n_allocs; i++) {
        if (allocs[i].dev == dev) {
            dev_used[dev] -= allocs[i].size;
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
    int count = cfg.gpu_count;
    if (scenario("gpu-missing") && count > 0) count--;
    int n = 0;
    for (int i = 0; i < count; i++) {
        char name[32];
        snprintf(name, sizeof name, "nvidia%d", i);
        if (node(name) == NODE_OK) dev_phys[n++] = i;
    }
    int ctl = node("nvidiactl");
    CUresult rc = CUDA_SUCCESS;
    if (scenario("driver-mismatch")) rc = CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    /* like the real driver: nvidiactl that cannot be opened -> 999 at initialisation */
    else if (ctl == NODE_DENIED) rc = CUDA_ERROR_UNKNOWN;
    else if (ctl == NODE_MISSING || n == 0) rc = CUDA_ERROR_NO_DEVICE;
    else if (scenario("uvm-missing") || node("nvidia-uvm") != NODE_OK) rc = CUDA_ERROR_UNKNOWN;
    if (rc == CUDA_SUCCESS && !initialized) {
        for (int i = 0; i < MAX_DEV; i++) primary[i] = (struct CUctx_st){.dev = i};
    }
    initialized = rc == CUDA_SUCCESS;
    dev_count = initialized ? n : 0;
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT CUresult CUDAAPI cuDriverGetVersion(int *driverVersion) {
    if (!driverVersion) return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&lock);
    if (!cfg_loaded) load_config();
    pthread_mutex_unlock(&lock);
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
    switch (attrib) {
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = cfg.cc_major; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = cfg.cc_minor; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = 188; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = bus_number(dev_phys[dev]); break;
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING: *pi = 1; break;
    default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuDeviceTotalMem(size_t *bytes, CUdevice dev) {
    REQUIRE_INIT();
    if (!bytes) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    *bytes = (size_t)(cfg.mem_mib * MIB);
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

/* ------------------------------------------------------------------ contexts */

EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    REQUIRE_INIT();
    if (!pctx) return CUDA_ERROR_INVALID_VALUE;
    if (!valid_dev(dev)) return CUDA_ERROR_INVALID_DEVICE;
    pthread_mutex_lock(&lock);
    primary[dev].refcount++;
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
        free_allocs_of(dev);
        primary[dev].peers = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext ctx) {
    REQUIRE_INIT();
    if (ctx && !valid_ctx(ctx)) return CUDA_ERROR_INVALID_CONTEXT;
    current = ctx;
    return CUDA_SUCCESS;
}

EXPORT CUresult CUDAAPI cuCtxSynchronize(void) {
    REQUIRE_INIT();
    return valid_ctx(current) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

EXPORT CUresult CUDAAPI cuCtxEnablePeerAccess(CUcontext peerContext, unsigned int Flags) {
    REQUIRE_INIT();
    CUcontext c = current;
    if (!valid_ctx(c) || !valid_ctx(peerContext)) return CUDA_ERROR_INVALID_CONTEXT;
    if (Flags != 0) return CUDA_ERROR_INVALID_VALUE;
    if (peerContext->dev == c->dev) return CUDA_ERROR_INVALID_DEVICE;
    if (!peer_capable(c->dev, peerContext->dev)) return CUDA_ERROR_PEER_ACCESS_UNSUPPORTED;
    uint64_t bit = 1ULL << peerContext->dev;
    if (c->peers & bit) return CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED;
    c->peers |= bit;
    return CUDA_SUCCESS;
}

/* ------------------------------------------------------------------ memory */

EXPORT CUresult CUDAAPI cuMemAlloc(CUdeviceptr *dptr, size_t bytesize) {
    REQUIRE_INIT();
    if (!dptr || bytesize == 0) return CUDA_ERROR_INVALID_VALUE;
    CUcontext c = current;
    if (!valid_ctx(c)) return CUDA_ERROR_INVALID_CONTEXT;
    pthread_mutex_lock(&lock);
    void *p = NULL;
    if (n_allocs == cap_allocs) {
        size_t ncap = cap_allocs ? cap_allocs * 2 : 64;
        alloc_t *na = realloc(allocs, ncap * sizeof *na);
        if (na) {
            allocs = na;
            cap_allocs = ncap;
        }
    }
    if (n_allocs == cap_allocs || dev_used[c->dev] + bytesize > cfg.mem_mib * MIB ||
        posix_memalign(&p, 256, bytesize) != 0) {
        pthread_mutex_unlock(&lock);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    /* device memory is resident: fault the pages in now so that copies are not
       timed with page faults (huge allocations stay lazy to spare host memory) */
    if (bytesize <= PREFAULT_MAX) memset(p, 0, bytesize);
    allocs[n_allocs++] = (alloc_t){(uintptr_t)p, bytesize, c->dev};
    dev_used[c->dev] += bytesize;
    *dptr = (CUdeviceptr)(uintptr_t)p;
    pthread_mutex_unlock(&lock);
    return CUDA_SUCCESS;
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
    if (scenario("p2p-corrupt")) {
        unsigned char *d = dst;
        for (size_t i = 0; i < n; i += 4096) d[i] ^= 0xFF;
        d[n - 1] ^= 0xA5;
    }
    double gbps = cfg.p2p_gbps;
    if (scenario("p2p-slow")) gbps /= 100.0;
    if (gbps > 0) {
        double left = (double)n / (gbps * 1e9) - (now_s() - t0);
        if (left > 0) {
            struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
            while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {}
        }
    }
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

/* Every copy between two devices appends one line to $TESTBED_PEER_COPIES (default
 * /var/log/testbed-gpu-peer-copies) when that file exists (the testbed makes it in each
 * host), so a test can count them: a read-only command must make none on a serving host. */
static void count_peer_copy(void) {
    const char *path = getenv("TESTBED_PEER_COPIES");
    int fd = open(path && *path ? path : "/var/log/testbed-gpu-peer-copies",
                  O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) return;
    char line[32];
    int n = snprintf(line, sizeof line, "%ld\n", (long)getpid());
    if (n > 0 && write(fd, line, (size_t)n) < 0) { /* best effort */ }
    close(fd);
}

/* Works without enabled peer access, as on real hardware (staged through the host). */
EXPORT CUresult CUDAAPI cuMemcpyPeer(CUdeviceptr dstDevice, CUcontext dstContext, CUdeviceptr srcDevice,
                                     CUcontext srcContext, size_t ByteCount) {
    REQUIRE_INIT();
    if (!valid_ctx(dstContext) || !valid_ctx(srcContext)) return CUDA_ERROR_INVALID_CONTEXT;
    int dd = owner((uintptr_t)dstDevice, ByteCount), sd = owner((uintptr_t)srcDevice, ByteCount);
    if (dd != dstContext->dev || sd != srcContext->dev) return CUDA_ERROR_INVALID_VALUE;
    if (ByteCount == 0) return CUDA_SUCCESS;
    if (dd != sd) {
        count_peer_copy();
        peer_copy((void *)(uintptr_t)dstDevice, (const void *)(uintptr_t)srcDevice, ByteCount);
    }
    else memmove((void *)(uintptr_t)dstDevice, (const void *)(uintptr_t)srcDevice, ByteCount);
    return CUDA_SUCCESS;
}
