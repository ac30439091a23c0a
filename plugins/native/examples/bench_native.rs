//! Prints decode and train-step figures for the tiny and small presets (run with
//! `--release`): `cargo run --release -p tandem-plugin-native --example bench_native`.

use tandem_plugin_native::bench;
use tandem_plugin_native::init::Preset;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let lim = bench::limits();
    println!(
        "limits: memcpy {:.1} GB/s, gemm {:.1} GFLOP/s, rayon threads {}",
        lim.memcpy_bytes_per_s / 1e9,
        lim.gemm_flops / 1e9,
        rayon::current_num_threads()
    );
    for preset in [Preset::Tiny, Preset::Small] {
        let cfg = preset.config();
        for f in bench::decode(&cfg, &[1, 8, 64], 64, &lim)? {
            println!(
                "{preset:?} decode batch {:>2}: {:>8.1} tok/s (bandwidth bound {:.0})",
                f.batch, f.tokens_per_s, f.bandwidth_bound_tokens_per_s
            );
        }
        let t = bench::train_step(&cfg, 8, 64, 5, &lim)?;
        println!(
            "{preset:?} train step b{} t{}: {:.3} s median (compute bound {:.3} s)",
            t.batch, t.seq, t.median_s, t.compute_bound_s
        );
    }
    Ok(())
}
