//! `tandem check`'s printout of a [`RunPlan`]: one line per part, indented detail under it.

use super::{RolePlan, RunPlan};
use crate::config::{FeatureRouteKind, TrainIn};
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
        let c = &p.cpus;
        for (name, cpus) in [("engine", &c.engine), ("trainer", &c.trainer)] {
            if !cpus.is_empty() {
                writeln!(f, "             {name} workers pinned to CPUs {cpus:?}")?;
            }
        }
        role(f, "engine", &self.engine)?;
        role(f, "trainer", &self.trainer)?;
        if let Some(c) = &self.critic {
            role(f, "critic", c)?;
        }
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
        if a.is_ppo() {
            writeln!(
                f,
                "             GAE gamma {} lambda {}, critic lr {}, value clip {}{}",
                a.gamma,
                a.lambda,
                a.critic_lr(),
                a.value_clip,
                if a.whiten_advantages {
                    ", advantages whitened"
                } else {
                    ""
                }
            )?;
        }
        if a.max_staleness > 0 || a.correction() != crate::config::Correction::None {
            let cap = match a.correction() {
                crate::config::Correction::Tis => format!(" (cap {})", a.is_cap),
                _ => String::new(),
            };
            let bound = match a.max_staleness {
                0 => String::new(),
                1 => "asynchronous: samples at most 1 version behind, ".to_string(),
                k => format!("asynchronous: samples at most {k} versions behind, "),
            };
            writeln!(
                f,
                "             {bound}correction {}{cap}",
                a.correction().name()
            )?;
        }
        let env = &self.environment.section;
        if !env.tools.is_empty() {
            let budget = env.max_trajectory_tokens.map_or_else(
                || format!("{} x {}", env.max_turns, a.max_tokens),
                |b| b.to_string(),
            );
            writeln!(
                f,
                "  tools      {} ({} format): up to {} assistant turns, {budget} tokens after the prompt",
                env.tools.join(", "),
                env.tool_format.as_deref().unwrap_or("the template's"),
                env.max_turns
            )?;
            if env.tools.iter().any(|t| t == "python") {
                let l = tandem_model::tools::SandboxLimits::default();
                writeln!(
                    f,
                    "             python sandbox: {}; CPU {} s, memory {} MiB, wall {} s",
                    tandem_model::tools::isolation().describe(),
                    l.cpu_s,
                    l.memory_bytes >> 20,
                    l.wall.as_secs()
                )?;
            }
        }
        if let Some(e) = &self.eval {
            writeln!(
                f,
                "  eval       every {} steps on {} held-out problems ({} new tokens)",
                e.every, e.problems, e.max_tokens
            )?;
        }
        writeln!(f, "  launcher   {}", self.launcher.summary)?;
        tracking(f, &self.tracking)?;
        writeln!(f, "  transport  {}", self.transport.backend)?;
        for g in &self.transport.groups {
            writeln!(f, "    {g}")?;
        }
        if let Some(d) = &self.drafter.job {
            let path = match d.route {
                FeatureRouteKind::Transport => {
                    "engine rank i -> trainer over transport group pair<i> (shm on one host)"
                }
                FeatureRouteKind::Control => "through the controller (control plane)",
            };
            let when = if d.eval_every > 0 {
                format!("every {} steps and after the last", d.eval_every)
            } else {
                "after the last step".to_owned()
            };
            writeln!(
                f,
                "  drafter    hidden states {path}; acceptance length {when} on {} held-out prompts ({} draft tokens)",
                d.eval_prompts, d.draft_tokens
            )?;
        }
        if let Some(d) = &self.drafter.rl {
            let when = match d.train_in {
                TrainIn::Bubbles => "in the rollout's bubbles",
                TrainIn::AfterRollout => "after the rollout",
                TrainIn::Off => "never",
            };
            writeln!(
                f,
                "  drafter    `{}` from plugin `{}` trained {when} (at most {} steps a bubble, every {} steps, once {} ranks are done); synced after every weight sync; {} draft tokens",
                d.trainer.component,
                d.trainer.plugin,
                d.max_steps_per_bubble,
                d.train_every_n_steps,
                d.min_ranks_for_training,
                d.draft_tokens
            )?;
        }
        Ok(())
    }
}

/// `  tracking   tensorboard DIR; wandb ENTITY/PROJECT (MODE, python P); mlflow URI (experiment E)`.
fn tracking(f: &mut fmt::Formatter<'_>, t: &tandem_track::TrackPlan) -> fmt::Result {
    if t.is_empty() {
        return Ok(());
    }
    let mut parts = Vec::new();
    if let Some(d) = &t.tensorboard {
        parts.push(format!("tensorboard {}", d.display()));
    }
    if let Some(w) = &t.wandb {
        let s = &w.section;
        let entity = s
            .entity
            .as_deref()
            .map(|e| format!("{e}/"))
            .unwrap_or_default();
        parts.push(format!(
            "wandb {entity}{} ({}, python {})",
            s.project,
            s.mode.as_str(),
            w.python.display()
        ));
    }
    if let Some(m) = &t.mlflow {
        parts.push(format!(
            "mlflow {} (experiment {})",
            m.tracking_uri, m.experiment
        ));
    }
    writeln!(f, "  tracking   {}", parts.join("; "))
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
    if c.value_model {
        what.push("value model".into());
    }
    let source = c.source.describe();
    writeln!(f, "             {} ({source})", what.join(", "))
}
