//! A `metrics.jsonl` line as a tracker sees it: its step, its wall time and every numeric
//! field as a named scalar (nested objects joined with `/`: `phases/train`, `ledger/engine-0`;
//! booleans as 0 and 1; strings and lists are not scalars and are left out).

use crate::error::TrackError;
use serde_json::{Map, Value};
use std::path::Path;

/// One step's figures.
#[derive(Debug, Clone, PartialEq)]
pub struct Line {
    /// The step (0: the evaluation before training).
    pub step: u32,
    /// Unix time (s) the line was written, when it says.
    pub time: Option<f64>,
    /// Every scalar, in the line's order.
    pub scalars: Vec<(String, f64)>,
}

impl Line {
    /// The line of one JSON object; `None` without a `step`.
    pub fn of(v: &Value) -> Option<Line> {
        let obj = v.as_object()?;
        let step = u32::try_from(obj.get("step")?.as_u64()?).ok()?;
        let time = obj.get("time").and_then(Value::as_f64);
        let mut scalars = Vec::new();
        collect(obj, "", &mut scalars);
        Some(Line {
            step,
            time,
            scalars,
        })
    }
}

fn collect(obj: &Map<String, Value>, prefix: &str, out: &mut Vec<(String, f64)>) {
    for (k, v) in obj {
        if prefix.is_empty() && (k == "step" || k == "time") {
            continue;
        }
        let name = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}/{k}")
        };
        match v {
            Value::Number(n) => {
                if let Some(x) = n.as_f64() {
                    out.push((name, x));
                }
            }
            Value::Bool(b) => out.push((name, f64::from(u8::from(*b)))),
            Value::Object(inner) => collect(inner, &name, out),
            Value::Null | Value::String(_) | Value::Array(_) => {}
        }
    }
}

/// The lines of a metrics file in step order; a step written twice (a resumed run's lines
/// are rewritten) counts once, as written last. A missing file has no lines.
pub fn read_lines(path: &Path) -> Result<Vec<Line>, TrackError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(TrackError::io(format!("reading {}", path.display()))(e)),
    };
    let mut by_step = std::collections::BTreeMap::new();
    for raw in text.lines() {
        if let Some(line) = serde_json::from_str::<Value>(raw)
            .ok()
            .as_ref()
            .and_then(Line::of)
        {
            by_step.insert(line.step, line);
        }
    }
    Ok(by_step.into_values().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_fields_are_joined_with_a_slash_and_non_numbers_left_out() {
        let v = serde_json::json!({
            "step": 3, "time": 12.5, "loss": 0.25, "speculating": true,
            "phases": {"train": 1.5, "sync": 0.5}, "hosts": {"trainer": "h (1.2.3.4)"},
            "eval_accuracy": null, "list": [1, 2]
        });
        let line = Line::of(&v).unwrap_or_else(|| panic!("a line"));
        assert_eq!(line.step, 3);
        assert_eq!(line.time, Some(12.5));
        let mut got = line.scalars.clone();
        got.sort_by(|a, b| a.0.cmp(&b.0));
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            ["loss", "phases/sync", "phases/train", "speculating"]
        );
        assert_eq!(got[3].1, 1.0);
    }

    #[test]
    fn a_step_written_twice_counts_once_as_written_last() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let p = dir.path().join("metrics.jsonl");
        std::fs::write(
            &p,
            "{\"step\":1,\"loss\":1}\n{\"step\":2,\"loss\":2}\nnot json\n{\"step\":2,\"loss\":3}\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let lines = read_lines(&p).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1].scalars, vec![("loss".to_string(), 3.0)]);
        assert!(
            read_lines(&dir.path().join("none"))
                .unwrap_or_else(|e| panic!("{e}"))
                .is_empty()
        );
    }
}
