//! The generated tasks (`tasks/`) as environment components: split `train` is the task's
//! stream with the held-out prompts replaced, split `held_out` is `[eval] problems` problems
//! of the held-out stream (see `tasks/split.rs`); item `i` of a split has id `split-i`.

use crate::tasks::split::{HeldOut, PROBE, TrainStream};
use crate::tasks::{self, Problem, Task, TaskError, TaskSpec};
use tandem_plugin_api::sdk::{EnvironmentImpl, Result, environment_box};
use tandem_plugin_api::{
    EnvItem, EnvironmentBox, EnvironmentConfig, EnvironmentInfo, HELD_OUT_SPLIT, PluginError,
    RString, RVec, Reward, ScoreSample, SplitInfo, TRAIN_SPLIT,
};

/// A generated task as an environment.
struct Generated {
    kind: String,
    train: Box<dyn Task>,
    held_out: Option<HeldOut>,
}

fn task_error(e: TaskError) -> PluginError {
    let err = PluginError::invalid_input(e.to_string());
    match e.help {
        Some(help) => err.with_help(help),
        None => err,
    }
}

/// The options of `config` as the task's spec.
fn spec(config: &EnvironmentConfig) -> Result<TaskSpec> {
    let options: serde_json::Map<String, serde_json::Value> =
        serde_json::from_str(config.options_json.as_str()).map_err(|e| {
            PluginError::invalid_input(format!("options are not a JSON object: {e}"))
        })?;
    Ok(TaskSpec {
        kind: config.component.to_string(),
        options,
    })
}

/// Builds the environment of `config.component` (one of [`tasks::KINDS`]).
pub(crate) fn build(config: &EnvironmentConfig) -> Result<EnvironmentBox> {
    let spec = spec(config)?;
    let seed = config.seed;
    tasks::build(&spec, seed).map_err(task_error)?;
    let held_out = match config.held_out {
        0 => None,
        n => Some(HeldOut::new(&spec, seed, n).map_err(task_error)?),
    };
    let train: Box<dyn Task> = match &held_out {
        None => tasks::build(&spec, seed).map_err(task_error)?,
        Some(h) => {
            let stream = TrainStream::new(&spec, seed, h.clone()).map_err(task_error)?;
            let collisions = stream.collisions(PROBE);
            if collisions * 2 > PROBE {
                return Err(PluginError::invalid_input(format!(
                    "held_out: a held-out set of {} problems covers {collisions} of the first {PROBE} \
                     training problems: the task has too few distinct problems to hold that \
                     many out",
                    config.held_out
                ))
                .with_help(
                    "hold out fewer problems ([eval] problems), or widen the task (e.g. more \
                     digits or a larger max_operand)",
                ));
            }
            Box::new(stream)
        }
    };
    Ok(environment_box(Generated {
        kind: spec.kind,
        train,
        held_out,
    }))
}

impl Generated {
    /// The item of problem `p`; its `expression`, when it has one, in the metadata.
    fn item_of(&self, split: &str, p: Problem) -> EnvItem {
        let metadata = match &p.expression {
            Some(e) => serde_json::json!({ "expression": e }).to_string(),
            None => "{}".to_owned(),
        };
        EnvItem {
            source: RString::from(self.kind.as_str()),
            metadata_json: RString::from(metadata),
            ..EnvItem::text(format!("{split}-{}", p.index), p.prompt, p.answer)
        }
    }
}

impl EnvironmentImpl for Generated {
    fn describe(&self) -> Result<EnvironmentInfo> {
        let mut splits = vec![SplitInfo {
            name: TRAIN_SPLIT.into(),
            size: 0,
        }];
        if let Some(h) = &self.held_out {
            splits.push(SplitInfo {
                name: HELD_OUT_SPLIT.into(),
                size: h.problems().len() as u64,
            });
        }
        Ok(EnvironmentInfo {
            splits: splits.into(),
            components: RVec::new(),
            sources: vec![RString::from(self.kind.as_str())].into(),
            reward_min: 0.0,
            reward_max: 1.0,
            multi_turn: false,
        })
    }

    fn item(&self, split: &str, index: u64) -> Result<EnvItem> {
        match split {
            TRAIN_SPLIT => Ok(self.item_of(split, self.train.problem(index))),
            HELD_OUT_SPLIT => {
                let problems = self.held_out.as_ref().map_or(&[][..], |h| h.problems());
                let p = usize::try_from(index)
                    .ok()
                    .and_then(|i| problems.get(i))
                    .ok_or_else(|| {
                        PluginError::invalid_input(format!(
                            "held-out item {index} does not exist: the split has {} items",
                            problems.len()
                        ))
                    })?;
                Ok(self.item_of(split, p.clone()))
            }
            other => Err(PluginError::invalid_input(format!(
                "`{}` has no split `{other}` (it has {TRAIN_SPLIT} and {HELD_OUT_SPLIT})",
                self.kind
            ))),
        }
    }

    fn score(&self, samples: Vec<ScoreSample>) -> Result<Vec<Reward>> {
        Ok(samples
            .iter()
            .map(|s| {
                let problem = Problem {
                    index: 0,
                    prompt: s.item.prompt.to_string(),
                    answer: s.item.answer.to_string(),
                    expression: None,
                };
                Reward::ok(self.train.reward(&problem, s.completion.text.as_str()))
            })
            .collect())
    }
}
