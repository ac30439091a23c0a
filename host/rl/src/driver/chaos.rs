//! Fault injection for recovery tests and `tandem bench loop`: `TANDEM_CHAOS` names a seeded
//! schedule of SIGKILLs the controller deals its own workers.
//!
//! The CLI reads the schedule from `TANDEM_CHAOS` (`RunOptions::chaos`);
//! `TANDEM_CHAOS="seed=S,every=N"` kills one worker on every N-th step (never the last step,
//! whose workers must still be alive to shut down): the victim (an engine rank or the
//! trainer), the phase it dies in and whether it dies at the phase's start or a few
//! milliseconds into it are drawn from `(S, step)`, so the same seed kills the same worker at
//! the same point of the same step in every run. `victim=trainer` or `victim=engine` narrows
//! the draw; `at=<phase>` fixes the phase (`rollout`, `offload`, `train`, `save`, `sync`).
//! `drafter=N` kills the drafter trainer (`[drafter] enabled`) in step N's bubble, right
//! after its first drafter step (with or without `every`).
//!
//! The kill is a real SIGKILL of the worker's process: the controller learns of it the way it
//! learns of any death (the call in flight fails, the monitor reports the exit). A kill "into"
//! a phase is sent from a thread that is joined before the step's attempt returns
//! ([`Chaos::settle`]), so it always lands within the step it was drawn for.

use std::thread::JoinHandle;
use std::time::Duration;

/// The environment variable holding the schedule.
pub const CHAOS_ENV: &str = "TANDEM_CHAOS";

/// Where in a step a scheduled kill lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Point {
    /// The rollout (engines generate).
    Rollout,
    /// The drained offload.
    Offload,
    /// The train phase (the trainer steps).
    Train,
    /// The checkpoint save (on a step that saves; otherwise the kill comes before the sync).
    Save,
    /// The staged onload and the bridge's sync.
    Sync,
}

const POINTS: [(Point, &str); 5] = [
    (Point::Rollout, "rollout"),
    (Point::Offload, "offload"),
    (Point::Train, "train"),
    (Point::Save, "save"),
    (Point::Sync, "sync"),
];

/// A worker the schedule may kill: its name in events and its process id.
#[derive(Debug, Clone)]
pub struct Target {
    /// `engine-<rank>` or `trainer`.
    pub name: String,
    /// Its process.
    pub pid: u32,
}

/// Which workers a schedule picks from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victims {
    Any,
    Engines,
    Trainer,
}

/// A parsed schedule.
#[derive(Debug, Clone)]
struct Schedule {
    seed: u64,
    every: u32,
    victims: Victims,
    at: Option<Point>,
    /// The step whose bubble loses the drafter trainer.
    drafter: Option<u32>,
}

/// The run's fault injector (inactive without `TANDEM_CHAOS`).
#[derive(Default)]
pub struct Chaos {
    schedule: Option<Schedule>,
    last_step: u32,
    /// Steps whose kill was dealt.
    dealt: Vec<u32>,
    killer: Option<JoinHandle<()>>,
}

/// One scheduled kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Kill {
    victim: u64,
    point: Point,
    /// Milliseconds into the phase (0: at its start).
    delay_ms: u64,
}

impl Chaos {
    /// The schedule `spec` (the syntax of `TANDEM_CHAOS`; `None`: no kills) for a run whose
    /// last step is `last_step`; an invalid one is an error naming the variable.
    pub fn new(spec: Option<&str>, last_step: u32) -> Result<Chaos, String> {
        let Some(text) = spec else {
            return Ok(Chaos::default());
        };
        let schedule = parse(text).map_err(|e| format!("{CHAOS_ENV}={text:?}: {e}"))?;
        tracing::warn!("{CHAOS_ENV} is set: workers are killed on purpose ({text})");
        Ok(Chaos {
            schedule: Some(schedule),
            last_step,
            ..Chaos::default()
        })
    }

    /// Deals step `step`'s kill if it is due at `point`: one of `targets` (engines by rank,
    /// then the trainer) is SIGKILLed now or from a thread a few milliseconds from now.
    pub fn at(&mut self, step: u32, point: Point, targets: &[Target]) {
        let Some(s) = &self.schedule else { return };
        if step == 0
            || s.every == 0
            || step >= self.last_step
            || !step.is_multiple_of(s.every)
            || self.dealt.contains(&step)
        {
            return;
        }
        let kill = draw(s, step, targets.len());
        if kill.point != point {
            return;
        }
        let Some(target) = targets.get(kill.victim as usize).cloned() else {
            return;
        };
        self.dealt.push(step);
        tracing::warn!(
            "chaos: killing {} (pid {}) {} ms into step {step}'s {:?}",
            target.name,
            target.pid,
            kill.delay_ms,
            point
        );
        if kill.delay_ms == 0 {
            sigkill(target.pid);
        } else {
            let delay = Duration::from_millis(kill.delay_ms);
            self.killer = std::thread::Builder::new()
                .name("chaos".into())
                .spawn(move || {
                    std::thread::sleep(delay);
                    sigkill(target.pid);
                })
                .ok();
        }
    }

    /// Whether the drafter trainer dies in step `step`'s bubble (`drafter=N`).
    pub fn kills_drafter_at(&self, step: u32) -> bool {
        self.schedule
            .as_ref()
            .is_some_and(|s| s.drafter == Some(step))
    }

    /// Waits for a kill sent from a thread (so it lands in the step it was drawn for).
    pub fn settle(&mut self) {
        if let Some(k) = self.killer.take() {
            let _ = k.join();
        }
    }
}

/// SIGKILLs `pid` (a failure is logged).
pub(super) fn sigkill(pid: u32) {
    use nix::sys::signal::{Signal, kill};
    use nix::unistd::Pid;
    if let Err(e) = kill(Pid::from_raw(pid as i32), Signal::SIGKILL) {
        tracing::warn!("chaos: killing pid {pid}: {e}");
    }
}

/// The kill of `step`: a pure function of the schedule's seed and the step.
fn draw(s: &Schedule, step: u32, targets: usize) -> Kill {
    let mut x = s.seed ^ u64::from(step).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    let mut next = || {
        // splitmix64: a few well-mixed words from (seed, step); no stream state to keep.
        x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let engines = targets.saturating_sub(1) as u64;
    let victim = match s.victims {
        Victims::Trainer => engines,
        Victims::Engines => next() % engines.max(1),
        Victims::Any => next() % (engines + 1),
    };
    let point =
        s.at.unwrap_or(POINTS[(next() % POINTS.len() as u64) as usize].0);
    let delay_ms = match next() % 3 {
        0 => 0,
        _ => 1 + next() % 40,
    };
    Kill {
        victim,
        point,
        delay_ms,
    }
}

fn parse(text: &str) -> Result<Schedule, String> {
    let mut s = Schedule {
        seed: 0,
        every: 0,
        victims: Victims::Any,
        at: None,
        drafter: None,
    };
    for part in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (k, v) = part
            .split_once('=')
            .ok_or_else(|| format!("`{part}` is not key=value"))?;
        let num = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| format!("{k}: `{v}` is not a number"))
        };
        match k {
            "seed" => s.seed = num(v)?,
            "every" => s.every = num(v)?.try_into().map_err(|_| "every: too large")?,
            "victim" => {
                s.victims = match v {
                    "any" => Victims::Any,
                    "engine" => Victims::Engines,
                    "trainer" => Victims::Trainer,
                    _ => return Err(format!("victim: `{v}` is not any, engine or trainer")),
                }
            }
            "at" => {
                let p = POINTS.iter().find(|(_, n)| *n == v).ok_or_else(|| {
                    format!("at: `{v}` is not rollout, offload, train, save or sync")
                })?;
                s.at = Some(p.0);
            }
            "drafter" => s.drafter = Some(num(v)?.try_into().map_err(|_| "drafter: too large")?),
            _ => {
                return Err(format!(
                    "unknown key `{k}` (seed, every, victim, at, drafter)"
                ));
            }
        }
    }
    if s.every == 0 && s.drafter.is_none() {
        return Err("every=N (N >= 1) or drafter=N is required".into());
    }
    Ok(s)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_draws_the_same_kills_and_seeds_differ() {
        let s = parse("seed=7,every=2").unwrap();
        let a: Vec<Kill> = (1..40).map(|step| draw(&s, step, 3)).collect();
        let b: Vec<Kill> = (1..40).map(|step| draw(&s, step, 3)).collect();
        assert_eq!(a, b);
        let other = parse("seed=8,every=2").unwrap();
        let c: Vec<Kill> = (1..40).map(|step| draw(&other, step, 3)).collect();
        assert_ne!(a, c);
        // Every victim and every phase comes up over a few dozen steps.
        for v in 0..3 {
            assert!(a.iter().any(|k| k.victim == v), "victim {v} never drawn");
        }
        for (p, _) in POINTS {
            assert!(a.iter().any(|k| k.point == p), "{p:?} never drawn");
        }
    }

    #[test]
    fn narrowed_schedules_keep_to_their_victims_and_phase() {
        let t = parse("seed=1,every=1,victim=trainer,at=train").unwrap();
        assert!((1..50).all(|s| draw(&t, s, 3)
            == Kill {
                victim: 2,
                ..draw(&t, s, 3)
            }));
        assert!((1..50).all(|s| draw(&t, s, 3).point == Point::Train));
        let e = parse("seed=1,every=1,victim=engine").unwrap();
        assert!((1..50).all(|s| draw(&e, s, 3).victim < 2));
    }

    #[test]
    fn bad_schedules_are_refused_with_the_reason() {
        for (text, why) in [
            ("seed=1", "every=N"),
            ("seed=x,every=2", "not a number"),
            ("every=2,victim=all", "victim"),
            ("every=2,at=eval", "at:"),
            ("every=2,when=3", "unknown key"),
            ("every", "key=value"),
            ("drafter=x", "not a number"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn a_drafter_kill_stands_alone_and_names_its_step() {
        let c = Chaos {
            schedule: Some(parse("drafter=3").unwrap()),
            last_step: 10,
            ..Chaos::default()
        };
        assert!(c.kills_drafter_at(3));
        assert!(!c.kills_drafter_at(2) && !c.kills_drafter_at(4));
        assert!(!Chaos::default().kills_drafter_at(3));
    }
}
