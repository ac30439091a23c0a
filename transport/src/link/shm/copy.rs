//! Copy-out from the ring into the receiver's buffer. Large copies use non-temporal stores
//! on x86_64: the destination is not read again soon, and streaming stores skip the
//! read-for-ownership of each destination line, which otherwise costs a third of the memory
//! traffic of a DRAM-bound copy.

/// Messages at least this long are copied out with streaming stores (smaller ones are likely
/// to be read soon, from cache).
pub(crate) const STREAM_MIN: usize = 16 << 20;

/// Pieces shorter than this are copied plainly even in streaming mode.
const STREAM_PIECE: usize = 4096;

/// Copies `n` bytes from `src` to `dst`.
///
/// # Safety
/// `src` must be valid for `n` reads and `dst` for `n` writes; the ranges must not overlap.
pub(crate) unsafe fn copy_out(src: *const u8, dst: *mut u8, n: usize, stream: bool) {
    #[cfg(target_arch = "x86_64")]
    if stream && n >= STREAM_PIECE {
        // SAFETY: forwarded caller contract.
        unsafe { stream_copy(src, dst, n) };
        return;
    }
    let _ = stream;
    // SAFETY: forwarded caller contract.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, n) };
}

#[cfg(target_arch = "x86_64")]
unsafe fn stream_copy(src: *const u8, dst: *mut u8, n: usize) {
    use std::arch::x86_64::{__m128i, _mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // Head: plain copy up to a 16-byte aligned destination.
    let head = dst.align_offset(16).min(n);
    // SAFETY: head <= n, inside both ranges.
    unsafe { std::ptr::copy_nonoverlapping(src, dst, head) };
    let mut i = head;
    // SAFETY: every 64-byte step stays below n; dst + i is 16-byte aligned (SSE2 is part of
    // the x86_64 baseline, so the intrinsics are always available); loads are unaligned.
    unsafe {
        while i + 64 <= n {
            let s = src.add(i) as *const __m128i;
            let d = dst.add(i) as *mut __m128i;
            let a = _mm_loadu_si128(s);
            let b = _mm_loadu_si128(s.add(1));
            let c = _mm_loadu_si128(s.add(2));
            let e = _mm_loadu_si128(s.add(3));
            _mm_stream_si128(d, a);
            _mm_stream_si128(d.add(1), b);
            _mm_stream_si128(d.add(2), c);
            _mm_stream_si128(d.add(3), e);
            i += 64;
        }
        std::ptr::copy_nonoverlapping(src.add(i), dst.add(i), n - i);
        // Order the streaming stores before anything published after this copy.
        _mm_sfence();
    }
}
