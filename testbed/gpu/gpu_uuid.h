/* The stand-ins' GPU UUID: 16 bytes per (host, index), the bytes of nvidia_smi.py's
 * gpu_uuid_bytes. Shared by libcuda_stub.c (cuDeviceGetUuid) and nvidia_smi_fast.c (the
 * uuid column), so that the driver and nvidia-smi name each GPU alike. Both builds hash
 * this file (build.py). */
#ifndef TESTBED_GPU_UUID_H
#define TESTBED_GPU_UUID_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static inline uint64_t gpu_uuid_fnv1a64(uint64_t h, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) {
        h ^= (unsigned char)s[i];
        h *= 0x100000001B3ULL;
    }
    return h;
}

static inline uint64_t gpu_uuid_mix64(uint64_t z) { /* splitmix64's finaliser */
    z += 0x9E3779B97F4A7C15ULL;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* half h of the UUID: mix64(fnv1a64("testbed-gpu:<host>:<index>:<h>")), big-endian */
static inline void gpu_uuid_bytes(const char *host, long long index, unsigned char raw[16]) {
    for (int half = 0; half < 2; half++) {
        char tail[64];
        int tl = snprintf(tail, sizeof tail, ":%lld:%d", index, half);
        uint64_t x = 0xCBF29CE484222325ULL;
        x = gpu_uuid_fnv1a64(x, "testbed-gpu:", 12);
        x = gpu_uuid_fnv1a64(x, host, strlen(host));
        x = gpu_uuid_fnv1a64(x, tail, (size_t)tl);
        x = gpu_uuid_mix64(x);
        for (int i = 0; i < 8; i++) raw[half * 8 + i] = (unsigned char)(x >> (56 - 8 * i));
    }
}

#endif
