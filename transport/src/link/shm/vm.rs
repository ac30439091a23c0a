//! Syscall layer of the single-copy ("cross memory attach") path: `process_vm_readv` to copy
//! straight out of a peer process's address space, and `prctl(PR_SET_PTRACER)` so that Yama
//! (when present) lets peers read this process.

use nix::errno::Errno;

/// Allows any process of this user to attach-read this process (Yama `ptrace_scope = 1`
/// otherwise restricts it to descendants). Returns false when the kernel refused for another
/// reason than "Yama is absent" (EINVAL), which the caller may log; the single-copy path then
/// falls back by itself if reads fail.
pub(crate) fn allow_peer_reads() -> bool {
    // SAFETY: prctl(PR_SET_PTRACER, ANY) takes two integers and touches no memory of ours.
    let r = unsafe { libc::prctl(libc::PR_SET_PTRACER, libc::PR_SET_PTRACER_ANY, 0, 0, 0) };
    r == 0 || Errno::last() == Errno::EINVAL
}

/// Copies `dst.len()` bytes from address `src` in process `pid` into `dst` with one
/// `process_vm_readv` call; returns the number of bytes copied (may be short, e.g. at a
/// mapping boundary; the caller loops).
///
/// Reading foreign memory cannot corrupt ours: the kernel writes only into `dst`, and a bad
/// remote address yields EFAULT, not undefined behaviour.
pub(crate) fn read_from(pid: i32, src: u64, dst: &mut [u8]) -> Result<usize, Errno> {
    let local = libc::iovec {
        iov_base: dst.as_mut_ptr().cast(),
        iov_len: dst.len(),
    };
    let remote = libc::iovec {
        iov_base: src as usize as *mut libc::c_void,
        iov_len: dst.len(),
    };
    // SAFETY: `local` describes exactly the writable slice `dst`, borrowed mutably for the
    // call; `remote` is only interpreted in process `pid`'s address space by the kernel (which
    // validates it and fails with EFAULT/ESRCH instead of touching our memory); both iovecs
    // live on our stack for the duration of the call.
    let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
    if n < 0 {
        Err(Errno::last())
    } else {
        Ok(n as usize)
    }
}
