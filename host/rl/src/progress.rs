//! What a person sees while a run goes: a progress bar with step, reward, KL and step time on
//! a terminal, one line per step otherwise (logs, CI).

use super::metrics::StepMetrics;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use std::io::IsTerminal;

/// The run's progress display.
pub struct Progress {
    bar: Option<ProgressBar>,
    total: u32,
    enabled: bool,
}

impl Progress {
    /// A display for steps `first..=total`; `enabled = false` shows nothing.
    pub fn new(first: u32, total: u32, enabled: bool) -> Progress {
        let bar = (enabled && std::io::stderr().is_terminal()).then(|| {
            let bar =
                ProgressBar::with_draw_target(Some(u64::from(total)), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "{spinner} step {pos}/{len} [{bar:30}] {msg} (eta {eta})",
            )
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
            bar.set_style(style);
            bar.set_position(u64::from(first.saturating_sub(1)));
            bar.set_message("generating...");
            bar
        });
        Progress {
            bar,
            total,
            enabled,
        }
    }

    /// Shows a step's figures.
    pub fn step(&self, m: &StepMetrics) {
        let mut msg = format!(
            "reward {:.3} (exact {:.0}%)  loss {:+.4}  kl {:.4}  {:.2} s/step",
            m.reward_mean,
            m.exact_frac * 100.0,
            m.loss,
            m.kl,
            m.step_s
        );
        if let (Some(a), Some(n)) = (m.eval_accuracy, m.eval_problems) {
            msg.push_str(&format!("  eval {:.1}% of {n}", a * 100.0));
        }
        match &self.bar {
            Some(bar) => {
                bar.set_position(u64::from(m.step));
                bar.set_message(msg);
            }
            None if self.enabled => eprintln!("step {:>4}/{}  {msg}", m.step, self.total),
            None => {}
        }
    }

    /// Shows a drafter job's step.
    pub fn drafter_step(&self, m: &crate::algorithm::drafter::DrafterStepMetrics) {
        let acc: Vec<String> = m.acc.iter().map(|a| format!("{:.0}", a * 100.0)).collect();
        let mut msg = format!(
            "loss {:.3}  acc% [{}]  {:.2} s/step",
            m.loss,
            acc.join(" "),
            m.step_s
        );
        if let Some(a) = m.acceptance_length {
            msg.push_str(&format!("  acceptance {a:.2}"));
        }
        match &self.bar {
            Some(bar) => {
                bar.set_position(u64::from(m.step));
                bar.set_message(msg);
            }
            None if self.enabled => eprintln!("step {:>4}/{}  {msg}", m.step, self.total),
            None => {}
        }
    }

    /// A line above the bar (or on its own).
    pub fn println(&self, line: &str) {
        match &self.bar {
            Some(bar) => bar.println(line),
            None if self.enabled => eprintln!("{line}"),
            None => {}
        }
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish();
        }
    }
}
