/* A stand-in libnvfm.so.1 for gpu-fabric's tests: the Fabric Manager API's entry points with
 * the layouts NVIDIA's public API documents, answering as FM does for an HGX 8-GPU baseboard
 * in shared NVSwitch mode (or, with -DSTUB_VGPU, in vGPU mode). Written for gpuslice from the
 * documented API; it is not NVIDIA's code.
 *
 * -DSTUB_VGPU              vGPU mode: plain activation is not supported, activation with VFs is.
 * -DSTUB_OLD_LIBRARY       no fmActivateFabricPartitionWithVFs (an older Fabric Manager).
 * -DSTUB_FAILED_LINKS      the GPU of module 3 reports failed NVLinks on ports 3 and 7.
 */
#include <stdio.h>
#include <string.h>

#define MAX_STR 256
#define UUID_LEN 80
#define BUS_ID_LEN 32
#define MAX_GPUS 16
#define MAX_SWITCHES 12
#define MAX_PARTITIONS 64
#define MAX_PORTS 64
#define VERSION(type, ver) ((unsigned int)(sizeof(type) | ((ver) << 24)))

enum { ST_SUCCESS = 0, ST_BADPARAM = -1, ST_NOT_SUPPORTED = -3, ST_UNINITIALIZED = -4,
       ST_VERSION_MISMATCH = -6, ST_IN_USE = -7, ST_CONNECTION_NOT_VALID = -9 };

typedef struct {
    unsigned int version;
    char address[MAX_STR];
    unsigned int timeout_ms;
    unsigned int unix_socket;
} connect_params;

typedef struct {
    unsigned int physical_id;
    char uuid[UUID_LEN];
    char bus_id[BUS_ID_LEN];
    unsigned int links;
    unsigned int max_links;
    unsigned int rate;
} gpu_info;

typedef struct {
    unsigned int id;
    unsigned int active;
    unsigned int count;
    gpu_info gpus[MAX_GPUS];
} partition_info;

typedef struct {
    unsigned int version;
    unsigned int count;
    unsigned int max;
    partition_info parts[MAX_PARTITIONS];
} partition_list;

typedef struct {
    unsigned int version;
    unsigned int count;
    unsigned int ids[MAX_PARTITIONS];
} activated_list;

typedef struct {
    char uuid[UUID_LEN];
    char bus_id[BUS_ID_LEN];
    unsigned int count;
    unsigned int ports[MAX_PORTS];
} failed_info;

typedef struct {
    unsigned int version;
    unsigned int gpus;
    unsigned int switches;
    failed_info gpu[MAX_GPUS];
    failed_info sw[MAX_SWITCHES];
} failed_list;

typedef struct {
    unsigned int domain, bus, device, function;
} pci_device;

static const unsigned int buses[8] = {0x18, 0x2a, 0x3a, 0x5d, 0x9a, 0xab, 0xba, 0xdb};
static int initialized;
static int handle_token = 42;
static unsigned int active[16];

int fmLibInit(void) { initialized = 1; return ST_SUCCESS; }
int fmLibShutdown(void) { initialized = 0; return ST_SUCCESS; }

int fmConnect(connect_params *p, void **handle) {
    if (!initialized) return ST_UNINITIALIZED;
    if (!p || !handle) return ST_BADPARAM;
    if (p->version != VERSION(connect_params, 1)) return ST_VERSION_MISMATCH;
    if (strcmp(p->address, "127.0.0.1") != 0 && !(p->unix_socket && strcmp(p->address, "/run/fm.sock") == 0))
        return ST_CONNECTION_NOT_VALID;
    *handle = &handle_token;
    return ST_SUCCESS;
}

int fmDisconnect(void *handle) { return handle == &handle_token ? ST_SUCCESS : ST_BADPARAM; }

/* Partition IDs 1-15 and their modules (1-based; 0 ends a list): one of 8, two of 4, four of
 * 2, eight of 1, as gpu-fabric's fake lays them out. */
static const unsigned int members[16][9] = {
    {0}, {1, 2, 3, 4, 5, 6, 7, 8, 0}, {1, 2, 5, 6, 0}, {3, 4, 7, 8, 0}, {1, 3, 0}, {2, 4, 0},
    {5, 7, 0}, {6, 8, 0}, {1, 0}, {2, 0}, {3, 0}, {4, 0}, {5, 0}, {6, 0}, {7, 0}, {8, 0},
};

static unsigned int size_of(unsigned int id) {
    unsigned int n = 0;
    while (n < 8 && members[id][n]) n++;
    return n;
}

static int overlaps(unsigned int a, unsigned int b) {
    for (unsigned int i = 0; members[a][i]; i++)
        for (unsigned int j = 0; members[b][j]; j++)
            if (members[a][i] == members[b][j]) return 1;
    return 0;
}

static int valid(unsigned int id) { return id >= 1 && id <= 15; }

int fmGetSupportedFabricPartitions(void *handle, partition_list *list) {
    if (handle != &handle_token || !list) return ST_BADPARAM;
    if (list->version != VERSION(partition_list, 1)) return ST_VERSION_MISMATCH;
    list->count = 15;
    list->max = MAX_PARTITIONS;
    for (unsigned int i = 0; i < 15; i++) {
        unsigned int id = i + 1, size = size_of(id);
        partition_info *p = &list->parts[i];
        p->id = id;
        p->active = active[id];
        p->count = size;
        for (unsigned int g = 0; g < size; g++) {
            gpu_info *gi = &p->gpus[g];
            unsigned int module = members[id][g];
            gi->physical_id = module;
            snprintf(gi->uuid, UUID_LEN, "GPU-stub-%u", module);
            snprintf(gi->bus_id, BUS_ID_LEN, "00000000:%02X:00.0", buses[module - 1]);
            gi->max_links = 18;
            gi->links = 18;
#ifdef STUB_FAILED_LINKS
            if (module == 3) gi->links = 16;
#endif
            gi->rate = 25000;
        }
    }
    return ST_SUCCESS;
}

static int activate(unsigned int id) {
    if (!valid(id)) return ST_BADPARAM;
    if (active[id]) return ST_IN_USE;
    for (unsigned int i = 1; i <= 15; i++)
        if (active[i] && overlaps(i, id)) return ST_IN_USE;
    active[id] = 1;
    return ST_SUCCESS;
}

int fmActivateFabricPartition(void *handle, unsigned int id) {
    if (handle != &handle_token) return ST_BADPARAM;
#ifdef STUB_VGPU
    return ST_NOT_SUPPORTED;
#endif
    return activate(id);
}

#ifndef STUB_OLD_LIBRARY
int fmActivateFabricPartitionWithVFs(void *handle, unsigned int id, pci_device *vfs, unsigned int n) {
    if (handle != &handle_token) return ST_BADPARAM;
#ifndef STUB_VGPU
    return ST_NOT_SUPPORTED;
#endif
    if (!valid(id)) return ST_BADPARAM;
    if (n != size_of(id) || !vfs) return ST_BADPARAM;
    /* One VF of each member, in the partition's order: same bus as the GPU, not function 0. */
    for (unsigned int i = 0; i < n; i++)
        if (vfs[i].domain != 0 || vfs[i].bus != buses[members[id][i] - 1] || vfs[i].function == 0)
            return ST_BADPARAM;
    return activate(id);
}
#endif

int fmDeactivateFabricPartition(void *handle, unsigned int id) {
    if (handle != &handle_token || !valid(id)) return ST_BADPARAM;
    if (!active[id]) return ST_UNINITIALIZED;
    active[id] = 0;
    return ST_SUCCESS;
}

int fmSetActivatedFabricPartitions(void *handle, activated_list *list) {
    if (handle != &handle_token || !list) return ST_BADPARAM;
    if (list->version != VERSION(activated_list, 1)) return ST_VERSION_MISMATCH;
    if (list->count > MAX_PARTITIONS) return ST_BADPARAM;
    for (unsigned int i = 0; i < list->count; i++)
        if (!valid(list->ids[i])) return ST_BADPARAM;
    memset(active, 0, sizeof active);
    for (unsigned int i = 0; i < list->count; i++) active[list->ids[i]] = 1;
    return ST_SUCCESS;
}

int fmGetNvlinkFailedDevices(void *handle, failed_list *list) {
    if (handle != &handle_token || !list) return ST_BADPARAM;
    if (list->version != VERSION(failed_list, 1)) return ST_VERSION_MISMATCH;
    list->gpus = 0;
    list->switches = 0;
#ifdef STUB_FAILED_LINKS
    list->gpus = 1;
    snprintf(list->gpu[0].bus_id, BUS_ID_LEN, "00000000:3a:00.0");
    list->gpu[0].count = 2;
    list->gpu[0].ports[0] = 3;
    list->gpu[0].ports[1] = 7;
    list->switches = 1;
    snprintf(list->sw[0].bus_id, BUS_ID_LEN, "00000000:07:00.0");
    list->sw[0].count = 1;
    list->sw[0].ports[0] = 12;
#endif
    return ST_SUCCESS;
}
