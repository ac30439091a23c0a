//! Benchmark figures beside their limits — the physical or peer figure measured in the same
//! run. [`table`] renders them as an aligned table; [`write_json_lines`] as one JSON object per
//! figure, `{"bench", "case", "value", "unit", "limit", "ratio", "limit_name", "target"}` (a
//! non-finite number is `null`). Shared by `tandem bench` and the bench crates, with the
//! machine bounds ([`machine`]) a figure falls back to when its peer cannot run.

// The one unsafe call (the GEMM of `machine`) allows it locally.
#![deny(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

use std::io::Write;

use serde::Serialize;

pub mod machine;

/// Why figures could not be printed.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// A figure did not serialise.
    #[error("cannot serialise a figure: {0}")]
    Json(#[from] serde_json::Error),
    /// The output refused the line.
    #[error("cannot write a figure: {0}")]
    Io(#[from] std::io::Error),
}

/// One measured figure and the limit it is compared with.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Figure {
    /// Benchmark name (`abi`, `memory`, ...).
    pub bench: String,
    /// What was measured.
    pub case: String,
    /// The measured value.
    pub value: f64,
    /// Unit of `value` and `limit`.
    pub unit: String,
    /// The figure it is compared with, measured in the same run.
    pub limit: f64,
    /// `value / limit` (NaN when the limit is 0).
    pub ratio: f64,
    /// What `limit` is (e.g. `memcpy`, `direct dyn call`).
    pub limit_name: String,
    /// The target on `ratio`, in words (e.g. `<= 1.5`), if any.
    pub target: String,
}

impl Figure {
    /// A figure with `ratio` computed from value and limit.
    pub fn new(bench: &str, case: &str, value: f64, unit: &str, limit: f64) -> Self {
        Figure {
            bench: bench.to_owned(),
            case: case.to_owned(),
            value,
            unit: unit.to_owned(),
            limit,
            ratio: if limit != 0.0 {
                value / limit
            } else {
                f64::NAN
            },
            limit_name: String::new(),
            target: String::new(),
        }
    }

    /// Names what the limit is.
    #[must_use]
    pub fn limit_name(mut self, name: &str) -> Self {
        self.limit_name = name.to_owned();
        self
    }

    /// States the target on the ratio.
    #[must_use]
    pub fn target(mut self, target: &str) -> Self {
        self.target = target.to_owned();
        self
    }
}

/// Renders figures as an aligned table: a header line, then one line per figure (columns two
/// spaces apart, trailing blanks trimmed, no final newline).
pub fn table(figures: &[Figure]) -> String {
    let header = [
        "bench", "case", "value", "limit", "limit is", "ratio", "target",
    ];
    let rows: Vec<[String; 7]> = figures
        .iter()
        .map(|f| {
            [
                f.bench.clone(),
                f.case.clone(),
                format!("{} {}", fmt_num(f.value), f.unit),
                format!("{} {}", fmt_num(f.limit), f.unit),
                f.limit_name.clone(),
                format!("{:.3}", f.ratio),
                f.target.clone(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: Vec<&str>| {
        cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_owned()
    };
    let mut out = vec![line(header.to_vec())];
    out.extend(
        rows.iter()
            .map(|r| line(r.iter().map(String::as_str).collect())),
    );
    out.join("\n")
}

/// Writes each figure as one line of JSON.
pub fn write_json_lines(out: &mut impl Write, figures: &[Figure]) -> Result<(), ReportError> {
    for f in figures {
        serde_json::to_writer(&mut *out, f)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

/// [`write_json_lines`] to standard output.
pub fn print_json_lines(figures: &[Figure]) -> Result<(), ReportError> {
    let mut out = std::io::stdout().lock();
    write_json_lines(&mut out, figures)?;
    out.flush()?;
    Ok(())
}

/// Three significant-ish decimals: one above 100, three above 1, four below.
fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn figures() -> Vec<Figure> {
        vec![
            Figure::new("native", "tiny decode b1", 1560.25, "tok/s", 3120.5)
                .limit_name("candle 0.11")
                .target(">= 1.0"),
            Figure::new("memory", "pause", 0.5, "s", 0.0),
        ]
    }

    #[test]
    fn ratio_is_value_over_limit_and_nan_without_a_limit() {
        let f = figures();
        assert_eq!(f[0].ratio, 0.5);
        assert!(f[1].ratio.is_nan());
        assert_eq!(f[1].limit_name, "");
        assert_eq!(f[1].target, "");
    }

    #[test]
    fn table_aligns_columns_and_trims_lines() {
        let t = table(&figures());
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(
            lines,
            [
                "bench   case            value         limit         limit is     ratio  target",
                "native  tiny decode b1  1560.2 tok/s  3120.5 tok/s  candle 0.11  0.500  >= 1.0",
                "memory  pause           0.5000 s      0.0000 s                   NaN",
            ]
        );
        assert_eq!(
            table(&[]),
            "bench  case  value  limit  limit is  ratio  target"
        );
    }

    #[test]
    fn json_lines_carry_every_field_one_object_per_line() {
        let mut out = Vec::new();
        write_json_lines(&mut out, &figures()).unwrap();
        let text = String::from_utf8(out).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(text.ends_with('\n'));
        assert_eq!(
            lines[0],
            r#"{"bench":"native","case":"tiny decode b1","value":1560.25,"unit":"tok/s","limit":3120.5,"ratio":0.5,"limit_name":"candle 0.11","target":">= 1.0"}"#
        );
        assert!(lines[1].contains(r#""ratio":null"#), "{}", lines[1]);
    }
}
