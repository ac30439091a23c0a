//! `tandem-bench-native`: decode tokens/s (batch 1, 8, 64) and the full fine-tuning train-step
//! time (batch 8 × 64 tokens, SFT, clip 1.0, AdamW) of `tandem-native-core` on the `tiny` and
//! `small` init presets, each printed beside its limit as `tandem bench` prints figures.
//!
//! ```text
//! cargo run --release -p tandem-bench-native [--features candle] -- [--json] [--quick]
//!     [tiny|small|big]... [decode|train]...
//! ```
//!
//! With feature `candle`, candle 0.11 runs the same safetensors in the same run and is the
//! limit of each figure (targets: decode ≥ 1.0× candle, train step ≤ 1.0× candle's time);
//! without it the limits are the machine bounds (memcpy bandwidth or GEMM rate for decode, GEMM
//! rate for training). Presets default to `tiny small`, modes to both. Progress goes to stderr.

#![forbid(unsafe_code)]
#![cfg_attr(test, allow(clippy::unwrap_used))]

#[cfg(feature = "candle")]
mod candle;
mod error;
mod measure;
mod run;

use tandem_native_core::init::Preset;

use error::BenchError;
use run::Selection;

const USAGE: &str = "usage: tandem-bench-native [--json] [--quick] [tiny|small|big]... \
                     [--model DIR]... [decode|train]...";

/// The selection and output form from the command line.
fn parse(args: &[String]) -> Result<(Selection, bool), BenchError> {
    let (mut json, mut quick, mut decode, mut train) = (false, false, false, false);
    let mut presets = Vec::new();
    let mut models = Vec::new();
    let mut args = args.iter();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--model" => match args.next() {
                Some(dir) => models.push(std::path::PathBuf::from(dir)),
                None => return Err(BenchError::Usage("--model needs a directory".into())),
            },
            "--json" => json = true,
            "--quick" => quick = true,
            "decode" => decode = true,
            "train" => train = true,
            other => match Preset::parse(other) {
                Ok(p) if !presets.contains(&p) => presets.push(p),
                Ok(_) => {}
                Err(_) => return Err(BenchError::Usage(format!("unknown argument `{other}`"))),
            },
        }
    }
    if presets.is_empty() && models.is_empty() {
        presets = vec![Preset::Tiny, Preset::Small];
    }
    let both = !decode && !train;
    let sel = Selection {
        presets,
        models,
        decode: decode || both,
        train: train || both,
        quick,
    };
    Ok((sel, json))
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "-h" || a == "--help") {
        println!("{USAGE}");
        return std::process::ExitCode::SUCCESS;
    }
    let result = parse(&args).and_then(|(sel, json)| {
        let figures = run::run(&sel)?;
        if json {
            tandem_bench_report::print_json_lines(&figures)?;
        } else {
            println!("{}", tandem_bench_report::table(&figures));
        }
        Ok(())
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e @ BenchError::Usage(_)) => {
            eprintln!("tandem-bench-native: {e}\n{USAGE}");
            std::process::ExitCode::from(2)
        }
        Err(e) => {
            eprintln!("tandem-bench-native: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn defaults_are_tiny_and_small_both_modes() {
        let (sel, json) = parse(&[]).unwrap();
        assert_eq!(sel.presets, [Preset::Tiny, Preset::Small]);
        assert!(sel.decode && sel.train && !sel.quick && !json);
    }

    #[test]
    fn filters_and_flags() {
        let (sel, json) = parse(&args(&["big", "train", "--json", "--quick", "big"])).unwrap();
        assert_eq!(sel.presets, [Preset::Big]);
        assert!(!sel.decode && sel.train && sel.quick && json);
        assert!(matches!(parse(&args(&["huge"])), Err(BenchError::Usage(_))));
    }
}
