//! Shared glue helpers: `NativeError` → ABI error mapping, options parsing (serde,
//! `deny_unknown_fields`) with the static checks `validate_config` runs too, logging through
//! the host.

use serde::de::DeserializeOwned;
use tandem_native_core::error::NativeError;
use tandem_plugin_api::sdk;
use tandem_plugin_api::{ConfigProblem, ErrorCode, HostBox, LogLevel, PluginError};

/// Maps a core error to the ABI error record, prefixed with what the glue was doing.
pub fn to_plugin(context: &str, e: NativeError) -> PluginError {
    let code = match &e {
        NativeError::Io { .. } => ErrorCode::Io,
        NativeError::Safetensors { .. } => ErrorCode::Corrupt,
        NativeError::Json { .. }
        | NativeError::Config(_)
        | NativeError::Param(_)
        | NativeError::Input(_)
        | NativeError::Tokenizer(_) => ErrorCode::InvalidInput,
        NativeError::Buffer(_) => ErrorCode::Runtime,
    };
    let help = match code {
        ErrorCode::Io => "check that the directory exists and holds a Hugging Face model",
        ErrorCode::Corrupt => "the file is damaged or not safetensors; re-export the checkpoint",
        ErrorCode::InvalidInput => "fix the input named above",
        _ => "",
    };
    PluginError::new(code, format!("{context}: {e}")).with_help(help)
}

/// Extension turning a core `Result` into the SDK's, with context.
pub trait Ctx<T> {
    /// Maps the error with [`to_plugin`].
    fn ctx(self, context: &str) -> Result<T, PluginError>;
}

impl<T> Ctx<T> for tandem_native_core::error::Result<T> {
    fn ctx(self, context: &str) -> Result<T, PluginError> {
        self.map_err(|e| to_plugin(context, e))
    }
}

/// Static checks of a component's parsed options (ranges, enum values, combinations): what
/// needs no model, memory or process. Implemented in `plugin/validate.rs`.
pub trait CheckOptions {
    /// Every problem, keyed by its path inside the options table.
    fn problems(&self) -> Vec<ConfigProblem>;
}

/// Every problem of a component's options JSON: the parse error, or the static checks'.
/// What `validate_config` reports.
pub fn options_problems<T: DeserializeOwned + CheckOptions>(json: &str) -> Vec<ConfigProblem> {
    match sdk::parse_options::<T>(json) {
        Ok(opts) => opts.problems(),
        Err(p) => vec![p],
    }
}

/// Parses a component's options JSON (empty = all defaults) into `T` and runs its static
/// checks: the constructors' side of [`options_problems`] (one parser, one set of checks).
pub fn parse_options<T: DeserializeOwned + CheckOptions>(
    json: &str,
    what: &str,
) -> Result<T, PluginError> {
    let opts: T = sdk::parse_options(json).map_err(|p| p.to_error(what))?;
    match opts.problems().first() {
        Some(p) => Err(p.to_error(what)),
        None => Ok(opts),
    }
}

/// Writes a log line through the host.
pub fn log(host: &HostBox, level: LogLevel, message: &str) {
    host.log(level, "native".into(), message.into());
}

/// Unwraps an ABI result from a host call into the SDK's `Result`, with context.
pub fn host_call<T>(r: tandem_plugin_api::PResult<T>, context: &str) -> Result<T, PluginError> {
    r.into_result().map_err(|e| PluginError {
        message: format!("{context}: {}", e.message).into(),
        ..e
    })
}

/// Checks that every tag is one of `allowed`.
pub fn check_tags(tags: &[String], allowed: &[&str], what: &str) -> Result<(), PluginError> {
    for t in tags {
        if !allowed.contains(&t.as_str()) {
            return Err(PluginError::invalid_input(format!(
                "{what}: tag `{t}` is not one this component holds (it holds {allowed:?})"
            )));
        }
    }
    if tags.is_empty() {
        return Err(PluginError::invalid_input(format!("{what}: no tags given")));
    }
    Ok(())
}
