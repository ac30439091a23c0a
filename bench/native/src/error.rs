//! Why a benchmark run failed.

use tandem_native_core::NativeError;

/// A failed benchmark run: one line for stderr.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    /// The native core failed while doing `what`.
    #[error("{what}: {source}")]
    Native {
        /// What the bench was doing.
        what: String,
        /// The core's error.
        source: NativeError,
    },
    /// candle failed (feature `candle`).
    #[cfg(feature = "candle")]
    #[error("candle: {0}")]
    Candle(String),
    /// The two sides did not compute the same model or the same work (feature `candle`).
    #[cfg(feature = "candle")]
    #[error("{0}")]
    Mismatch(String),
    /// A command-line argument was not understood.
    #[error("{0}")]
    Usage(String),
    /// The figures could not be printed.
    #[error(transparent)]
    Report(#[from] tandem_bench_report::ReportError),
}

/// Wraps a core error with what the bench was doing.
pub fn native(what: &str) -> impl Fn(NativeError) -> BenchError {
    let what = what.to_owned();
    move |source| BenchError::Native {
        what: what.clone(),
        source,
    }
}
