//! The panic guard: the one export wrapper every call into plugin code runs under.

use super::Result;
use crate::error::{ErrorCode, PResult, PluginError};
use abi_stable::std_types::RResult;
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Runs `f`, turning an `Err` into `RErr` and a panic into a [`ErrorCode::Panicked`] error
/// carrying the panic message. Every call into plugin code goes through this.
pub fn guard<T>(f: impl FnOnce() -> Result<T>) -> PResult<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(value)) => RResult::ROk(value),
        Ok(Err(err)) => RResult::RErr(err),
        Err(payload) => {
            let what = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_owned());
            RResult::RErr(
                PluginError::new(ErrorCode::Panicked, format!("plugin panicked: {what}"))
                    .with_help("this is a bug in the plugin; report it with the log above"),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guard_turns_panic_into_error() {
        let res: PResult<()> = guard(|| panic!("boom {}", 7));
        match res {
            RResult::RErr(e) => {
                assert_eq!(e.code, ErrorCode::Panicked);
                assert!(e.message.contains("boom 7"), "{}", e.message);
            }
            RResult::ROk(()) => panic!("expected an error"),
        }
    }

    #[test]
    fn guard_passes_values_and_errors() {
        assert_eq!(guard(|| Ok(3)), RResult::ROk(3));
        let e = PluginError::invalid_input("bad");
        assert_eq!(guard::<()>(|| Err(e.clone())), RResult::RErr(e));
    }
}
