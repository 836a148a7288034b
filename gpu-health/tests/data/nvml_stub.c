/*
 * A stand-in for libnvidia-ml.so.1, built by tests/nvml_stub.rs with gcc, so the NVML adapter's
 * own code path (dlopen, symbol lookup, each call, each error code) runs without a GPU.
 *
 * It knows four devices by PCI bus ID:
 *   0000:08:00.0  a healthy 16 GiB GPU
 *   0000:41:00.0  a failing 80 GiB GPU (uncorrectable ECC, retired pages, failed row remap, hot)
 *   0000:42:00.0  a GPU on which every query returns NVML_ERROR_NOT_SUPPORTED
 *   0000:43:00.0  a GPU that has fallen off the bus (NVML_ERROR_GPU_IS_LOST)
 * Any other bus ID is NVML_ERROR_NOT_FOUND.
 *
 * Build variants:
 *   -DSTUB_DRIVER_NOT_LOADED  nvmlInit_v2 returns NVML_ERROR_DRIVER_NOT_LOADED
 *   -DSTUB_NO_PERMISSION      nvmlInit_v2 returns NVML_ERROR_NO_PERMISSION
 *   -DSTUB_NO_REMAP           nvmlDeviceGetRemappedRows is not exported (drivers before R450)
 *   -DSTUB_NO_SHUTDOWN        nvmlShutdown is not exported (not a usable NVML)
 *
 * Written for gpuslice from the function signatures and return codes in NVIDIA's public nvml.h
 * documentation.
 */
#include <string.h>

typedef unsigned int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_GPU_IS_LOST = 15,
};

typedef struct {
    const char *bus_id;
    int lost;
    int unsupported;
    unsigned long long ecc[2][2]; /* [error type: 0 corrected, 1 uncorrected][counter: 0 volatile, 1 aggregate] */
    unsigned int retired[2];      /* [cause: 0 multiple single-bit, 1 double-bit] */
    unsigned int pending_retirement;
    unsigned int remap[4];        /* corrected rows, uncorrected rows, pending, failure */
    unsigned int temp, shutdown, slowdown;
    unsigned int replays;
    unsigned long long memory_mib;
} stub_device;

typedef stub_device *nvmlDevice_t;

static stub_device devices[] = {
    {"0000:08:00.0", 0, 0, {{0, 0}, {0, 0}}, {0, 0}, 0, {0, 0, 0, 0}, 41, 95, 90, 0, 16384},
    {"0000:41:00.0", 0, 0, {{5, 7}, {3, 3}}, {2, 1}, 1, {1, 2, 1, 1}, 96, 95, 90, 12, 81920},
    {"0000:42:00.0", 0, 1, {{0, 0}, {0, 0}}, {0, 0}, 0, {0, 0, 0, 0}, 0, 0, 0, 0, 0},
    {"0000:43:00.0", 1, 0, {{0, 0}, {0, 0}}, {0, 0}, 0, {0, 0, 0, 0}, 0, 0, 0, 0, 0},
};

static int initialized;

nvmlReturn_t nvmlInit_v2(void) {
#if defined(STUB_DRIVER_NOT_LOADED)
    return NVML_ERROR_DRIVER_NOT_LOADED;
#elif defined(STUB_NO_PERMISSION)
    return NVML_ERROR_NO_PERMISSION;
#else
    initialized = 1;
    return NVML_SUCCESS;
#endif
}

#ifndef STUB_NO_SHUTDOWN
nvmlReturn_t nvmlShutdown(void) {
    initialized = 0;
    return NVML_SUCCESS;
}
#endif

const char *nvmlErrorString(nvmlReturn_t result) {
    (void)result;
    return "stub error";
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    const char *v = "550.54.15";
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (length < strlen(v) + 1) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, v);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!bus_id || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < sizeof devices / sizeof devices[0]; i++) {
        if (strcmp(devices[i].bus_id, bus_id) == 0) {
            if (devices[i].lost) return NVML_ERROR_GPU_IS_LOST;
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

#define CHECK(d)                                          \
    do {                                                  \
        if (!initialized) return NVML_ERROR_UNINITIALIZED; \
        if (!(d)) return NVML_ERROR_INVALID_ARGUMENT;     \
        if ((d)->unsupported) return NVML_ERROR_NOT_SUPPORTED; \
    } while (0)

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;

nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t d, nvmlMemory_v2_t *m) {
    CHECK(d);
    if (!m) return NVML_ERROR_INVALID_ARGUMENT;
    m->total = d->memory_mib * 1024ULL * 1024ULL;
    m->reserved = 0;
    m->used = 512ULL * 1024ULL * 1024ULL;
    m->free = m->total - m->used;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t d, unsigned int type, unsigned int counter,
                                         unsigned long long *count) {
    CHECK(d);
    if (type > 1 || counter > 1 || !count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = d->ecc[type][counter];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t d, unsigned int cause, unsigned int *count,
                                       unsigned long long *addresses) {
    CHECK(d);
    if (cause > 1 || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = d->retired[cause];
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) addresses[i] = 0x1000ULL * (i + 1);
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t d, unsigned int cause, unsigned int *count,
                                          unsigned long long *addresses,
                                          unsigned long long *timestamps) {
    CHECK(d);
    if (cause > 1 || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = d->retired[cause];
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    for (unsigned int i = 0; i < n; i++) {
        addresses[i] = 0x1000ULL * (i + 1);
        timestamps[i] = 1700000000ULL + i;
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t d, unsigned int *pending) {
    CHECK(d);
    if (!pending) return NVML_ERROR_INVALID_ARGUMENT;
    *pending = d->pending_retirement; /* nvmlEnableState_t: 0 disabled, 1 enabled */
    return NVML_SUCCESS;
}

#ifndef STUB_NO_REMAP
nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t d, unsigned int *corr, unsigned int *unc,
                                       unsigned int *pending, unsigned int *failure) {
    CHECK(d);
    if (!corr || !unc || !pending || !failure) return NVML_ERROR_INVALID_ARGUMENT;
    *corr = d->remap[0];
    *unc = d->remap[1];
    *pending = d->remap[2];
    *failure = d->remap[3];
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t d, unsigned int sensor, unsigned int *temp) {
    CHECK(d);
    if (sensor != 0 || !temp) return NVML_ERROR_INVALID_ARGUMENT;
    *temp = d->temp;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t d, unsigned int kind,
                                               unsigned int *temp) {
    CHECK(d);
    if (!temp) return NVML_ERROR_INVALID_ARGUMENT;
    switch (kind) {
    case 0: *temp = d->shutdown; return NVML_SUCCESS; /* NVML_TEMPERATURE_THRESHOLD_SHUTDOWN */
    case 1: *temp = d->slowdown; return NVML_SUCCESS; /* NVML_TEMPERATURE_THRESHOLD_SLOWDOWN */
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t d, unsigned int *value) {
    CHECK(d);
    if (!value) return NVML_ERROR_INVALID_ARGUMENT;
    *value = d->replays;
    return NVML_SUCCESS;
}
