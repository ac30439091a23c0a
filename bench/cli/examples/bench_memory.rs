//! Prints the memory benchmark: `cargo run --release -p tandem-bench --example bench_memory
//! [MAX_BYTES [MOVE_THREADS [MIN_BYTES]]]` (`tandem bench memory` prints the same as figures).

fn main() -> Result<(), tandem_memory::MemoryError> {
    let mut opts = tandem_bench::memory::BenchOptions::default();
    if let Some(max) = std::env::args().nth(1).and_then(|s| s.parse().ok()) {
        opts.max_size = max;
    }
    if let Some(t) = std::env::args().nth(2).and_then(|s| s.parse().ok()) {
        opts.move_threads = t;
    }
    if let Some(min) = std::env::args().nth(3).and_then(|s| s.parse().ok()) {
        opts.min_size = min;
    }
    for m in tandem_bench::memory::bench(&opts)? {
        let ratio = if m.unit == "GB/s" {
            format!("{:.2}x", m.value / m.limit)
        } else {
            String::new()
        };
        println!(
            "{:<28} {:>14.2} {:<5} limit {:>14.2} {ratio} ({})",
            m.case, m.value, m.unit, m.limit, m.limit_name
        );
    }
    Ok(())
}
