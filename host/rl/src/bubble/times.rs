//! The tail and the bubble of a rollout, from the instants each engine rank finished.

use std::time::Instant;

/// When each rank finished its share of the rollout.
#[derive(Debug, Clone)]
pub struct BubbleTimes {
    finished: Vec<Option<Instant>>,
}

impl BubbleTimes {
    /// `ranks` ranks, none finished.
    pub fn new(ranks: usize) -> BubbleTimes {
        BubbleTimes {
            finished: vec![None; ranks],
        }
    }

    /// Rank `rank` finished at `at` (a later report of the same rank replaces it).
    pub fn finished(&mut self, rank: usize, at: Instant) {
        if let Some(slot) = self.finished.get_mut(rank) {
            *slot = Some(at);
        }
    }

    fn span(&self) -> Option<(Instant, Instant, Vec<Instant>)> {
        let all: Vec<Instant> = self.finished.iter().copied().collect::<Option<_>>()?;
        let first = *all.iter().min()?;
        let last = *all.iter().max()?;
        Some((first, last, all))
    }

    /// Seconds from the first rank's finish to the last one's: the long tail, where the
    /// last engines decode at a small batch. 0 until every rank finished.
    pub fn tail_s(&self) -> f64 {
        self.span()
            .map_or(0.0, |(first, last, _)| (last - first).as_secs_f64())
    }

    /// Engine-seconds idle while others still generated: the sum over ranks of the last
    /// finish less its own, what bubble-time drafter training can use. 0 until every rank
    /// finished.
    pub fn bubble_s(&self) -> f64 {
        self.span().map_or(0.0, |(_, last, all)| {
            all.iter().map(|t| (last - *t).as_secs_f64()).sum()
        })
    }
}
