/*
 * A stand-in for libnvidia-ml.so.1 with NVML's partition calls, built by tests/real_stub.rs with
 * gcc, so NvmlLibrary's raw calls (symbol lookup, struct versions, buffer sizes, each return
 * code) run for real without a GPU.
 *
 * Two devices by PCI bus ID:
 *   0000:18:00.0  an H100 SXM5 80GB, MIG mode off, module ID 5; GPU-instance profiles 1g.10gb
 *                 (ID 19, index 0) and 3g.40gb (ID 9, index 2) only, answered in MIG mode
 *   0000:3b:00.0  an L40S with mixed-size vGPU support (homogeneous mode), type 2 (size 12 at
 *                 0/12/24/36) running as vGPU instance 7 at placement 12; no MIG, no module ID
 * Any other bus ID is NVML_ERROR_NOT_FOUND.
 *
 * Versioned structs are checked as NVML checks them (NVML_STRUCT_VERSION: sizeof | ver << 24);
 * a wrong version answers NVML_ERROR_ARGUMENT_VERSION_MISMATCH.
 *
 * Build variants:
 *   -DSTUB_ACTIVATION=19   nvmlDeviceSetMigMode leaves the mode pending with this activation
 *                          status (19 IN_USE, 16 RESET_REQUIRED)
 *   -DSTUB_NO_WRITES       the GPU-instance create/destroy and heterogeneous-mode set calls are
 *                          not exported (an older driver)
 *
 * Written for gpuslice from the function signatures, struct layouts and return codes of NVIDIA's
 * public nvml.h documentation.
 */
#include <string.h>

typedef unsigned int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_IN_USE = 19,
    NVML_ERROR_INSUFFICIENT_RESOURCES = 23,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
};

#ifndef STUB_ACTIVATION
#define STUB_ACTIVATION 0
#endif

typedef struct {
    const char *bus_id;
    int mig_capable;
    unsigned int mig_current, mig_pending;
    int module_id; /* -1: none */
    int mixed;     /* mixed-size vGPU support */
    unsigned int vgpu_mode; /* 0 heterogeneous, 1 homogeneous */
} stub_device;
typedef stub_device *nvmlDevice_t;

static stub_device devices[] = {
    {"0000:18:00.0", 1, 0, 0, 5, 0, 1},
    {"0000:3b:00.0", 0, 0, 0, -1, 1, 1},
};
#define H100 (&devices[0])
#define L40S (&devices[1])

static int initialized;

nvmlReturn_t nvmlInit_v2(void) { initialized++; return NVML_SUCCESS; }
nvmlReturn_t nvmlShutdown(void) { if (initialized) initialized--; return NVML_SUCCESS; }

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    const char *v = "575.51.02";
    if (!version || length <= strlen(v)) return NVML_ERROR_INSUFFICIENT_SIZE;
    strcpy(version, v);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus_id, nvmlDevice_t *device) {
    if (!initialized) return NVML_ERROR_UNINITIALIZED;
    for (unsigned i = 0; i < sizeof devices / sizeof devices[0]; i++) {
        if (strcmp(bus_id, devices[i].bus_id) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

nvmlReturn_t nvmlDeviceGetModuleId(nvmlDevice_t d, unsigned int *id) {
    if (!d || !id) return NVML_ERROR_INVALID_ARGUMENT;
    if (d->module_id < 0) return NVML_ERROR_NOT_SUPPORTED;
    *id = (unsigned int)d->module_id;
    return NVML_SUCCESS;
}

/* ----- MIG mode ----- */

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t d, unsigned int *current, unsigned int *pending) {
    if (!d || !current || !pending) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    *current = d->mig_current;
    *pending = d->mig_pending;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t d, unsigned int mode, nvmlReturn_t *activation) {
    if (!d || !activation || mode > 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    d->mig_pending = mode;
    *activation = STUB_ACTIVATION;
    if (STUB_ACTIVATION == 0) d->mig_current = mode;
    return NVML_SUCCESS;
}

/* ----- GPU instances ----- */

typedef struct {
    unsigned int id, isP2pSupported, sliceCount, instanceCount, multiprocessorCount;
    unsigned int copyEngineCount, decoderCount, encoderCount, jpegCount, ofaCount;
    unsigned long long memorySizeMB;
} nvmlGpuInstanceProfileInfo_t;

typedef struct {
    unsigned int start, size;
} nvmlGpuInstancePlacement_t;

typedef struct {
    int used;
    unsigned int id, profile_id;
    nvmlGpuInstancePlacement_t placement;
} stub_gi;
typedef stub_gi *nvmlGpuInstance_t;

typedef struct {
    nvmlDevice_t device;
    unsigned int id, profileId;
    nvmlGpuInstancePlacement_t placement;
} nvmlGpuInstanceInfo_t;

static stub_gi gis[8];
static unsigned int next_gi = 1;

/* {index, ID, slices, most instances, memory slices, MiB} */
static const struct {
    unsigned int index, id, slices, count, size;
    unsigned long long mib;
} profiles[] = {
    {0, 19, 1, 7, 1, 9984},
    {2, 9, 3, 2, 4, 40448},
};
#define NPROFILES (sizeof profiles / sizeof profiles[0])

static int profile_by_id(unsigned int id) {
    for (unsigned i = 0; i < NPROFILES; i++)
        if (profiles[i].id == id) return (int)i;
    return -1;
}

nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t d, unsigned int index,
                                                 nvmlGpuInstanceProfileInfo_t *info) {
    if (!d || !info) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable || !d->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned i = 0; i < NPROFILES; i++) {
        if (profiles[i].index == index) {
            memset(info, 0, sizeof *info);
            info->id = profiles[i].id;
            info->sliceCount = profiles[i].slices;
            info->instanceCount = profiles[i].count;
            info->memorySizeMB = profiles[i].mib;
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_SUPPORTED;
}

nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(nvmlDevice_t d, unsigned int profile_id,
                                                           nvmlGpuInstancePlacement_t *out,
                                                           unsigned int *count) {
    if (!d || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable) return NVML_ERROR_NOT_SUPPORTED;
    int p = profile_by_id(profile_id);
    if (p < 0) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int size = profiles[p].size, n = size == 1 ? 7 : 2;
    if (!out) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) return NVML_ERROR_INSUFFICIENT_SIZE;
    for (unsigned i = 0; i < n; i++) {
        out[i].start = i * size;
        out[i].size = size;
    }
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gi, nvmlGpuInstanceInfo_t *info) {
    if (!gi || !info || !gi->used) return NVML_ERROR_INVALID_ARGUMENT;
    info->device = H100;
    info->id = gi->id;
    info->profileId = gi->profile_id;
    info->placement = gi->placement;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t d, unsigned int profile_id,
                                       nvmlGpuInstance_t *out, unsigned int *count) {
    if (!d || !out || !count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable || !d->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    unsigned int n = 0;
    for (unsigned i = 0; i < sizeof gis / sizeof gis[0]; i++) {
        if (!gis[i].used || gis[i].profile_id != profile_id) continue;
        if (n >= *count) return NVML_ERROR_INSUFFICIENT_SIZE;
        out[n++] = &gis[i];
    }
    *count = n;
    return NVML_SUCCESS;
}

#ifndef STUB_NO_WRITES
nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(nvmlDevice_t d, unsigned int profile_id,
                                                      const nvmlGpuInstancePlacement_t *at,
                                                      nvmlGpuInstance_t *out) {
    if (!d || !at || !out) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable || !d->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    int p = profile_by_id(profile_id);
    if (p < 0 || at->size != profiles[p].size || at->start % at->size) return NVML_ERROR_INVALID_ARGUMENT;
    int free_slot = -1;
    for (unsigned i = 0; i < sizeof gis / sizeof gis[0]; i++) {
        if (!gis[i].used) {
            if (free_slot < 0) free_slot = (int)i;
            continue;
        }
        unsigned int s = gis[i].placement.start, e = s + gis[i].placement.size;
        if (at->start < e && s < at->start + at->size) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    }
    if (free_slot < 0) return NVML_ERROR_INSUFFICIENT_RESOURCES;
    stub_gi *gi = &gis[free_slot];
    gi->used = 1;
    gi->id = next_gi++;
    gi->profile_id = profile_id;
    gi->placement = *at;
    *out = gi;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gi) {
    if (!gi || !gi->used) return NVML_ERROR_INVALID_ARGUMENT;
    gi->used = 0;
    return NVML_SUCCESS;
}
#endif

nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t d, unsigned int id, nvmlGpuInstance_t *out) {
    if (!d || !out) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mig_capable || !d->mig_current) return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned i = 0; i < sizeof gis / sizeof gis[0]; i++) {
        if (gis[i].used && gis[i].id == id) {
            *out = &gis[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

/* ----- Mixed-size vGPU ----- */

typedef struct {
    unsigned int version, mode;
} nvmlVgpuHeterogeneousMode_t;

typedef struct {
    unsigned int version, placementSize, count;
    unsigned int *placementIds;
    unsigned int mode;
} nvmlVgpuPlacementList_v2_t;

typedef struct {
    unsigned int version, placementId;
} nvmlVgpuPlacementId_t;

#define VERSION(type, v) ((unsigned int)(sizeof(type) | ((v) << 24)))

nvmlReturn_t nvmlDeviceGetVgpuHeterogeneousMode(nvmlDevice_t d, nvmlVgpuHeterogeneousMode_t *m) {
    if (!d || !m) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != VERSION(nvmlVgpuHeterogeneousMode_t, 1)) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!d->mixed) return NVML_ERROR_NOT_SUPPORTED;
    m->mode = d->vgpu_mode;
    return NVML_SUCCESS;
}

#ifndef STUB_NO_WRITES
nvmlReturn_t nvmlDeviceSetVgpuHeterogeneousMode(nvmlDevice_t d, const nvmlVgpuHeterogeneousMode_t *m) {
    if (!d || !m || m->mode > 1) return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != VERSION(nvmlVgpuHeterogeneousMode_t, 1)) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!d->mixed) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_ERROR_IN_USE; /* vGPU instance 7 runs */
}
#endif

static nvmlReturn_t placements(nvmlDevice_t d, unsigned int type, nvmlVgpuPlacementList_v2_t *l,
                               int creatable) {
    if (!d || !l) return NVML_ERROR_INVALID_ARGUMENT;
    if (l->version != VERSION(nvmlVgpuPlacementList_v2_t, 2)) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (!d->mixed) return NVML_ERROR_NOT_SUPPORTED;
    if (type != 2) return NVML_ERROR_INVALID_ARGUMENT;
    /* Type 2 takes 12 slots at 0, 12, 24, 36; instance 7 holds 12. */
    static const unsigned int all[] = {0, 12, 24, 36}, free_ids[] = {0, 24, 36};
    const unsigned int *ids = creatable ? free_ids : all;
    unsigned int n = creatable ? 3 : 4;
    l->placementSize = 12;
    if (l->count < n || !l->placementIds) {
        l->count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(l->placementIds, ids, n * sizeof *ids);
    l->count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetVgpuTypeSupportedPlacements(nvmlDevice_t d, unsigned int type,
                                                      nvmlVgpuPlacementList_v2_t *l) {
    return placements(d, type, l, 0);
}

nvmlReturn_t nvmlDeviceGetVgpuTypeCreatablePlacements(nvmlDevice_t d, unsigned int type,
                                                      nvmlVgpuPlacementList_v2_t *l) {
    return placements(d, type, l, 1);
}

nvmlReturn_t nvmlDeviceGetActiveVgpus(nvmlDevice_t d, unsigned int *count, unsigned int *ids) {
    if (!d || !count) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned int n = d == L40S ? 1 : 0;
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    if (n) ids[0] = 7;
    *count = n;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlVgpuInstanceGetType(unsigned int instance, unsigned int *type) {
    if (instance != 7 || !type) return NVML_ERROR_INVALID_ARGUMENT;
    *type = 2;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlVgpuInstanceGetPlacementId(unsigned int instance, nvmlVgpuPlacementId_t *p) {
    if (instance != 7 || !p) return NVML_ERROR_INVALID_ARGUMENT;
    if (p->version != VERSION(nvmlVgpuPlacementId_t, 1)) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    p->placementId = 12;
    return NVML_SUCCESS;
}

/* ----- vGPU scheduler; time-sliced vGPUs inside GPU instances ----- */

typedef struct {
    unsigned int schedulerPolicy, arrMode;
    unsigned int params[2]; /* nvmlVgpuSchedulerParams_t: two unsigned ints in every arm */
} nvmlVgpuSchedulerGetState_t;

nvmlReturn_t nvmlDeviceGetVgpuSchedulerState(nvmlDevice_t d, nvmlVgpuSchedulerGetState_t *s) {
    if (!d || !s) return NVML_ERROR_INVALID_ARGUMENT;
    if (!d->mixed) return NVML_ERROR_NOT_SUPPORTED;
    s->schedulerPolicy = 2; /* NVML_VGPU_SCHEDULER_POLICY_EQUAL_SHARE */
    s->arrMode = 0;
    return NVML_SUCCESS;
}

typedef struct {
    unsigned int version, vgpuTypeId, count;
    unsigned int *placementIds;
    unsigned int placementSize;
} nvmlVgpuCreatablePlacementInfo_v1_t;

nvmlReturn_t nvmlGpuInstanceGetVgpuTypeCreatablePlacements(nvmlGpuInstance_t gi,
                                                           nvmlVgpuCreatablePlacementInfo_v1_t *p) {
    if (!gi || !gi->used || !p) return NVML_ERROR_INVALID_ARGUMENT;
    if (p->version != VERSION(nvmlVgpuCreatablePlacementInfo_v1_t, 1))
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    if (p->vgpuTypeId != 70) return NVML_ERROR_INVALID_ARGUMENT;
    /* Type 70 time-slices three to an instance; placement 0 is taken. */
    static const unsigned int free_ids[] = {1, 2};
    p->placementSize = 1;
    if (p->count < 2 || !p->placementIds) {
        p->count = 2;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    memcpy(p->placementIds, free_ids, sizeof free_ids);
    p->count = 2;
    return NVML_SUCCESS;
}
