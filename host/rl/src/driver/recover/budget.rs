//! The restart budget: `[run] max_restarts` per worker rank, `max_restarts_per_run` for the
//! whole run, and the backoff before each restart (`restart_backoff_secs`, doubled for each
//! later restart of the same rank, at most [`MAX_BACKOFF`]).

use crate::config::RunSection;
use crate::error::RlError;
use std::collections::BTreeMap;
use std::time::Duration;

/// Longest wait before one restart.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Restarts so far, by worker name.
pub(in crate::driver) struct Restarts {
    per_rank: u32,
    per_run: u32,
    backoff_secs: f64,
    counts: BTreeMap<String, u32>,
    total: u32,
}

impl Restarts {
    /// The budget of `[run]`.
    pub fn new(run: &RunSection) -> Restarts {
        Restarts {
            per_rank: run.max_restarts,
            per_run: run.max_restarts_per_run,
            backoff_secs: run.restart_backoff_secs,
            counts: BTreeMap::new(),
            total: 0,
        }
    }

    /// Restarts of every worker so far.
    pub fn total(&self) -> u32 {
        self.total
    }

    /// Counts one restart of `worker` (which died with `error`) and returns the wait before
    /// it; past the budget, the error that stops the run, saying which worker died how
    /// often.
    pub fn charge(&mut self, worker: &str, error: &RlError) -> Result<Duration, RlError> {
        let n = self.counts.entry(worker.to_string()).or_default();
        *n += 1;
        self.total += 1;
        let first = error.to_string();
        let first = first.lines().next().unwrap_or_default();
        if *n > self.per_rank {
            return Err(RlError::failed(format!(
                "{worker} died {} times, more than [run] max_restarts = {}: {first}",
                *n, self.per_rank
            ))
            .with_help(format!(
                "read logs/{worker}.log for why it dies; raise [run] max_restarts to let the run \
                 go on"
            )));
        }
        if self.total > self.per_run {
            let each: Vec<String> = self
                .counts
                .iter()
                .map(|(w, c)| format!("{w} {c}"))
                .collect();
            return Err(RlError::failed(format!(
                "workers died {} times in this run, more than [run] max_restarts_per_run = {} \
                 ({}): {first}",
                self.total,
                self.per_run,
                each.join(", ")
            ))
            .with_help("read the workers' logs under logs/; raise [run] max_restarts_per_run"));
        }
        let secs = self.backoff_secs * 2f64.powi(*n as i32 - 1);
        Ok(Duration::from_secs_f64(secs.min(MAX_BACKOFF.as_secs_f64())))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn run(per_rank: u32, per_run: u32, backoff: f64) -> RunSection {
        RunSection {
            max_restarts: per_rank,
            max_restarts_per_run: per_run,
            restart_backoff_secs: backoff,
            ..RunSection::default()
        }
    }

    #[test]
    fn backoff_doubles_per_rank_and_the_budget_names_the_worker() {
        let mut b = Restarts::new(&run(2, 10, 0.5));
        let e = RlError::failed("engine rank 0: `generate` failed: killed");
        assert_eq!(
            b.charge("engine-0", &e).unwrap(),
            Duration::from_millis(500)
        );
        assert_eq!(b.charge("trainer", &e).unwrap(), Duration::from_millis(500));
        assert_eq!(b.charge("engine-0", &e).unwrap(), Duration::from_secs(1));
        let stop = b.charge("engine-0", &e).unwrap_err().to_string();
        assert!(
            stop.contains("engine-0 died 3 times") && stop.contains("max_restarts = 2"),
            "{stop}"
        );
        assert_eq!(b.total(), 4);
    }

    #[test]
    fn the_run_budget_counts_every_worker() {
        let mut b = Restarts::new(&run(5, 2, 0.0));
        let e = RlError::failed("x");
        b.charge("engine-0", &e).unwrap();
        b.charge("engine-1", &e).unwrap();
        let stop = b.charge("trainer", &e).unwrap_err().to_string();
        assert!(stop.contains("max_restarts_per_run = 2"), "{stop}");
        assert!(stop.contains("engine-0 1, engine-1 1, trainer 1"), "{stop}");
    }

    #[test]
    fn the_wait_is_capped() {
        let mut b = Restarts::new(&run(20, 20, 10.0));
        let e = RlError::failed("x");
        let waits: Vec<Duration> = (0..8).map(|_| b.charge("trainer", &e).unwrap()).collect();
        assert_eq!(*waits.last().unwrap(), MAX_BACKOFF);
    }
}
