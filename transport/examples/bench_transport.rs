//! Runs the transport benchmark and prints each figure beside its limit (what
//! `tandem bench transport` prints). `cargo run --release -p tandem-transport --example
//! bench_transport [max_bytes]`.

fn main() {
    tandem_transport::bench::child_main_if_requested();
    let mut opts = tandem_transport::bench::BenchOptions::default();
    if let Some(max) = std::env::args().nth(1).and_then(|s| s.parse().ok()) {
        opts.max_bytes = max;
    }
    match tandem_transport::bench::bench(&opts) {
        Ok(ms) => {
            for m in ms {
                println!(
                    "{:<36} {:>10.3} {:<5} limit {:>10.3} {:<5} ratio {:.2}",
                    m.case,
                    m.value,
                    m.unit,
                    m.limit,
                    m.unit,
                    m.value / m.limit
                );
            }
        }
        Err(e) => {
            eprintln!("bench failed: {e}");
            std::process::exit(1);
        }
    }
}
