//! `tandem bench NAME`: every figure is printed beside its limit — the physical or peer figure
//! measured in the same run — as a table, or with `--json` as one JSON object per figure:
//! `{"bench", "case", "value", "unit", "limit", "ratio"}`.

pub mod abi;
pub mod bridges;
pub mod bridges_vllm;
pub mod command;
pub mod control;
pub mod memory;
pub mod rl_loop;
pub mod transport;

use serde::Serialize;

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
    /// `value / limit`.
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

/// Renders figures as an aligned table.
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

fn fmt_num(v: f64) -> String {
    if v.abs() >= 100.0 {
        format!("{v:.1}")
    } else if v.abs() >= 1.0 {
        format!("{v:.3}")
    } else {
        format!("{v:.4}")
    }
}
