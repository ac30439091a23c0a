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

/// Nanoseconds per call of `a` and of `b`, best of 7 interleaved rounds: interleaving exposes
/// both to the same background load, and the minimum is the least disturbed round.
fn time_pair(calls: u64, mut a: impl FnMut(), mut b: impl FnMut()) -> (f64, f64) {
    let once = |f: &mut dyn FnMut()| {
        let start = Instant::now();
        for _ in 0..calls {
            f();
        }
        start.elapsed().as_secs_f64() * 1e9 / calls as f64
    };
    let (mut best_a, mut best_b) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..7 {
        best_a = best_a.min(once(&mut a));
        best_b = best_b.min(once(&mut b));
    }
    (best_a, best_b)
}

/// Runs the benchmark; `calls` per round (10 M by default, fewer with `--quick`).
pub fn run(calls: u64) -> Vec<Figure> {
    let abi = sdk::engine_box(CallProbe);
    let direct: Box<dyn EngineImpl> = Box::new(CallProbe);
    let (abi_health, direct_health) = time_pair(
        calls,
        || {
            black_box(black_box(&abi).health());
        },
        || {
            let _ = black_box(black_box(&direct).health());
        },
    );
    let (abi_stats, direct_stats) = time_pair(
        calls,
        || {
            black_box(black_box(&abi).stats());
        },
        || {
            let _ = black_box(black_box(&direct).stats());
        },
    );
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
