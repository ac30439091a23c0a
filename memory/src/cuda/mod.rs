//! CUDA backend (feature `cuda`): a region is a reserved virtual address range with physical
//! memory created by `cuMemCreate` (exportable as a POSIX fd) mapped into it. Pause copies to a
//! host backup (per policy), unmaps and releases the physical memory but keeps the address
//! reservation; resume creates new physical memory, maps it at the same address and copies back.
//! Unlike CUDA IPC handles of caching-allocator memory, the exported fd lets another process map
//! the same physical memory, so one copy of the weights can be both shared and paused.
//!
//! Layering: `raw.rs` holds the unsafe driver calls; this file holds RAII owners
//! ([`CudaVmm`], [`VmmRegion`]). Every entry point first checks that libcuda can be loaded,
//! because cudarc panics (rather than erring) when it cannot. Compiled in CI; run on an H100 by
//! `tests/it/cuda_vmm.rs` (figures in memory/ARCH-NOTES.md, "On a GPU").

mod raw;

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::driver::sys::{CUdeviceptr, CUmemGenericAllocationHandle};

use crate::error::{MemoryError, Result};
use crate::tag::BackupPolicy;

/// Whether libcuda can be loaded on this machine.
pub fn driver_available() -> bool {
    // SAFETY: is_culib_present only tries to dlopen the library by name; no other precondition.
    unsafe { cudarc::driver::sys::is_culib_present() }
}

fn ensure_driver() -> Result<()> {
    if driver_available() {
        Ok(())
    } else {
        Err(MemoryError::Cuda(
            "libcuda.so could not be loaded: install the NVIDIA driver or add its directory to \
             LD_LIBRARY_PATH, or use the CPU backend"
                .into(),
        ))
    }
}

fn driver_err(op: &str, e: impl std::fmt::Debug) -> MemoryError {
    MemoryError::Cuda(format!("{op} failed: {e:?}"))
}

/// One device's VMM allocator.
#[derive(Debug, Clone)]
pub struct CudaVmm {
    ctx: Arc<CudaContext>,
    granularity: usize,
}

impl CudaVmm {
    /// Opens device `ordinal` (primary context).
    pub fn new(ordinal: usize) -> Result<CudaVmm> {
        ensure_driver()?;
        let ctx = CudaContext::new(ordinal).map_err(|e| driver_err("CudaContext::new", e))?;
        ctx.bind_to_thread()
            .map_err(|e| driver_err("bind_to_thread", e))?;
        let prop = raw::prop(ctx.cu_device());
        // SAFETY: the driver is loaded and the context is current on this thread.
        let granularity = unsafe { raw::granularity(&prop) }?;
        Ok(CudaVmm { ctx, granularity })
    }

    /// Allocation granularity in bytes (sizes are rounded up to it).
    pub fn granularity(&self) -> usize {
        self.granularity
    }

    /// Reserves and maps a resident region of at least `size` bytes.
    pub fn alloc(&self, size: usize, backup: BackupPolicy) -> Result<VmmRegion> {
        if size == 0 {
            return Err(MemoryError::InvalidArgument("zero-byte CUDA region".into()));
        }
        let g = self.granularity;
        let size = size.div_ceil(g).checked_mul(g).ok_or_else(|| {
            MemoryError::InvalidArgument(format!("CUDA region of {size} bytes overflows"))
        })?;
        self.bind()?;
        // SAFETY: driver loaded, context current, size is a multiple of the granularity.
        let ptr = unsafe { raw::reserve(size, g) }?;
        let va = Reservation { ptr, size };
        let phys = Physical::new(self, ptr, size)?;
        Ok(VmmRegion {
            vmm: self.clone(),
            va,
            phys: Some(phys),
            policy: backup,
            backup: Vec::new(),
        })
    }

    /// Free and total bytes of this device (`cuMemGetInfo`), for checks that a pause really
    /// returned the physical memory.
    pub fn mem_info(&self) -> Result<(usize, usize)> {
        self.bind()?;
        // SAFETY: driver loaded, context current.
        unsafe { raw::mem_info() }
    }

    /// Maps memory another region exported with [`VmmRegion::export_fd`] (in this or another
    /// process, on this device) at a new address of this process. `len` is the exporter's
    /// [`VmmRegion::len`]. Both sides then see the same physical bytes; the memory lives until
    /// every process has dropped its mapping.
    pub fn import_fd(&self, fd: BorrowedFd<'_>, len: usize) -> Result<ImportedRegion> {
        let g = self.granularity;
        if len == 0 || !len.is_multiple_of(g) {
            return Err(MemoryError::InvalidArgument(format!(
                "imported CUDA region of {len} bytes: the length must be the exporter's, a \
                 non-zero multiple of the granularity {g}"
            )));
        }
        self.bind()?;
        // SAFETY: driver loaded, context current; the fd is open for the call.
        let handle = unsafe { raw::import_fd(fd.as_raw_fd()) }?;
        // SAFETY: as above; len is granular.
        let ptr = match unsafe { raw::reserve(len, g) } {
            Ok(p) => p,
            Err(e) => {
                // SAFETY: the handle is live, unmapped, released once here.
                let _ = unsafe { raw::release(handle) };
                return Err(e);
            }
        };
        let va = Reservation { ptr, size: len };
        let phys = Physical::map_handle(self, ptr, len, handle)?;
        Ok(ImportedRegion {
            vmm: self.clone(),
            phys,
            _va: va,
        })
    }

    fn bind(&self) -> Result<()> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| driver_err("bind_to_thread", e))
    }
}

/// An address range reserved with `cuMemAddressReserve`; freed on drop.
#[derive(Debug)]
struct Reservation {
    ptr: CUdeviceptr,
    size: usize,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        // SAFETY: the range is ours; Physical (unmapped first, see VmmRegion's field order) no
        // longer maps anything in it. Errors cannot be reported from drop.
        let _ = unsafe { raw::address_free(self.ptr, self.size) };
    }
}

/// Physical memory from `cuMemCreate`, mapped at `ptr`; unmapped and released on drop.
#[derive(Debug)]
struct Physical {
    handle: CUmemGenericAllocationHandle,
    ptr: CUdeviceptr,
    size: usize,
}

impl Physical {
    fn new(vmm: &CudaVmm, ptr: CUdeviceptr, size: usize) -> Result<Physical> {
        let dev = vmm.ctx.cu_device();
        // SAFETY: driver loaded and context current (caller bound it); size is granular.
        let handle = unsafe { raw::create(size, &raw::prop(dev)) }?;
        Physical::map_handle(vmm, ptr, size, handle)
    }

    /// Maps the live `handle` (created here or imported; owned from now on) at `ptr`.
    fn map_handle(
        vmm: &CudaVmm,
        ptr: CUdeviceptr,
        size: usize,
        handle: CUmemGenericAllocationHandle,
    ) -> Result<Physical> {
        let dev = vmm.ctx.cu_device();
        // SAFETY: ptr..ptr+size is in our reservation and unmapped; handle is live and sized.
        if let Err(e) = unsafe { raw::map(ptr, size, handle, dev) } {
            // SAFETY: the handle is live and not mapped; released once here.
            let _ = unsafe { raw::release(handle) };
            return Err(e);
        }
        Ok(Physical { handle, ptr, size })
    }
}

impl Drop for Physical {
    fn drop(&mut self) {
        // SAFETY: we mapped this range in `new` and own the handle; the owner synchronised the
        // device before dropping (VmmRegion::pause copies synchronously first).
        unsafe {
            let _ = raw::unmap(self.ptr, self.size);
            let _ = raw::release(self.handle);
        }
    }
}

/// A CUDA region that can pause (free device memory, keep the address) and be shared by fd.
#[derive(Debug)]
pub struct VmmRegion {
    vmm: CudaVmm,
    // field order matters: `phys` drops (unmaps) before `va` frees the range
    phys: Option<Physical>,
    va: Reservation,
    policy: BackupPolicy,
    backup: Vec<u8>,
}

impl VmmRegion {
    /// Device address; the same across pause and resume.
    pub fn device_ptr(&self) -> u64 {
        self.va.ptr
    }
    /// Size in bytes (rounded to the granularity).
    pub fn len(&self) -> usize {
        self.va.size
    }
    /// Always false; for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.va.size == 0
    }
    /// Whether the physical memory is released.
    pub fn is_paused(&self) -> bool {
        self.phys.is_none()
    }

    /// Copies to host (for the `cpu` policy) and releases the physical memory.
    pub fn pause(&mut self) -> Result<()> {
        let Some(phys) = self.phys.as_ref() else {
            return Err(MemoryError::Cuda(
                "cannot pause: the region is already paused".into(),
            ));
        };
        self.vmm.bind()?;
        if self.policy == BackupPolicy::Cpu {
            self.backup.resize(self.va.size, 0);
            // SAFETY: the backup has `size` bytes; the range is mapped; the copy is synchronous.
            unsafe { raw::copy_dtoh(self.backup.as_mut_ptr(), phys.ptr, self.va.size) }?;
        }
        self.phys = None;
        Ok(())
    }

    /// Maps new physical memory at the same address and restores the backup (or leaves it
    /// uninitialised-by-us for `discard`: the driver's fresh memory).
    pub fn resume(&mut self) -> Result<()> {
        if self.phys.is_some() {
            return Err(MemoryError::Cuda(
                "cannot resume: the region is resident".into(),
            ));
        }
        self.vmm.bind()?;
        let phys = Physical::new(&self.vmm, self.va.ptr, self.va.size)?;
        if self.policy == BackupPolicy::Cpu {
            // SAFETY: the backup holds `size` bytes from pause; the range was just mapped.
            unsafe { raw::copy_htod(phys.ptr, self.backup.as_ptr(), self.va.size) }?;
        }
        self.phys = Some(phys);
        Ok(())
    }

    /// Copies `src` to the device at byte `offset` (synchronous).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let phys = self.resident("write")?;
        check_range(self.va.size, offset, src.len())?;
        self.vmm.bind()?;
        // SAFETY: the range is mapped and inside the region (checked); `src` is readable.
        unsafe { raw::copy_htod(phys.ptr + offset as u64, src.as_ptr(), src.len()) }
    }

    /// Copies `dst.len()` bytes from byte `offset` of the device to `dst` (synchronous).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let phys = self.resident("read")?;
        check_range(self.va.size, offset, dst.len())?;
        self.vmm.bind()?;
        // SAFETY: the range is mapped and inside the region (checked); `dst` is writable.
        unsafe { raw::copy_dtoh(dst.as_mut_ptr(), phys.ptr + offset as u64, dst.len()) }
    }

    fn resident(&self, what: &str) -> Result<&Physical> {
        self.phys.as_ref().ok_or_else(|| {
            MemoryError::Cuda(format!("cannot {what} a paused region: resume it first"))
        })
    }

    /// Exports the physical memory as a POSIX fd another process can import and map.
    pub fn export_fd(&self) -> Result<OwnedFd> {
        let phys = self.phys.as_ref().ok_or_else(|| {
            MemoryError::Cuda("cannot export a paused region: resume it first".into())
        })?;
        self.vmm.bind()?;
        // SAFETY: the handle is live and was created with the POSIX-fd handle type.
        let fd = unsafe { raw::export_fd(phys.handle) }?;
        // SAFETY: the driver returned a fresh descriptor that we now own.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

fn check_range(size: usize, offset: usize, n: usize) -> Result<()> {
    match offset.checked_add(n) {
        Some(end) if end <= size => Ok(()),
        _ => Err(MemoryError::InvalidArgument(format!(
            "bytes {offset}..{offset}+{n} are outside the {size}-byte CUDA region"
        ))),
    }
}

/// Another region's physical memory mapped into this process ([`CudaVmm::import_fd`]);
/// unmapped and its address range freed on drop.
#[derive(Debug)]
pub struct ImportedRegion {
    vmm: CudaVmm,
    // field order matters: `phys` drops (unmaps) before `_va` frees the range
    phys: Physical,
    _va: Reservation,
}

impl ImportedRegion {
    /// Device address in this process.
    pub fn device_ptr(&self) -> u64 {
        self.phys.ptr
    }
    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.phys.size
    }
    /// Always false; for clippy's `len_without_is_empty`.
    pub fn is_empty(&self) -> bool {
        self.phys.size == 0
    }
    /// Copies `src` to the device at byte `offset` (synchronous).
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        check_range(self.phys.size, offset, src.len())?;
        self.vmm.bind()?;
        // SAFETY: the range is mapped and inside the region (checked); `src` is readable.
        unsafe { raw::copy_htod(self.phys.ptr + offset as u64, src.as_ptr(), src.len()) }
    }
    /// Copies `dst.len()` bytes from byte `offset` of the device to `dst` (synchronous).
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        check_range(self.phys.size, offset, dst.len())?;
        self.vmm.bind()?;
        // SAFETY: the range is mapped and inside the region (checked); `dst` is writable.
        unsafe { raw::copy_dtoh(dst.as_mut_ptr(), self.phys.ptr + offset as u64, dst.len()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vmm_region_pauses_and_resumes_or_reports_a_missing_driver() {
        if !driver_available() {
            let e = CudaVmm::new(0).expect_err("no libcuda on this machine");
            assert!(
                e.to_string().contains("libcuda.so could not be loaded"),
                "{e}"
            );
            return;
        }
        let vmm = CudaVmm::new(0).expect("device 0");
        let mut r = vmm.alloc(1, BackupPolicy::Cpu).expect("alloc");
        let addr = r.device_ptr();
        assert_eq!(r.len() % vmm.granularity(), 0);
        drop(r.export_fd().expect("export"));
        r.pause().expect("pause");
        assert!(r.is_paused() && r.pause().is_err() && r.export_fd().is_err());
        r.resume().expect("resume");
        assert_eq!(r.device_ptr(), addr);
        assert!(r.resume().is_err());
    }
}
