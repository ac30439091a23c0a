//! Runs the transport benchmark and prints each figure beside its limit (what
//! `tandem bench transport` prints). `cargo run --release -p tandem-bench --example
//! bench_transport [max_bytes [min_bytes [shm_ring_bytes [shm_chunk_bytes [shm|tcp
//! [nobcast|bcastonly [spin_us [single_copy_min_bytes [broadcast_bytes]]]]]]]]]` (`single_copy_min_bytes` 0 =
//! single copy off; otherwise on from that size; absent = auto; `broadcast_bytes` = ring bytes
//! of the shared broadcast segment, 0 = broadcast by the chain over the links; absent =
//! default). Arguments that do not parse as numbers (e.g. `-`) keep their default.

fn main() {
    tandem_bench::transport::child_main_if_requested();
    let mut opts = tandem_bench::transport::BenchOptions::default();
    let args: Vec<String> = std::env::args().collect();
    let arg = |i: usize| args.get(i).and_then(|s| s.parse::<usize>().ok());
    if let Some(max) = arg(1) {
        opts.max_bytes = max;
    }
    if let Some(min) = arg(2) {
        opts.min_bytes = min;
    }
    if let Some(ring) = arg(3).filter(|&r| r > 0) {
        opts.shm.ring_bytes = ring;
    }
    if let Some(chunk) = arg(4) {
        opts.shm.chunk_bytes = chunk;
    }
    match args.get(5).map(String::as_str) {
        Some("shm") => opts.backends = vec![tandem_transport::BackendKind::Shm],
        Some("tcp") => opts.backends = vec![tandem_transport::BackendKind::Tcp],
        _ => {}
    }
    match args.get(6).map(String::as_str) {
        Some("nobcast") => opts.broadcast_ranks = 0,
        Some("bcastonly") => opts.p2p = false,
        _ => {}
    }
    if let Some(us) = arg(7) {
        opts.shm.spin = std::time::Duration::from_micros(us as u64);
    }
    match arg(8) {
        Some(0) => opts.shm.single_copy = tandem_transport::SingleCopy::Off,
        Some(min) => {
            opts.shm.single_copy = tandem_transport::SingleCopy::On;
            opts.shm.single_copy_min_bytes = min;
        }
        None => {}
    }
    if let Some(b) = arg(9) {
        opts.shm.broadcast_bytes = b;
    }
    match tandem_bench::transport::bench(&opts) {
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
