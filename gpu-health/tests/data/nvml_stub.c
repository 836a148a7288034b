/*
 * A stand-in for libnvidia-ml.so.1, built by tests/nvml_stub.rs with gcc, so the NVML adapter's
 * own code path (dlopen, symbol lookup, each call, each error code) runs without a GPU.
 *
 * It knows five devices by PCI bus ID:
 *   0000:08:00.0  a healthy 16 GiB GPU
 *   0000:41:00.0  a failing 80 GiB GPU (uncorrectable ECC, retired pages, failed row remap, hot)
 *   0000:42:00.0  a GPU on which every query returns NVML_ERROR_NOT_SUPPORTED
 *   0000:43:00.0  a GPU that has fallen off the bus (NVML_ERROR_GPU_IS_LOST)
 *   0000:18:00.0  a healthy H200 SXM (141 GiB) in MIG mode that takes no events
 * Any other bus ID is NVML_ERROR_NOT_FOUND. Initialization is counted, as NVML counts it: each
 * nvmlInit_v2 needs its nvmlShutdown.
 *
 * MIG: only the H200 has GPU-instance profiles (those of NVIDIA's H200 table: 1g.18gb, 1g.18gb+me,
 * 1g.35gb, 2g.35gb, 3g.71gb, 4g.71gb, 7g.141gb, by NVML's profile indices and IDs); the others
 * answer NVML_ERROR_NOT_SUPPORTED. Its GPU instances are STUB_MIG_GI, a list of
 * {profile ID, placement start, placement size} (placements in memory slices, as NVML gives
 * them); by default two 1g.18gb at memory slices 0 and 4: {19,0,1},{19,4,1}.
 * -DSTUB_MIG_GI='{19,0,1},{19,1,1}' puts them at 0 and 1; one entry leaves one.
 *
 * Events: every device but the unsupported one and the H200 takes XID and ECC event
 * registrations (the lost one has no PCI info, so it cannot be named). The first wait on an event set returns XID 79 on
 * 0000:08:00.0, the second a double-bit ECC error on 0000:41:00.0, every later one times out
 * (after at most 50 ms).
 *
 * Build variants:
 *   -DSTUB_DRIVER_NOT_LOADED  nvmlInit_v2 returns NVML_ERROR_DRIVER_NOT_LOADED
 *   -DSTUB_NO_PERMISSION      nvmlInit_v2 returns NVML_ERROR_NO_PERMISSION
 *   -DSTUB_INIT_ONCE          a second nvmlInit_v2 while loaded returns NVML_ERROR_UNKNOWN
 *   -DSTUB_NO_REMAP           nvmlDeviceGetRemappedRows is not exported (drivers before R450)
 *   -DSTUB_NO_SHUTDOWN        nvmlShutdown is not exported (not a usable NVML)
 *   -DSTUB_NO_GI_INFO         nvmlGpuInstanceGetInfo is not exported (a driver without MIG calls)
 *   -DSTUB_GI_NO_PERMISSION   nvmlDeviceGetGpuInstances returns NVML_ERROR_NO_PERMISSION (as for
 *                             a user who is not root)
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
    NVML_ERROR_UNKNOWN = 999,
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
    int mig;       /* in MIG mode with the H200's GPU-instance profiles */
    int no_events; /* takes no event registration */
} stub_device;

typedef stub_device *nvmlDevice_t;

static stub_device devices[] = {
    {"0000:08:00.0", 0, 0, {{0, 0}, {0, 0}}, {0, 0}, 0, {0, 0, 0, 0}, 41, 95, 90, 0, 16384},
    {"0000:41:00.0", 0, 0, {{5, 7}, {3, 3}}, {2, 1}, 1, {1, 2, 1, 1}, 96, 95, 90, 12, 81920},
    {"0000:42:00.0", 0, 1, {{0, 0}, {0, 0}}, {0, 0}, 0, {0, 0, 0, 0}, 0, 0, 0, 0, 0},
    {"0000:43:00.0", 1, 0, {{0, 0}, {0, 0}}, {0, 0}, 0, {0, 0, 0, 0}, 0, 0, 0, 0, 0},
    {"0000:18:00.0", 0, 0, {{0, 0}, {0, 0}}, {0, 0}, 0, {0, 0, 0, 0}, 35, 95, 90, 0, 144384, 1, 1},
};

static int initialized;

nvmlReturn_t nvmlInit_v2(void) {
#if defined(STUB_DRIVER_NOT_LOADED)
    return NVML_ERROR_DRIVER_NOT_LOADED;
#elif defined(STUB_NO_PERMISSION)
    return NVML_ERROR_NO_PERMISSION;
#else
#ifdef STUB_INIT_ONCE
    static int inits_ever;
    if (inits_ever++ > 0) return NVML_ERROR_UNKNOWN;
#endif
    initialized++;
    return NVML_SUCCESS;
#endif
}

#ifndef STUB_NO_SHUTDOWN
nvmlReturn_t nvmlShutdown(void) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    initialized--;
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
    if (d->no_events) return NVML_ERROR_NOT_SUPPORTED;
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

/* ----- MIG: GPU-instance profiles, GPU instances and their placements ----- */

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
    unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int start, size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    unsigned int profile_id, start, size;
} stub_gi;
typedef stub_gi *nvmlGpuInstance_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

/* By NVML profile index: {index, profile ID, compute slices, most instances, memory MiB}. */
static const struct {
    unsigned int index, id, slices, count;
    unsigned long long mib;
} h200_profiles[] = {
    {0, 19, 1, 7, 16384},  /* NVML_GPU_INSTANCE_PROFILE_1_SLICE: 1g.18gb */
    {7, 20, 1, 1, 16384},  /* 1_SLICE_REV1: 1g.18gb+me */
    {9, 15, 1, 4, 32768},  /* 1_SLICE_REV2: 1g.35gb */
    {1, 14, 2, 3, 32768},  /* 2_SLICE: 2g.35gb */
    {2, 9, 3, 2, 71680},   /* 3_SLICE: 3g.71gb */
    {3, 5, 4, 1, 71680},   /* 4_SLICE: 4g.71gb */
    {4, 0, 7, 1, 143360},  /* 7_SLICE: 7g.141gb */
};
#define NPROFILES (sizeof h200_profiles / sizeof h200_profiles[0])

#ifndef STUB_MIG_GI
#define STUB_MIG_GI {19, 0, 1}, {19, 4, 1}
#endif
static stub_gi gpu_instances[] = {STUB_MIG_GI};
#define NGIS (sizeof gpu_instances / sizeof gpu_instances[0])

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int profile,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    CHECK(d);
    if (!info) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig) return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned i = 0; i < NPROFILES; i++) {
        if (h200_profiles[i].index == profile) {
            memset(info, 0, sizeof *info);
            info->id = h200_profiles[i].id;
            info->sliceCount = h200_profiles[i].slices;
            info->instanceCount = h200_profiles[i].count;
            info->memorySizeMB = h200_profiles[i].mib;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t d, unsigned int profile_id,
                                       nvmlGpuInstance_t *instances, unsigned int *count) {
    CHECK(d);
    if (!instances || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig) return NVML_ERROR_NOT_SUPPORTED;
#ifdef STUB_GI_NO_PERMISSION
    return NVML_ERROR_NO_PERMISSION;
#endif
    unsigned int room = 0, n = 0;
    for (unsigned i = 0; i < NPROFILES; i++)
        if (h200_profiles[i].id == profile_id) room = h200_profiles[i].count;
    for (unsigned i = 0; i < NGIS; i++) {
        if (gpu_instances[i].profile_id != profile_id) continue;
        if (n >= room) return NVML_ERROR_INSUFFICIENT_SIZE;
        instances[n++] = &gpu_instances[i];
    }
    *count = n;
    return NVML_SUCCESS;
}

#ifndef STUB_NO_GI_INFO
nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    if (!gi || !info) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = &devices[4];
    info->id = (unsigned int)(gi - gpu_instances) + 1;
    info->profileId = gi->profile_id;
    info->placement.start = gi->start;
    info->placement.size = gi->size;
    return NVML_SUCCESS;
}
#endif
