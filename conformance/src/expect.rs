//! What a check expects of one plugin call: it succeeds ([`ok`]), it is refused ([`refused`]),
//! or it answers `NotSupported` ([`not_supported`]); anything else is a [`Failure`] naming the
//! rule.

use crate::harness::{Failure, Outcome};
use tandem_plugin_api::{ErrorCode, PResult, PluginError, RResult};

/// `Ok` value or a failure of `rule` carrying the plugin's error.
pub(crate) fn ok<T>(r: PResult<T>, rule: &'static str, what: &str) -> Result<T, Failure> {
    match r {
        RResult::ROk(v) => Ok(v),
        RResult::RErr(e) => Err(Failure::new(rule, format!("{what} failed: {}", one(&e)))),
    }
}

pub(crate) fn one(e: &PluginError) -> String {
    format!("{} ({})", e.message, e.code.as_str())
}

/// Expects a refusal; returns the error.
pub(crate) fn refused<T: std::fmt::Debug>(
    r: PResult<T>,
    rule: &'static str,
    what: &str,
) -> Result<PluginError, Failure> {
    match r {
        RResult::ROk(v) => Err(Failure::new(
            rule,
            format!("{what} was accepted (returned {v:?}); it must be refused"),
        )),
        RResult::RErr(e) if e.code == ErrorCode::Panicked => Err(Failure::new(
            "no panic",
            format!("{what} panicked: {}", e.message),
        )),
        RResult::RErr(e) => Ok(e),
    }
}

/// Expects `NotSupported`.
pub(crate) fn not_supported<T: std::fmt::Debug>(r: PResult<T>, what: &str) -> Outcome {
    let e = refused(r, "undeclared operations are not supported", what)?;
    if e.code == ErrorCode::NotSupported {
        Ok(())
    } else {
        Err(Failure::new(
            "undeclared operations are not supported",
            format!(
                "{what} is not declared, so it must answer not_supported, not {}",
                one(&e)
            ),
        ))
    }
}
