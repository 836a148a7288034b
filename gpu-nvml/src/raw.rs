//! The NVML calls nvml-wrapper 0.13 has no (or no usable) safe method for, made through the
//! loaded library's symbol table. Every function checks that its symbols resolved (a missing one
//! is `FunctionNotFound`, naming it), and each `unsafe` block is one foreign call with what makes
//! it sound. Struct versions follow nvml.h's `NVML_STRUCT_VERSION(name, ver)`:
//! `sizeof(struct) | ver << 24`.

// The crate's only unsafe code: one small block per foreign call.
#![allow(unsafe_code)]

use std::os::raw::c_uint;

use nvml_wrapper::{Device, Nvml};
use nvml_wrapper_sys::bindings::{
    NVML_GPU_INSTANCE_PROFILE_COUNT, nvmlDevice_t, nvmlGpuInstance_t, nvmlGpuInstanceInfo_t,
    nvmlGpuInstancePlacement_t, nvmlGpuInstanceProfileInfo_t, nvmlReturn_t,
    nvmlVgpuCreatablePlacementInfo_t, nvmlVgpuHeterogeneousMode_t, nvmlVgpuInstance_t,
    nvmlVgpuPlacementId_t, nvmlVgpuPlacementList_t,
};

use crate::error::{NvmlError, NvmlErrorKind};
use crate::types::{
    ActiveVgpu, GpuInstanceProfile, Placement, RemappedRows, VgpuMode, VgpuPlacements,
};

/// `NVML_STRUCT_VERSION` of a struct of `T` at version `ver`.
fn struct_version<T>(ver: u32) -> c_uint {
    (std::mem::size_of::<T>() as u32) | (ver << 24)
}

/// The symbol `$field` of the loaded library, or `FunctionNotFound` naming it.
macro_rules! sym {
    ($nvml:expr, $field:ident) => {
        $nvml
            .lib()
            .$field
            .as_ref()
            .map_err(|_| NvmlError::new(stringify!($field), NvmlErrorKind::FunctionNotFound))
    };
}

/// The device's raw handle, for the calls below.
fn handle(device: &Device<'_>) -> nvmlDevice_t {
    // SAFETY: reading the handle is harmless; it is only passed to NVML calls made while
    // `device` borrows its `Nvml`, so the library stays loaded and initialized.
    unsafe { device.handle() }
}

/// `nvmlDeviceGetRemappedRows` (drivers before R450 lack it: `FunctionNotFound`).
pub(crate) fn remapped_rows(nvml: &Nvml, device: &Device<'_>) -> Result<RemappedRows, NvmlError> {
    let f = sym!(nvml, nvmlDeviceGetRemappedRows)?;
    let (mut corrected, mut uncorrected, mut pending, mut failure) = (0u32, 0u32, 0u32, 0u32);
    // SAFETY: `f` was resolved by the name nvml.h gives this signature; the handle is live; the
    // four out pointers point at live, writable `c_uint`s.
    let code = unsafe {
        f(
            handle(device),
            &mut corrected,
            &mut uncorrected,
            &mut pending,
            &mut failure,
        )
    };
    NvmlError::check("nvmlDeviceGetRemappedRows", code)?;
    Ok(RemappedRows {
        corrected,
        uncorrected,
        pending: pending != 0,
        failure: failure != 0,
    })
}

/// `nvmlDeviceGetModuleId`.
pub(crate) fn module_id(nvml: &Nvml, device: &Device<'_>) -> Result<u32, NvmlError> {
    let f = sym!(nvml, nvmlDeviceGetModuleId)?;
    let mut id: c_uint = 0;
    // SAFETY: resolved by its documented name; live handle; `id` is a live, writable `c_uint`.
    let code = unsafe { f(handle(device), &mut id) };
    NvmlError::check("nvmlDeviceGetModuleId", code)?;
    Ok(id)
}

/// Every GPU-instance profile index NVML defines, asked of the device; an index the GPU lacks
/// (`NOT_SUPPORTED` or `INVALID_ARGUMENT`) is left out, and a GPU with none at all answers
/// `NOT_SUPPORTED`.
pub(crate) fn gpu_instance_profiles(
    nvml: &Nvml,
    device: &Device<'_>,
) -> Result<Vec<GpuInstanceProfile>, NvmlError> {
    const CALL: &str = "nvmlDeviceGetGpuInstanceProfileInfo";
    let f = sym!(nvml, nvmlDeviceGetGpuInstanceProfileInfo)?;
    let mut out = Vec::new();
    for index in 0..NVML_GPU_INSTANCE_PROFILE_COUNT {
        let mut info = nvmlGpuInstanceProfileInfo_t {
            id: 0,
            isP2pSupported: 0,
            sliceCount: 0,
            instanceCount: 0,
            multiprocessorCount: 0,
            copyEngineCount: 0,
            decoderCount: 0,
            encoderCount: 0,
            jpegCount: 0,
            ofaCount: 0,
            memorySizeMB: 0,
        };
        // SAFETY: resolved by its documented name; live handle; `info` is a live, writable
        // struct of the layout the call fills.
        let code = unsafe { f(handle(device), index, &mut info) };
        match NvmlErrorKind::from_code(code) {
            None => {}
            Some(NvmlErrorKind::NotSupported | NvmlErrorKind::InvalidArgument) => continue,
            Some(kind) => return Err(NvmlError::new(CALL, kind)),
        }
        out.push(GpuInstanceProfile {
            index,
            id: info.id,
            slice_count: info.sliceCount,
            instance_count: info.instanceCount,
            memory_mib: info.memorySizeMB,
        });
    }
    if out.is_empty() {
        return Err(NvmlError::new(CALL, NvmlErrorKind::NotSupported));
    }
    Ok(out)
}

/// The most GPU instances of one profile asked for at once: NVML sizes its answer by the
/// profile's `instanceCount` (at most 7 on any MIG GPU); a larger answer is `INSUFFICIENT_SIZE`.
const MAX_GPU_INSTANCES_PER_PROFILE: u32 = 64;

/// A GPU instance as `nvmlGpuInstanceGetInfo` describes it.
pub(crate) struct GiInfo {
    pub id: u32,
    pub profile_id: u32,
    pub placement: Placement,
}

fn gi_info(nvml: &Nvml, gi: nvmlGpuInstance_t) -> Result<GiInfo, NvmlError> {
    let f = sym!(nvml, nvmlGpuInstanceGetInfo)?;
    let mut info = nvmlGpuInstanceInfo_t {
        device: std::ptr::null_mut(),
        id: 0,
        profileId: 0,
        placement: nvmlGpuInstancePlacement_t { start: 0, size: 0 },
    };
    // SAFETY: resolved by its documented name; `gi` is a handle NVML just returned; `info` is a
    // live, writable struct of the layout the call fills.
    let code = unsafe { f(gi, &mut info) };
    NvmlError::check("nvmlGpuInstanceGetInfo", code)?;
    Ok(GiInfo {
        id: info.id,
        profile_id: info.profileId,
        placement: Placement {
            start: info.placement.start,
            size: info.placement.size,
        },
    })
}

/// The GPU instances of `profile`, each with its info.
pub(crate) fn gpu_instances_of(
    nvml: &Nvml,
    device: &Device<'_>,
    profile: &GpuInstanceProfile,
) -> Result<Vec<GiInfo>, NvmlError> {
    const CALL: &str = "nvmlDeviceGetGpuInstances";
    // All three symbols first: a library without one of them cannot answer at all.
    let list = sym!(nvml, nvmlDeviceGetGpuInstances)?;
    sym!(nvml, nvmlGpuInstanceGetInfo)?;
    let room = profile.instance_count.min(MAX_GPU_INSTANCES_PER_PROFILE);
    if room == 0 {
        return Ok(Vec::new());
    }
    let mut handles: Vec<nvmlGpuInstance_t> = vec![std::ptr::null_mut(); room as usize];
    let mut count: c_uint = room;
    // SAFETY: resolved by its documented name; `handles` has room for `count` handles, the most
    // NVML writes; `count` is a live, writable `c_uint`.
    let code = unsafe { list(handle(device), profile.id, handles.as_mut_ptr(), &mut count) };
    NvmlError::check(CALL, code)?;
    let listed = handles
        .get(..count as usize)
        .ok_or(NvmlError::new(CALL, NvmlErrorKind::InsufficientSize))?;
    listed.iter().map(|gi| gi_info(nvml, *gi)).collect()
}

/// `nvmlDeviceGetGpuInstancePossiblePlacements_v2`: asked for the count, then filled.
pub(crate) fn possible_placements(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
) -> Result<Vec<Placement>, NvmlError> {
    const CALL: &str = "nvmlDeviceGetGpuInstancePossiblePlacements_v2";
    let f = sym!(nvml, nvmlDeviceGetGpuInstancePossiblePlacements_v2)?;
    let mut count: c_uint = 0;
    // SAFETY: resolved by its documented name; a null array asks for the count only (nvml.h);
    // `count` is live and writable.
    let code = unsafe { f(handle(device), profile_id, std::ptr::null_mut(), &mut count) };
    NvmlError::check(CALL, code)?;
    let mut buf = vec![nvmlGpuInstancePlacement_t { start: 0, size: 0 }; count as usize];
    // SAFETY: `buf` holds `count` placements, the number NVML just gave.
    let code = unsafe { f(handle(device), profile_id, buf.as_mut_ptr(), &mut count) };
    NvmlError::check(CALL, code)?;
    Ok(buf
        .iter()
        .take(count as usize)
        .map(|p| Placement {
            start: p.start,
            size: p.size,
        })
        .collect())
}

/// `nvmlDeviceCreateGpuInstanceWithPlacement`, then the new instance's info.
pub(crate) fn create_gpu_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    profile_id: u32,
    placement: Placement,
) -> Result<GiInfo, NvmlError> {
    let f = sym!(nvml, nvmlDeviceCreateGpuInstanceWithPlacement)?;
    sym!(nvml, nvmlGpuInstanceGetInfo)?;
    let at = nvmlGpuInstancePlacement_t {
        start: placement.start,
        size: placement.size,
    };
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: resolved by its documented name; live handle; `at` is a live placement NVML only
    // reads; `gi` is a live, writable handle slot.
    let code = unsafe { f(handle(device), profile_id, &at, &mut gi) };
    NvmlError::check("nvmlDeviceCreateGpuInstanceWithPlacement", code)?;
    gi_info(nvml, gi)
}

/// `nvmlDeviceGetGpuInstanceById`, then `nvmlGpuInstanceDestroy`.
pub(crate) fn destroy_gpu_instance(
    nvml: &Nvml,
    device: &Device<'_>,
    id: u32,
) -> Result<(), NvmlError> {
    let by_id = sym!(nvml, nvmlDeviceGetGpuInstanceById)?;
    let destroy = sym!(nvml, nvmlGpuInstanceDestroy)?;
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: resolved by its documented name; live handle; `gi` is a live, writable slot.
    let code = unsafe { by_id(handle(device), id, &mut gi) };
    NvmlError::check("nvmlDeviceGetGpuInstanceById", code)?;
    // SAFETY: resolved by its documented name; `gi` is the handle NVML just returned.
    let code = unsafe { destroy(gi) };
    NvmlError::check("nvmlGpuInstanceDestroy", code)
}

/// `nvmlDeviceGetVgpuHeterogeneousMode`.
pub(crate) fn vgpu_heterogeneous_mode(
    nvml: &Nvml,
    device: &Device<'_>,
) -> Result<VgpuMode, NvmlError> {
    const CALL: &str = "nvmlDeviceGetVgpuHeterogeneousMode";
    let f = sym!(nvml, nvmlDeviceGetVgpuHeterogeneousMode)?;
    let mut mode = nvmlVgpuHeterogeneousMode_t {
        version: struct_version::<nvmlVgpuHeterogeneousMode_t>(1),
        mode: 0,
    };
    // SAFETY: resolved by its documented name; live handle; `mode` is a live, writable struct
    // carrying its version.
    let code = unsafe { f(handle(device), &mut mode) };
    NvmlError::check(CALL, code)?;
    VgpuMode::from_raw(mode.mode).ok_or(NvmlError::new(CALL, NvmlErrorKind::Unexpected(mode.mode)))
}

/// `nvmlDeviceSetVgpuHeterogeneousMode`.
pub(crate) fn set_vgpu_heterogeneous_mode(
    nvml: &Nvml,
    device: &Device<'_>,
    mode: VgpuMode,
) -> Result<(), NvmlError> {
    let f = sym!(nvml, nvmlDeviceSetVgpuHeterogeneousMode)?;
    let m = nvmlVgpuHeterogeneousMode_t {
        version: struct_version::<nvmlVgpuHeterogeneousMode_t>(1),
        mode: mode.raw(),
    };
    // SAFETY: resolved by its documented name; live handle; `m` is a live struct NVML only reads.
    let code = unsafe { f(handle(device), &m) };
    NvmlError::check("nvmlDeviceSetVgpuHeterogeneousMode", code)
}

/// Which vGPU placement list to ask for.
#[derive(Clone, Copy)]
pub(crate) enum PlacementList {
    Supported,
    Creatable,
}

/// The most placement IDs asked for first; a GPU with more answers `INSUFFICIENT_SIZE` with the
/// count, and is asked again with room for that many (up to [`MAX_PLACEMENTS`]).
const FIRST_PLACEMENTS: u32 = 64;
const MAX_PLACEMENTS: u32 = 4096;

/// Asks `ask` for a placement list with room for a few IDs, and again with room for as many as
/// NVML says (`INSUFFICIENT_SIZE` with the count, up to [`MAX_PLACEMENTS`]). `ask` gets the room
/// and the buffer and returns NVML's code, the count and the placement size it wrote.
fn grow_placements(
    call: &'static str,
    mut ask: impl FnMut(u32, &mut [c_uint]) -> (nvmlReturn_t, u32, u32),
) -> Result<VgpuPlacements, NvmlError> {
    let mut room = FIRST_PLACEMENTS;
    loop {
        let mut ids: Vec<c_uint> = vec![0; room as usize];
        let (code, count, size) = ask(room, &mut ids);
        match NvmlErrorKind::from_code(code) {
            None => {
                let ids = ids
                    .get(..count as usize)
                    .ok_or(NvmlError::new(call, NvmlErrorKind::InsufficientSize))?;
                return Ok(VgpuPlacements {
                    placement_size: size,
                    placement_ids: ids.to_vec(),
                });
            }
            Some(NvmlErrorKind::InsufficientSize) if count > room && count <= MAX_PLACEMENTS => {
                room = count;
            }
            Some(kind) => return Err(NvmlError::new(call, kind)),
        }
    }
}

/// `nvmlDeviceGetVgpuTypeSupportedPlacements` or `...CreatablePlacements` (version 2 of the
/// list, with the mode it is asked for).
pub(crate) fn vgpu_placements(
    nvml: &Nvml,
    device: &Device<'_>,
    which: PlacementList,
    type_id: u32,
    mode: VgpuMode,
) -> Result<VgpuPlacements, NvmlError> {
    let (call, f) = match which {
        PlacementList::Supported => (
            "nvmlDeviceGetVgpuTypeSupportedPlacements",
            sym!(nvml, nvmlDeviceGetVgpuTypeSupportedPlacements)?,
        ),
        PlacementList::Creatable => (
            "nvmlDeviceGetVgpuTypeCreatablePlacements",
            sym!(nvml, nvmlDeviceGetVgpuTypeCreatablePlacements)?,
        ),
    };
    grow_placements(call, |room, ids| {
        let mut list = nvmlVgpuPlacementList_t {
            version: struct_version::<nvmlVgpuPlacementList_t>(2),
            placementSize: 0,
            count: room,
            placementIds: ids.as_mut_ptr(),
            mode: mode.raw(),
        };
        // SAFETY: resolved by its documented name; live handle; `list` is a live, writable
        // struct carrying its version, whose `placementIds` points at `ids`, which holds
        // `count` entries and outlives the call.
        let code = unsafe { f(handle(device), type_id, &mut list) };
        (code, list.count, list.placementSize)
    })
}

/// `nvmlDeviceGetGpuInstanceById`, then `nvmlGpuInstanceGetVgpuTypeCreatablePlacements`.
pub(crate) fn gpu_instance_vgpu_creatable(
    nvml: &Nvml,
    device: &Device<'_>,
    id: u32,
    type_id: u32,
) -> Result<VgpuPlacements, NvmlError> {
    const CALL: &str = "nvmlGpuInstanceGetVgpuTypeCreatablePlacements";
    let by_id = sym!(nvml, nvmlDeviceGetGpuInstanceById)?;
    let f = sym!(nvml, nvmlGpuInstanceGetVgpuTypeCreatablePlacements)?;
    let mut gi: nvmlGpuInstance_t = std::ptr::null_mut();
    // SAFETY: resolved by its documented name; live handle; `gi` is a live, writable slot.
    let code = unsafe { by_id(handle(device), id, &mut gi) };
    NvmlError::check("nvmlDeviceGetGpuInstanceById", code)?;
    grow_placements(CALL, |room, ids| {
        let mut info = nvmlVgpuCreatablePlacementInfo_t {
            version: struct_version::<nvmlVgpuCreatablePlacementInfo_t>(1),
            vgpuTypeId: type_id,
            count: room,
            placementIds: ids.as_mut_ptr(),
            placementSize: 0,
        };
        // SAFETY: resolved by its documented name; `gi` is the handle NVML just returned;
        // `info` is live and writable, carries its version, and its `placementIds` points at
        // `ids`, which holds `count` entries and outlives the call.
        let code = unsafe { f(gi, &mut info) };
        (code, info.count, info.placementSize)
    })
}

/// `nvmlDeviceGetActiveVgpus` (count, then the IDs), each with `nvmlVgpuInstanceGetType` and,
/// where NVML gives one, `nvmlVgpuInstanceGetPlacementId`.
pub(crate) fn active_vgpus(nvml: &Nvml, device: &Device<'_>) -> Result<Vec<ActiveVgpu>, NvmlError> {
    const CALL: &str = "nvmlDeviceGetActiveVgpus";
    let list = sym!(nvml, nvmlDeviceGetActiveVgpus)?;
    let get_type = sym!(nvml, nvmlVgpuInstanceGetType)?;
    let mut count: c_uint = 0;
    // SAFETY: resolved by its documented name; a null array with a zero count asks for the
    // count (nvml.h: INSUFFICIENT_SIZE with the count set, SUCCESS when there are none).
    let code = unsafe { list(handle(device), &mut count, std::ptr::null_mut()) };
    match NvmlErrorKind::from_code(code) {
        None => return Ok(Vec::new()),
        Some(NvmlErrorKind::InsufficientSize) => {}
        Some(kind) => return Err(NvmlError::new(CALL, kind)),
    }
    let mut ids: Vec<nvmlVgpuInstance_t> = vec![0; count as usize];
    // SAFETY: `ids` holds `count` instance IDs, the number NVML just gave.
    let code = unsafe { list(handle(device), &mut count, ids.as_mut_ptr()) };
    NvmlError::check(CALL, code)?;
    let placement = nvml.lib().nvmlVgpuInstanceGetPlacementId.as_ref().ok();
    let mut out = Vec::new();
    for id in ids.iter().take(count as usize) {
        let mut type_id: c_uint = 0;
        // SAFETY: resolved by its documented name; `id` is an instance NVML just listed;
        // `type_id` is live and writable.
        let code = unsafe { get_type(*id, &mut type_id) };
        NvmlError::check("nvmlVgpuInstanceGetType", code)?;
        let placement_id = placement.and_then(|f| {
            let mut p = nvmlVgpuPlacementId_t {
                version: struct_version::<nvmlVgpuPlacementId_t>(1),
                placementId: 0,
            };
            // SAFETY: resolved by its documented name; `p` is a live, writable struct carrying
            // its version.
            let code = unsafe { f(*id, &mut p) };
            (code == 0).then_some(p.placementId)
        });
        out.push(ActiveVgpu {
            instance: *id,
            type_id,
            placement_id,
        });
    }
    Ok(out)
}
