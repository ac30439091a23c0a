//! `tandem bench abi`: the cost of an engine-trait call across the ABI (abi_stable trait object,
//! through the panic guard) beside a direct `dyn` call of the same implementation.

use super::Figure;
use std::hint::black_box;
use std::time::Instant;
use tandem_plugin_api::sdk::{self, EngineImpl};
use tandem_plugin_api::{ComponentStats, EngineHealth, RString};

/// A minimal engine used only to time calls; it is never registered as a plugin.
struct CallProbe;

impl EngineImpl for CallProbe {
    fn component(&self) -> &str {
        "call-probe"
    }

    fn health(&self) -> sdk::Result<EngineHealth> {
        Ok(EngineHealth {
            ready: true,
            weight_version: 7,
            detail: RString::new(),
        })
    }

    fn stats(&self) -> sdk::Result<ComponentStats> {
        Ok(ComponentStats::default())
    }
}

fn time_per_call(calls: u64, mut f: impl FnMut()) -> f64 {
    // Best of 5 rounds: the minimum is the least disturbed by the other core's load.
    (0..5)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..calls {
                f();
            }
            start.elapsed().as_secs_f64() * 1e9 / calls as f64
        })
        .fold(f64::INFINITY, f64::min)
}

/// Runs the benchmark; `calls` per round (10 M by default, fewer with `--quick`).
pub fn run(calls: u64) -> Vec<Figure> {
    let abi = sdk::engine_box(CallProbe);
    let direct: Box<dyn EngineImpl> = Box::new(CallProbe);
    let abi_health = time_per_call(calls, || {
        black_box(black_box(&abi).health());
    });
    let direct_health = time_per_call(calls, || {
        black_box(black_box(&direct).health().ok());
    });
    let abi_stats = time_per_call(calls, || {
        black_box(black_box(&abi).stats());
    });
    let direct_stats = time_per_call(calls, || {
        black_box(black_box(&direct).stats().ok());
    });
    vec![
        Figure::new(
            "abi",
            "engine.health() across the ABI",
            abi_health,
            "ns/call",
            direct_health,
        )
        .limit_name("direct dyn call")
        .target("<= 1.5"),
        Figure::new(
            "abi",
            "engine.stats() across the ABI",
            abi_stats,
            "ns/call",
            direct_stats,
        )
        .limit_name("direct dyn call")
        .target("<= 1.5"),
    ]
}
