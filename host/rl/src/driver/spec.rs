//! What speculative decoding did in a step's rollout: the engines' `spec.*` counters read
//! before and after it, summed over ranks. An engine without a drafter reports none; an
//! engine restarted in between starts from zero again, so its figure is what it did since.

use tandem_plugin_api::ComponentStats;
use tandem_runtime::launch::RemoteEngine;

/// Counters of one engine's speculative rounds (cumulative, as the engine reports them).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct SpecCounters {
    /// Verify rounds, per row.
    rounds: f64,
    /// Tokens those rounds emitted.
    emitted: f64,
}

impl SpecCounters {
    /// The counters of `stats`, when the engine speculates (`spec.on` = 1, or `spec.drafter`
    /// = 1 from an engine that does not report `spec.on`).
    fn of(stats: &ComponentStats) -> Option<SpecCounters> {
        let get = |key: &str| {
            stats
                .metrics
                .iter()
                .find(|m| m.name.as_str() == key)
                .map(|m| m.value)
        };
        (get("spec.on").or_else(|| get("spec.drafter"))? >= 1.0).then_some(())?;
        Some(SpecCounters {
            rounds: get("spec.rounds")?,
            emitted: get("spec.emitted")?,
        })
    }

    /// What happened between `before` and `self` (all of `self` when the engine restarted).
    fn since(self, before: Option<SpecCounters>) -> SpecCounters {
        match before {
            Some(b) if b.rounds <= self.rounds && b.emitted <= self.emitted => SpecCounters {
                rounds: self.rounds - b.rounds,
                emitted: self.emitted - b.emitted,
            },
            _ => self,
        }
    }
}

/// Every engine's counters now, by rank (`None`: no drafter, or no answer).
pub(super) fn read(engines: &[RemoteEngine]) -> Vec<Option<SpecCounters>> {
    engines
        .iter()
        .map(|e| e.stats().ok().as_ref().and_then(SpecCounters::of))
        .collect()
}

/// A rollout's speculative figures, summed over engines and attempts.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct SpecFigures {
    rounds: f64,
    emitted: f64,
    /// Whether any engine speculated.
    seen: bool,
}

impl SpecFigures {
    /// Adds what each engine did between `before` and `after` (same ranks).
    pub(super) fn add(&mut self, before: &[Option<SpecCounters>], after: &[Option<SpecCounters>]) {
        for (rank, now) in after.iter().enumerate() {
            if let Some(now) = now {
                let d = now.since(before.get(rank).copied().flatten());
                self.rounds += d.rounds;
                self.emitted += d.emitted;
                self.seen = true;
            }
        }
    }

    /// Tokens decoded by speculative rounds, and the mean tokens per round (acceptance
    /// length); `None` when no engine speculated.
    pub(super) fn figures(&self) -> Option<(u64, Option<f64>)> {
        self.seen.then(|| {
            let len = (self.rounds > 0.0).then(|| self.emitted / self.rounds);
            (self.emitted as u64, len)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(rounds: f64, emitted: f64) -> Option<SpecCounters> {
        Some(SpecCounters { rounds, emitted })
    }

    #[test]
    fn deltas_sum_over_engines_and_survive_a_restart() {
        let mut f = SpecFigures::default();
        assert_eq!(f.figures(), None);
        // Rank 0 did 10 rounds of 3 tokens; rank 1 restarted (counters back to 4 rounds).
        f.add(
            &[c(5.0, 10.0), c(50.0, 100.0)],
            &[c(15.0, 40.0), c(4.0, 8.0)],
        );
        assert_eq!(f.figures(), Some((38, Some(38.0 / 14.0))));
        // An engine without a drafter adds nothing.
        let mut g = SpecFigures::default();
        g.add(&[None], &[None]);
        assert_eq!(g.figures(), None);
        g.add(&[c(1.0, 1.0)], &[c(1.0, 1.0)]);
        assert_eq!(g.figures(), Some((0, None)));
    }
}
