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
 * Events: every device but the unsupported one takes XID and ECC event registrations (the lost
 * one has no PCI info, so it cannot be named). The first wait on an event set returns XID 79 on
 * 0000:08:00.0, the second a double-bit ECC error on 0000:41:00.0, every later one times out
 * (after at most 50 ms).
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
#include <stdio.h>
#include <string.h>
#include <unistd.h>

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

/* ----- devices by index, PCI info and events ----- */

#define NDEVICES (sizeof devices / sizeof devices[0])

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType;
    unsigned long long eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

typedef struct {
    unsigned int registered; /* one bit per device index */
    unsigned int next;
} stub_set;
typedef stub_set *nvmlEventSet_t;

enum {
    EVENT_DOUBLE_BIT_ECC = 0x2,
    EVENT_XID_CRITICAL = 0x8,
    NVML_ERROR_TIMEOUT = 10,
};

static stub_set the_set;

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = NDEVICES;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= NDEVICES) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t d, nvmlPciInfo_t *p) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!d || !p) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->lost) return NVML_ERROR_GPU_IS_LOST;
    memset(p, 0, sizeof *p);
    /* NVML's bus ID has an 8-digit domain: 00000000:08:00.0. */
    snprintf(p->busId, sizeof p->busId, "0000%s", d->bus_id);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t d, unsigned long long *types) {
    CHECK(d);
    if (!types) return NVML_ERROR_INVALID_ARGUMENT;
    *types = EVENT_DOUBLE_BIT_ECC | EVENT_XID_CRITICAL | 0x1 | 0x4;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    memset(&the_set, 0, sizeof the_set);
    *set = &the_set;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t d, unsigned long long types, nvmlEventSet_t set) {
    CHECK(d);
    if (!set || !types) return NVML_ERROR_INVALID_ARGUMENT;
    set->registered |= 1u << (unsigned)(d - devices);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!set || !data) return NVML_ERROR_INVALID_ARGUMENT;
    memset(data, 0, sizeof *data);
    if (set->next == 0 && (set->registered & 1u)) {
        set->next++;
        data->device = &devices[0];
        data->eventType = EVENT_XID_CRITICAL;
        data->eventData = 79;
        return NVML_SUCCESS;
    }
    if (set->next <= 1 && (set->registered & 2u)) {
        set->next = 2;
        data->device = &devices[1];
        data->eventType = EVENT_DOUBLE_BIT_ECC;
        return NVML_SUCCESS;
    }
    usleep((timeoutms < 50 ? timeoutms : 50) * 1000);
    return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    (void)set;
    return NVML_SUCCESS;
}
