//! Raw CUDA driver calls for the VMM backend, one thin function each. Every function here is
//! `unsafe` FFI; callers (the RAII types in `mod.rs`) uphold the stated preconditions. All of
//! them assume `ensure_driver()` succeeded (cudarc panics if libcuda cannot be loaded).

use cudarc::driver::sys::{
    self, CUdevice, CUdeviceptr, CUmemAccessDesc, CUmemAllocationHandleType_enum,
    CUmemAllocationProp, CUmemGenericAllocationHandle, CUmemLocation, cudaError_enum,
};

use crate::error::{MemoryError, Result};

fn check(op: &'static str, r: cudaError_enum) -> Result<()> {
    if r == cudaError_enum::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(MemoryError::Cuda(format!("{op} failed: {r:?}")))
    }
}

/// Allocation properties: pinned device memory on `device`, exportable as a POSIX fd.
pub(crate) fn prop(device: CUdevice) -> CUmemAllocationProp {
    // SAFETY: CUmemAllocationProp is a plain C struct for which all-zero is a valid value
    // (zeroed reserved fields are what the driver requires).
    let mut p: CUmemAllocationProp = unsafe { std::mem::zeroed() };
    p.type_ = sys::CUmemAllocationType_enum::CU_MEM_ALLOCATION_TYPE_PINNED;
    p.requestedHandleTypes =
        CUmemAllocationHandleType_enum::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    p.location = location(device);
    p
}

fn location(device: CUdevice) -> CUmemLocation {
    CUmemLocation {
        type_: sys::CUmemLocationType_enum::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    }
}

/// # Safety
/// The driver is loaded and initialised, and a context is current on this thread.
pub(crate) unsafe fn granularity(prop: &CUmemAllocationProp) -> Result<usize> {
    let mut g = 0usize;
    let flag = sys::CUmemAllocationGranularity_flags_enum::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED;
    // SAFETY: both pointers are valid for the call; the caller guarantees an initialised driver.
    check("cuMemGetAllocationGranularity", unsafe {
        sys::cuMemGetAllocationGranularity(&mut g, prop, flag)
    })?;
    Ok(g.max(1))
}

/// # Safety
/// As for [`granularity`]; `size` is a multiple of the granularity.
pub(crate) unsafe fn reserve(size: usize, align: usize) -> Result<CUdeviceptr> {
    let mut ptr: CUdeviceptr = 0;
    // SAFETY: `ptr` is a valid out-pointer; a zero hint lets the driver choose the range.
    check("cuMemAddressReserve", unsafe {
        sys::cuMemAddressReserve(&mut ptr, size, align, 0, 0)
    })?;
    Ok(ptr)
}

/// # Safety
/// `ptr`/`size` came from [`reserve`] and nothing is mapped in the range any more.
pub(crate) unsafe fn address_free(ptr: CUdeviceptr, size: usize) -> Result<()> {
    // SAFETY: the caller guarantees the range is ours and unmapped.
    check("cuMemAddressFree", unsafe {
        sys::cuMemAddressFree(ptr, size)
    })
}

/// # Safety
/// As for [`granularity`]; `size` is a multiple of the granularity.
pub(crate) unsafe fn create(
    size: usize,
    prop: &CUmemAllocationProp,
) -> Result<CUmemGenericAllocationHandle> {
    let mut h: CUmemGenericAllocationHandle = 0;
    // SAFETY: valid out-pointer and property struct; flags must be 0.
    check("cuMemCreate", unsafe {
        sys::cuMemCreate(&mut h, size, prop, 0)
    })?;
    Ok(h)
}

/// # Safety
/// `h` came from [`create`] and is released exactly once (mappings keep the memory alive).
pub(crate) unsafe fn release(h: CUmemGenericAllocationHandle) -> Result<()> {
    // SAFETY: the caller guarantees a live handle released once.
    check("cuMemRelease", unsafe { sys::cuMemRelease(h) })
}

/// Maps `h` at `ptr` and grants `device` read-write access.
///
/// # Safety
/// `ptr..ptr+size` is inside a reservation of ours and unmapped; `h` is a live handle of `size`.
pub(crate) unsafe fn map(
    ptr: CUdeviceptr,
    size: usize,
    h: CUmemGenericAllocationHandle,
    device: CUdevice,
) -> Result<()> {
    // SAFETY: the caller guarantees the range and handle; offset and flags must be 0.
    check("cuMemMap", unsafe { sys::cuMemMap(ptr, size, 0, h, 0) })?;
    let access = CUmemAccessDesc {
        location: location(device),
        flags: sys::CUmemAccess_flags_enum::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the range was just mapped; `access` is one valid descriptor.
    let r = check("cuMemSetAccess", unsafe {
        sys::cuMemSetAccess(ptr, size, &access, 1)
    });
    if r.is_err() {
        // SAFETY: we mapped this range above and nobody has used it yet.
        let _ = unsafe { sys::cuMemUnmap(ptr, size) };
    }
    r
}

/// # Safety
/// The range was mapped by [`map`] and no kernel or copy still uses it.
pub(crate) unsafe fn unmap(ptr: CUdeviceptr, size: usize) -> Result<()> {
    // SAFETY: the caller guarantees a mapped, idle range.
    check("cuMemUnmap", unsafe { sys::cuMemUnmap(ptr, size) })
}

/// Exports `h` as a new POSIX fd owned by the caller.
///
/// # Safety
/// `h` is live and was created with the POSIX-fd handle type (see [`prop`]).
pub(crate) unsafe fn export_fd(h: CUmemGenericAllocationHandle) -> Result<i32> {
    let mut fd: i32 = -1;
    let ty = CUmemAllocationHandleType_enum::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // SAFETY: for the POSIX-fd type the out-parameter is an `int*`, which `fd` is.
    check("cuMemExportToShareableHandle", unsafe {
        sys::cuMemExportToShareableHandle((&mut fd as *mut i32).cast(), h, ty, 0)
    })?;
    Ok(fd)
}

/// # Safety
/// `dst` has `len` writable bytes; `src..src+len` is mapped device memory not being written.
pub(crate) unsafe fn copy_dtoh(dst: *mut u8, src: CUdeviceptr, len: usize) -> Result<()> {
    // SAFETY: the caller guarantees both ranges.
    check("cuMemcpyDtoH", unsafe {
        sys::cuMemcpyDtoH_v2(dst.cast(), src, len)
    })
}

/// # Safety
/// `src` has `len` readable bytes; `dst..dst+len` is mapped device memory nobody else uses.
pub(crate) unsafe fn copy_htod(dst: CUdeviceptr, src: *const u8, len: usize) -> Result<()> {
    // SAFETY: the caller guarantees both ranges.
    check("cuMemcpyHtoD", unsafe {
        sys::cuMemcpyHtoD_v2(dst, src.cast(), len)
    })
}

/// Imports a POSIX fd exported by [`export_fd`] (this or another process) as a new handle.
///
/// # Safety
/// As for [`granularity`]; `fd` is an open descriptor (the driver does not take ownership).
pub(crate) unsafe fn import_fd(fd: i32) -> Result<CUmemGenericAllocationHandle> {
    let mut h: CUmemGenericAllocationHandle = 0;
    let ty = CUmemAllocationHandleType_enum::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    // SAFETY: for the POSIX-fd type the driver takes the descriptor's value cast to a pointer
    // (not a pointer to it); `h` is a valid out-pointer.
    check("cuMemImportFromShareableHandle", unsafe {
        sys::cuMemImportFromShareableHandle(&mut h, fd as isize as *mut std::ffi::c_void, ty)
    })?;
    Ok(h)
}

/// Free and total bytes of the current context's device, as the driver reports them.
///
/// # Safety
/// As for [`granularity`].
pub(crate) unsafe fn mem_info() -> Result<(usize, usize)> {
    let (mut free, mut total) = (0usize, 0usize);
    // SAFETY: both out-pointers are valid for the call.
    check("cuMemGetInfo", unsafe {
        sys::cuMemGetInfo_v2(&mut free, &mut total)
    })?;
    Ok((free, total))
}
