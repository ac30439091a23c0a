//! Arrow data: a `datasets` `save_to_disk` directory (its `state.json` lists `data-*.arrow`
//! files, each an Arrow IPC stream) or one `*.arrow` file (stream, or IPC file format), read
//! to JSON rows.
//!
//! Converted types: null, boolean, integers, floats (NaN becomes `null`), strings (also large
//! and view), lists (also large and fixed-size), structs and dictionaries of these. Another
//! type (binary, e.g. an `Image` feature; dates; decimals) is refused with its column named.

use super::read::file_error;
use arrow_array::cast::AsArray;
use arrow_array::types::{
    Float16Type, Float32Type, Float64Type, Int8Type, Int16Type, Int32Type, Int64Type, UInt8Type,
    UInt16Type, UInt32Type, UInt64Type,
};
use arrow_array::{Array, RecordBatch};
use arrow_schema::DataType;
use serde_json::{Map, Number, Value};
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use tandem_plugin_api::sdk::Result;

fn float(f: f64) -> Value {
    Number::from_f64(f).map_or(Value::Null, Value::Number)
}

/// Cell `i` of `a` as JSON.
fn cell(a: &dyn Array, i: usize) -> std::result::Result<Value, String> {
    if a.is_null(i) {
        return Ok(Value::Null);
    }
    let list = |values: std::sync::Arc<dyn Array>| {
        (0..values.len())
            .map(|j| cell(values.as_ref(), j))
            .collect::<std::result::Result<Vec<_>, _>>()
            .map(Value::Array)
    };
    Ok(match a.data_type() {
        DataType::Null => Value::Null,
        DataType::Boolean => Value::Bool(a.as_boolean().value(i)),
        DataType::Int8 => a.as_primitive::<Int8Type>().value(i).into(),
        DataType::Int16 => a.as_primitive::<Int16Type>().value(i).into(),
        DataType::Int32 => a.as_primitive::<Int32Type>().value(i).into(),
        DataType::Int64 => a.as_primitive::<Int64Type>().value(i).into(),
        DataType::UInt8 => a.as_primitive::<UInt8Type>().value(i).into(),
        DataType::UInt16 => a.as_primitive::<UInt16Type>().value(i).into(),
        DataType::UInt32 => a.as_primitive::<UInt32Type>().value(i).into(),
        DataType::UInt64 => a.as_primitive::<UInt64Type>().value(i).into(),
        DataType::Float16 => float(f64::from(a.as_primitive::<Float16Type>().value(i).to_f32())),
        DataType::Float32 => float(f64::from(a.as_primitive::<Float32Type>().value(i))),
        DataType::Float64 => float(a.as_primitive::<Float64Type>().value(i)),
        DataType::Utf8 => a.as_string::<i32>().value(i).into(),
        DataType::LargeUtf8 => a.as_string::<i64>().value(i).into(),
        DataType::Utf8View => a.as_string_view().value(i).into(),
        DataType::List(_) => list(a.as_list::<i32>().value(i))?,
        DataType::LargeList(_) => list(a.as_list::<i64>().value(i))?,
        DataType::FixedSizeList(..) => list(a.as_fixed_size_list().value(i))?,
        DataType::Struct(fields) => {
            let s = a.as_struct();
            let mut map = Map::new();
            for (f, column) in fields.iter().zip(s.columns()) {
                map.insert(f.name().clone(), cell(column.as_ref(), i)?);
            }
            Value::Object(map)
        }
        DataType::Dictionary(..) => {
            let d = a.as_any_dictionary();
            let key = d
                .normalized_keys()
                .get(i)
                .copied()
                .ok_or("a dictionary key is missing")?;
            cell(d.values().as_ref(), key)?
        }
        other => return Err(format!("the Arrow type {other} is not converted")),
    })
}

fn batch_rows(batch: &RecordBatch, path: &Path, rows: &mut Vec<Value>) -> Result<()> {
    let schema = batch.schema();
    for i in 0..batch.num_rows() {
        let mut map = Map::new();
        for (field, column) in schema.fields().iter().zip(batch.columns()) {
            let value = cell(column.as_ref(), i).map_err(|e| {
                file_error(
                    path,
                    format!("column `{}`: {e}", field.name()),
                    "drop or cast the column before saving (e.g. `ds.remove_columns([...])`)",
                )
            })?;
            map.insert(field.name().clone(), value);
        }
        rows.push(Value::Object(map));
    }
    Ok(())
}

/// The rows of one Arrow IPC file (stream format as `datasets` writes, or the file format).
pub fn read_stream_file(path: &Path) -> Result<Vec<Value>> {
    let unreadable = |e: &dyn std::fmt::Display| {
        file_error(
            path,
            format!("is not a readable Arrow IPC file: {e}"),
            "write it with `datasets` (`save_to_disk`) or pyarrow's IPC writer",
        )
    };
    let open = || {
        File::open(path).map_err(|e| {
            file_error(
                path,
                format!("cannot be opened: {e}"),
                "check the path and its permissions",
            )
        })
    };
    let mut magic = [0u8; 6];
    let is_file_format = open()?.read_exact(&mut magic).is_ok() && &magic == b"ARROW1";
    let mut rows = Vec::new();
    if is_file_format {
        let reader =
            arrow_ipc::reader::FileReader::try_new(open()?, None).map_err(|e| unreadable(&e))?;
        for batch in reader {
            batch_rows(&batch.map_err(|e| unreadable(&e))?, path, &mut rows)?;
        }
    } else {
        let reader = arrow_ipc::reader::StreamReader::try_new(BufReader::new(open()?), None)
            .map_err(|e| unreadable(&e))?;
        for batch in reader {
            batch_rows(&batch.map_err(|e| unreadable(&e))?, path, &mut rows)?;
        }
    }
    Ok(rows)
}

/// The data files of a `save_to_disk` directory, in order: `state.json`'s `_data_files`, or
/// else its `data-*.arrow` files sorted by name.
fn data_files(dir: &Path) -> Result<Vec<PathBuf>> {
    if dir.join("dataset_dict.json").exists() {
        return Err(file_error(
            dir,
            "is a `DatasetDict` (several splits)",
            &format!(
                "point the option at one split's directory, e.g. {}",
                dir.join("train").display()
            ),
        ));
    }
    let state = dir.join("state.json");
    if state.exists() {
        let text = std::fs::read_to_string(&state).map_err(|e| {
            file_error(
                &state,
                format!("cannot be read: {e}"),
                "check its permissions",
            )
        })?;
        let json: Value = serde_json::from_str(&text).map_err(|e| {
            file_error(
                &state,
                format!("is not valid JSON: {e}"),
                "save the dataset again with `save_to_disk`",
            )
        })?;
        let names: Option<Vec<&str>> =
            json.get("_data_files")
                .and_then(Value::as_array)
                .map(|files| {
                    files
                        .iter()
                        .filter_map(|f| f.get("filename").and_then(Value::as_str))
                        .collect()
                });
        return match names {
            Some(names) if !names.is_empty() => {
                Ok(names.into_iter().map(|n| dir.join(n)).collect())
            }
            _ => Err(file_error(
                &state,
                "lists no `_data_files`",
                "save the dataset again with `save_to_disk`",
            )),
        };
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| {
            file_error(
                dir,
                format!("cannot be listed: {e}"),
                "check its permissions",
            )
        })?
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|p| {
            let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
            name.starts_with("data-") && name.ends_with(".arrow")
        })
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(file_error(
            dir,
            "is a directory with no state.json and no data-*.arrow files",
            "point the option at a file, or at a directory written by `datasets`' `save_to_disk`",
        ));
    }
    Ok(files)
}

/// The rows of a `save_to_disk` directory, its files in order.
pub fn read_dir(dir: &Path) -> Result<Vec<Value>> {
    let mut rows = Vec::new();
    for file in data_files(dir)? {
        if !file.exists() {
            return Err(file_error(
                &file,
                "is listed in state.json but does not exist",
                "save the dataset again with `save_to_disk`",
            ));
        }
        rows.extend(read_stream_file(&file)?);
    }
    Ok(rows)
}
