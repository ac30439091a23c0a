//! The bridge's own figures since the last `stats()` call, per half: the trainer half's bytes
//! (raw and on the wire, their ratio) and seconds compressing and transmitting; the engine
//! half's bytes received and seconds receiving, decompressing and handing buckets to the
//! engine. The host records the trainer half's under `bridge.<name>` and sums the engines'
//! under `bridge.engines.<name>`, so the engine half reports no ratio (a sum of ratios means
//! nothing).

use std::time::Duration;
use tandem_plugin_api::Metric;

/// Counters of one process, reset by [`Stats::take`].
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Stats {
    /// Syncs the trainer half shipped.
    pub shipped: u64,
    /// Bytes the trainer half compressed.
    pub raw_bytes: u64,
    /// Bytes it put on the wire.
    pub wire_bytes: u64,
    /// Shuffling and compressing.
    pub compress: Duration,
    /// Broadcasting the frames.
    pub transmit: Duration,
    /// Syncs the engine half received.
    pub received: u64,
    /// Bytes it received.
    pub received_bytes: u64,
    /// In broadcasts and checksums.
    pub receive: Duration,
    /// Decompressing and unshuffling.
    pub decompress: Duration,
    /// In the engine's sink (its copy into the weights it serves).
    pub put: Duration,
}

impl Stats {
    /// The figures gathered since the last call, as metrics, and the counters reset. Only a
    /// half that ran reports.
    pub(crate) fn take(&mut self) -> Vec<Metric> {
        let s = std::mem::take(self);
        let mut out = Vec::new();
        if s.shipped > 0 {
            let ratio = if s.wire_bytes > 0 {
                s.raw_bytes as f64 / s.wire_bytes as f64
            } else {
                0.0
            };
            out.extend([
                Metric::new("raw_bytes", s.raw_bytes as f64),
                Metric::new("wire_bytes", s.wire_bytes as f64),
                Metric::new("ratio", ratio),
                Metric::new("compress_s", s.compress.as_secs_f64()),
                Metric::new("transmit_s", s.transmit.as_secs_f64()),
            ]);
        }
        if s.received > 0 {
            out.extend([
                Metric::new("received_bytes", s.received_bytes as f64),
                Metric::new("receive_s", s.receive.as_secs_f64()),
                Metric::new("decompress_s", s.decompress.as_secs_f64()),
                Metric::new("put_s", s.put.as_secs_f64()),
            ]);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(m: &[Metric]) -> Vec<&str> {
        m.iter().map(|m| m.name.as_str()).collect()
    }

    #[test]
    fn each_half_reports_its_own_figures_once() {
        let mut s = Stats::default();
        assert!(s.take().is_empty(), "nothing ran: nothing to report");
        s.shipped = 1;
        s.raw_bytes = 300;
        s.wire_bytes = 200;
        let m = s.take();
        assert_eq!(
            names(&m),
            [
                "raw_bytes",
                "wire_bytes",
                "ratio",
                "compress_s",
                "transmit_s"
            ]
        );
        assert_eq!(m[2].value, 1.5);
        assert!(s.take().is_empty(), "reset by the call");
        s.received = 2;
        assert_eq!(
            names(&s.take()),
            ["received_bytes", "receive_s", "decompress_s", "put_s"]
        );
    }
}
