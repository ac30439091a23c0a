//! `Pending`: the handle of a non-blocking operation running on a background thread.

use crate::error::{Result, TransportError};
use std::thread::JoinHandle;

/// A non-blocking operation in flight. Dropping it without `wait()` detaches the thread (the
/// operation still completes or times out).
#[must_use = "call wait() to learn whether the operation succeeded"]
pub struct Pending<T> {
    what: &'static str,
    h: Result<JoinHandle<Result<T>>>,
}

impl<T: Send + 'static> Pending<T> {
    pub(crate) fn spawn(
        what: &'static str,
        f: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Self {
        let h = std::thread::Builder::new()
            .name(format!("tandem-{what}"))
            .spawn(f)
            .map_err(|e| TransportError::io(format!("spawning the {what} thread"), e));
        Pending { what, h }
    }

    /// True when the operation has finished (successfully or not).
    pub fn is_finished(&self) -> bool {
        self.h.as_ref().map_or(true, JoinHandle::is_finished)
    }

    /// Blocks until the operation finishes and returns its result.
    pub fn wait(self) -> Result<T> {
        match self.h {
            Err(e) => Err(e),
            Ok(h) => h.join().unwrap_or_else(|_| {
                Err(TransportError::Invalid(format!(
                    "the {} thread panicked (a bug in tandem-transport)",
                    self.what
                )))
            }),
        }
    }
}
