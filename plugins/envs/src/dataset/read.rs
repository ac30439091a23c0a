//! Readers: a data file or directory to rows, each row a JSON object.
//!
//! - `*.jsonl` / `*.ndjson`: one JSON object a line (blank lines skipped); `*.json`: one JSON
//!   array of objects (or JSON lines).
//! - `*.parquet`: every row group, through the `parquet` crate's row API (nested lists and
//!   structs become JSON arrays and objects; byte columns become base64 text; a float NaN
//!   becomes `null`); snappy-, zstd- or gzip-compressed or uncompressed pages (not brotli, lz4).
//! - a directory written by `datasets`' `save_to_disk` (`state.json` listing its `data-*.arrow`
//!   files, Arrow IPC streams; see `arrow.rs`), or a single `*.arrow` stream file.
//!
//! Everything is read into memory when the environment is built: a file of N rows holds N
//! JSON rows (about twice the file's uncompressed text) for the run's life. There is no
//! streaming; a dataset that does not fit in memory is not supported.

use super::arrow;
use serde_json::Value;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::Path;
use tandem_plugin_api::PluginError;
use tandem_plugin_api::sdk::Result;

/// A read error about `path`, with how to fix it.
pub(crate) fn file_error(path: &Path, message: impl std::fmt::Display, help: &str) -> PluginError {
    PluginError::invalid_input(format!("{}: {message}", path.display())).with_help(help)
}

/// `err` attributed to the option `key` (`options.KEY: ...`).
pub(crate) fn at_key(key: &str, err: PluginError) -> PluginError {
    PluginError {
        message: format!("options.{key}: {}", err.message).into(),
        ..err
    }
}

/// The rows of `path` (a file or a `save_to_disk` directory); `key` is the option naming it
/// (errors are attributed to it).
pub fn read_rows(path: &Path, key: &str) -> Result<Vec<Value>> {
    read_any(path, key).map_err(|e| at_key(key, e))
}

fn read_any(path: &Path, key: &str) -> Result<Vec<Value>> {
    if !path.exists() {
        return Err(file_error(
            path,
            "does not exist",
            &format!(
                "set options.{key} to a JSONL, Parquet or `save_to_disk` path, relative to the job file's directory"
            ),
        ));
    }
    let ext = path
        .extension()
        .and_then(|e| e.to_str())
        .unwrap_or("")
        .to_ascii_lowercase();
    let rows = if path.is_dir() {
        arrow::read_dir(path)?
    } else {
        match ext.as_str() {
            "jsonl" | "ndjson" | "json" => read_jsonl(path)?,
            "parquet" | "pq" => read_parquet(path)?,
            "arrow" => arrow::read_stream_file(path)?,
            _ => {
                return Err(file_error(
                    path,
                    "is not a file type the dataset reads",
                    "use .jsonl (JSON lines), .json, .parquet, .arrow or a `save_to_disk` directory",
                ));
            }
        }
    };
    if rows.is_empty() {
        return Err(file_error(
            path,
            "has no rows",
            "point the option at a file with at least one row",
        ));
    }
    Ok(rows)
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "list",
        Value::Object(_) => "object",
    }
}

/// The name of a JSON value's type, for error lines.
pub fn type_name(v: &Value) -> &'static str {
    kind(v)
}

fn read_jsonl(path: &Path) -> Result<Vec<Value>> {
    let file = File::open(path).map_err(|e| {
        file_error(
            path,
            format!("cannot be opened: {e}"),
            "check the path and its permissions",
        )
    })?;
    let mut reader = BufReader::new(file);
    let mut first = String::new();
    reader.read_line(&mut first).map_err(|e| {
        file_error(
            path,
            format!("line 1 cannot be read: {e}"),
            "write the file as UTF-8 text",
        )
    })?;
    if first.trim_start().starts_with('[') {
        let mut text = first;
        std::io::Read::read_to_string(&mut reader, &mut text).map_err(|e| {
            file_error(
                path,
                format!("cannot be read: {e}"),
                "write the file as UTF-8 text",
            )
        })?;
        let rows: Vec<Value> = serde_json::from_str(&text).map_err(|e| {
            file_error(
                path,
                format!("is not a valid JSON array: {e}"),
                "write a JSON array of objects, or one object a line (.jsonl)",
            )
        })?;
        if let Some((i, bad)) = rows.iter().enumerate().find(|(_, r)| !r.is_object()) {
            return Err(file_error(
                path,
                format!("element {i} is a {}, not an object", kind(bad)),
                "make every element a JSON object",
            ));
        }
        return Ok(rows);
    }
    let mut rows = Vec::new();
    let mut line = first;
    let mut number = 1usize;
    loop {
        if !line.trim().is_empty() {
            let value: Value = serde_json::from_str(&line).map_err(|e| {
                file_error(
                    path,
                    format!(
                        "line {number} is not valid JSON: {}",
                        e.to_string().split(" at line ").next().unwrap_or("")
                    ),
                    &format!("fix or remove line {number}: every line must be one JSON object"),
                )
            })?;
            if !value.is_object() {
                return Err(file_error(
                    path,
                    format!("line {number} is a {}, not a JSON object", kind(&value)),
                    &format!("fix line {number}: every line must be one JSON object"),
                ));
            }
            rows.push(value);
        }
        line.clear();
        number += 1;
        let read = reader.read_line(&mut line).map_err(|e| {
            file_error(
                path,
                format!("line {number} cannot be read: {e}"),
                "write the file as UTF-8 text",
            )
        })?;
        if read == 0 {
            break;
        }
    }
    Ok(rows)
}

fn read_parquet(path: &Path) -> Result<Vec<Value>> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let unreadable = |e: &dyn std::fmt::Display| {
        file_error(
            path,
            format!("is not a readable Parquet file: {e}"),
            "write it with pandas/pyarrow (`df.to_parquet(path)`; snappy, zstd, gzip or no compression)",
        )
    };
    let file = File::open(path).map_err(|e| {
        file_error(
            path,
            format!("cannot be opened: {e}"),
            "check the path and its permissions",
        )
    })?;
    let reader = SerializedFileReader::new(file).map_err(|e| unreadable(&e))?;
    let mut rows = Vec::new();
    for row in reader.get_row_iter(None).map_err(|e| unreadable(&e))? {
        rows.push(row.map_err(|e| unreadable(&e))?.to_json_value());
    }
    Ok(rows)
}
