//! Prints decode and train-step figures for the tiny and small presets (run with
//! `--release`): `cargo run --release -p tandem-plugin-native --example bench_native [tiny|small] [decode|train]`.

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
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |what: &str| args.iter().any(|a| a == what);
    // A filter group with no member given means "all of that group".
    let any_preset = has("tiny") || has("small") || has("candle-ref");
    let any_mode = has("decode") || has("train");
    let only = |what: &str| match what {
        "tiny" | "small" => !any_preset || has(what),
        "decode" | "train" => !any_mode || has(what),
        _ => has(what),
    };
    for preset in [Preset::Tiny, Preset::Small] {
        if !only(&format!("{preset:?}").to_lowercase()) {
            continue;
        }
        let cfg = preset.config();
        if only("decode") {
            for f in bench::decode(&cfg, &[1, 8, 64], 64, &lim)? {
                println!(
                    "{preset:?} decode batch {:>2}: {:>8.1} tok/s (bandwidth bound {:.0}, compute bound {:.0})",
                    f.batch,
                    f.tokens_per_s,
                    f.bandwidth_bound_tokens_per_s,
                    f.compute_bound_tokens_per_s
                );
            }
        }
        if !only("train") {
            continue;
        }
        let t = bench::train_step(&cfg, 8, 64, 5, &lim)?;
        println!(
            "{preset:?} train step b{} t{}: {:.3} s median (compute bound {:.3} s)",
            t.batch, t.seq, t.median_s, t.compute_bound_s
        );
    }
    if only("candle-ref") {
        // The configuration measured with candle 0.11.1 in shared/reference/rust-deps.md §3:
        // vocab 2048, d 256, 4 layers, 4 heads / 2 KV, MLP 688 (3.95 M params, untied).
        let mut cfg = Preset::Tiny.config();
        cfg.vocab_size = 2048;
        cfg.tie_word_embeddings = false;
        for f in bench::decode(&cfg, &[1, 8, 64], 112, &lim)? {
            println!(
                "candle-ref decode batch {:>2}: {:>8.1} tok/s (bandwidth bound {:.0}, compute bound {:.0})",
                f.batch,
                f.tokens_per_s,
                f.bandwidth_bound_tokens_per_s,
                f.compute_bound_tokens_per_s
            );
        }
        let t = bench::train_step(&cfg, 8, 64, 7, &lim)?;
        println!(
            "candle-ref train step b{} t{}: {:.3} s median (compute bound {:.3} s)",
            t.batch, t.seq, t.median_s, t.compute_bound_s
        );
    }
    Ok(())
}
