//! The tail of a child's log file as one line, preferring the lines that name an error (a
//! Python traceback ends with one), for the one-line errors plugins return.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

/// Bytes read from the end of the log.
const TAIL_BYTES: u64 = 16 * 1024;

/// The last `lines` lines of `log` naming an error (or the last lines at all), joined with
/// ` | `; `(log is empty)` when there is nothing to show.
pub fn log_tail(log: &Path, lines: usize) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(log) {
        let len = f.metadata().map(|m| m.len()).unwrap_or(0);
        let _ = f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)));
        let mut buf = Vec::new();
        let _ = f.read_to_end(&mut buf);
        text = String::from_utf8_lossy(&buf).into_owned();
    }
    let all: Vec<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with("warnings.warn") && !is_noise(l))
        .collect();
    let errors: Vec<&str> = all
        .iter()
        .copied()
        .filter(|l| l.contains("Error") || l.contains("error:") || l.contains("Exception"))
        .collect();
    let pick = if errors.is_empty() { &all } else { &errors };
    let tail = pick[pick.len().saturating_sub(lines)..].join(" | ");
    if tail.is_empty() {
        "(log is empty)".into()
    } else {
        tail
    }
}

/// C++ stack frames and glog-style warning lines torch prints around a failure, and the
/// torchrun agent's own report that a child failed (the child's error is the line to show).
fn is_noise(line: &str) -> bool {
    line.starts_with("frame #")
        || line.starts_with("W1")
        || line.starts_with("<omitting")
        || line.contains("ChildFailedError")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn prefers_error_lines_and_skips_frames() {
        let dir = std::env::temp_dir().join(format!("tandem-logtail-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("x.log");
        std::fs::write(
            &log,
            "starting\nTraceback (most recent call last):\n  File \"a.py\"\nframe #3: foo\nValueError: bad model\nshutting down\n",
        )
        .unwrap();
        assert_eq!(log_tail(&log, 1), "ValueError: bad model");
        std::fs::write(
            &log,
            "[rank0]: ModuleNotFoundError: No module named 'x'\n    raise ChildFailedError(\ntorch.distributed.elastic.multiprocessing.errors.ChildFailedError:\n",
        )
        .unwrap();
        assert_eq!(
            log_tail(&log, 1),
            "[rank0]: ModuleNotFoundError: No module named 'x'"
        );
        assert_eq!(log_tail(&dir.join("missing.log"), 2), "(log is empty)");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
