//! Futex wait/wake on a 32-bit word in shared memory (process-shared, not FUTEX_PRIVATE).
//! The only syscall layer of the shm backend.

use std::sync::atomic::AtomicU32;
use std::time::{Duration, Instant};

/// Sleeps while `*word == expected`, at most `timeout`. Spurious wake-ups are allowed; the
/// caller re-checks its condition.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = libc::timespec {
        tv_sec: timeout.as_secs().min(i64::MAX as u64) as libc::time_t,
        tv_nsec: libc::c_long::from(timeout.subsec_nanos() as i32),
    };
    // SAFETY: `word` is a valid, aligned 32-bit atomic that lives in a shared mapping for the
    // duration of the call; FUTEX_WAIT only reads it and `ts` outlives the call. Errors
    // (EAGAIN when the value changed, ETIMEDOUT, EINTR) are all handled by re-checking.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
            std::ptr::null::<u32>(),
            0u32,
        );
    }
}

/// Wakes every waiter on `word`.
pub(crate) fn wake_all(word: &AtomicU32) {
    // SAFETY: `word` is a valid aligned 32-bit atomic in a mapping that outlives the call;
    // FUTEX_WAKE does not access memory beyond hashing the address.
    unsafe {
        libc::syscall(libc::SYS_futex, word.as_ptr(), libc::FUTEX_WAKE, i32::MAX);
    }
}

/// Spins until `ready` holds or `spin` has passed: the step before sleeping on a futex. Polls
/// with a CPU pause hint and, every 256 polls, checks the clock and yields, so a runnable peer
/// on this core goes first (oversubscribed machines).
pub(crate) fn spin(spin: Duration, ready: impl Fn() -> bool) {
    let until = Instant::now() + spin;
    let mut i = 0u32;
    while !ready() {
        std::hint::spin_loop();
        i += 1;
        if i.is_multiple_of(256) {
            if Instant::now() >= until {
                break;
            }
            std::thread::yield_now();
        }
    }
}
