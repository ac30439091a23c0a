//! `tandem check`'s printout of a [`RunPlan`]: one line per part, indented detail under it.

use super::{RolePlan, RunPlan};
use std::fmt;

impl fmt::Display for RunPlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "job `{}` is valid", self.name)?;
        writeln!(f, "  run dir    {}", self.output_dir.display())?;
        let preset = self
            .model
            .init_preset
            .as_ref()
            .map(|p| format!(" (created from preset `{p}` if absent)"))
            .unwrap_or_default();
        writeln!(f, "  model      {}{preset}", self.model.path.display())?;
        let p = &self.placement;
        writeln!(
            f,
            "  placement  {} on {} (train {:.2}, infer {:.2} of each device)",
            format!("{:?}", p.mode).to_lowercase(),
            p.devices.join(", "),
            p.train_frac,
            p.infer_frac
        )?;
        role(f, "engine", &self.engine)?;
        role(f, "trainer", &self.trainer)?;
        let b = &self.bridge;
        writeln!(
            f,
            "  bridge     {} from plugin `{}`: trainer exports {}, engines apply {} (verify {})",
            b.component,
            b.plugin,
            b.export.as_str(),
            b.apply.as_str(),
            if b.verify { "on" } else { "off" },
        )?;
        let a = &self.algorithm;
        writeln!(
            f,
            "  algorithm  {}: {} prompts x {} completions, {} new tokens, lr {}",
            a.name, a.prompts_per_step, a.group_size, a.max_tokens, a.learning_rate
        )?;
        if let Some(e) = &self.eval {
            writeln!(
                f,
                "  eval       every {} steps on {} held-out problems ({} new tokens)",
                e.every, e.problems, e.max_tokens
            )?;
        }
        writeln!(f, "  launcher   {}", self.launcher.summary)?;
        writeln!(f, "  transport  {}", self.transport.backend)?;
        for g in &self.transport.groups {
            writeln!(f, "    {g}")?;
        }
        if let Some(d) = &self.drafter.job {
            writeln!(
                f,
                "  drafter    job: features over {:?}, acceptance on {} prompts every {} steps ({} draft tokens)",
                d.route, d.eval_prompts, d.eval_every, d.draft_tokens
            )?;
        }
        if let Some(d) = &self.drafter.rl {
            writeln!(
                f,
                "  drafter    {} from plugin `{}`, trained {} ({} draft tokens)",
                d.trainer.component,
                d.trainer.plugin,
                d.train_in.as_str(),
                d.draft_tokens
            )?;
        }
        Ok(())
    }
}

/// `  engine     native x2 from plugin `native` (built-in) on cpu, cpu`.
fn role(f: &mut fmt::Formatter<'_>, name: &str, r: &RolePlan) -> fmt::Result {
    let devices: Vec<&str> = r.ranks.iter().map(|r| r.device.as_str()).collect();
    writeln!(
        f,
        "  {name:<10} {} x{} from plugin `{}` ({}) on {}",
        r.component,
        r.world_size(),
        r.plugin,
        r.source,
        devices.join(", ")
    )?;
    let c = &r.caps;
    let mut what = vec![format!("updates {}", c.kind_names().join(", "))];
    if c.lora {
        what.push("LoRA adapters".into());
    }
    if c.max_seq_len > 0 {
        what.push(format!("max_seq_len {}", c.max_seq_len));
    }
    if c.draft_tokens > 0 {
        what.push(format!("{} draft tokens", c.draft_tokens));
    }
    if c.reports_digest {
        what.push("digests".into());
    }
    writeln!(f, "             {} ({:?})", what.join(", "), c.source)
}
