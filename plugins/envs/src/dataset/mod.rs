//! The `dataset` environment: rows of a JSONL, Parquet or `datasets` `save_to_disk` file as
//! items, scored by built-in verifiers (`verify`) chosen per environment or per data source.
//!
//! - Items: `item("train", i)` is row `order(e)[i % n]` of the training rows, where `n` is
//!   their number, `e = i / n` the epoch and `order(e)` a permutation of the rows from
//!   `(seed, e)` (the identity with `shuffle = false`); `item("held_out", i)` is held-out row
//!   `i` in file order. An item's id is its id column's value or its row number within its
//!   file, so it is a pure function of `(seed, split, index)`.
//! - The held-out split: `held_out` (a second file), or `held_out_fraction` of the rows (chosen
//!   from the seed), or else, when the run evaluates (`[eval] problems` = k > 0), k rows
//!   chosen the same way. A held-out prompt that is also a training prompt is refused.
//! - Rewards: `reward` for every row, `sources.<data source>` overriding it for that source's
//!   rows; a row whose source has no spec when `reward` is unset is `not_applicable`. Rewards
//!   report their components when every spec has the same ones (the contract: every `ok`
//!   reward reports the declared components); specs with different components report none
//!   (per-source metrics tell them apart).
//! - Every file is read (and every row mapped) when the environment is built, also when it is
//!   only checked, so `tandem check` reports bad data; everything is held in memory (see
//!   `read.rs`).

mod arrow;
mod options;
mod read;
mod rows;
mod split;

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_files;

use crate::verify::{self, ScoreInput, Scorer};
use options::DatasetOptions;
use rows::{Columns, Entry};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use tandem_plugin_api::sdk::{EnvironmentImpl, Result, environment_box};
use tandem_plugin_api::{
    EnvItem, EnvironmentBox, EnvironmentConfig, EnvironmentInfo, HELD_OUT_SPLIT, PluginError,
    RString, RVec, Reward, ScoreSample, SplitInfo, TRAIN_SPLIT,
};

/// The environment once built.
struct Dataset {
    train: Vec<Entry>,
    held_out: Vec<Entry>,
    shuffle: bool,
    seed: u64,
    /// The spec of `reward` (None: only `sources`).
    default: Option<Box<dyn Scorer>>,
    by_source: BTreeMap<String, Box<dyn Scorer>>,
    sources: Vec<String>,
    /// The components every reward reports (empty when the specs differ).
    components: Vec<String>,
    /// Rows by id: (held-out?, position), for the row a scored item came from.
    by_id: HashMap<String, Vec<(bool, usize)>>,
    /// The last epochs' orders.
    orders: Mutex<Vec<(u64, Arc<Vec<u32>>)>>,
}

fn resolve(config: &EnvironmentConfig, path: &str) -> PathBuf {
    let p = Path::new(path);
    if p.is_absolute() || config.base_dir.is_empty() {
        p.to_path_buf()
    } else {
        Path::new(config.base_dir.as_str()).join(p)
    }
}

/// The entries of the rows of `path`, read through the option `key`.
fn entries(rows: Vec<Value>, columns: &Columns, path: &Path, key: &str) -> Result<Vec<Entry>> {
    rows.into_iter()
        .enumerate()
        .map(|(n, row)| columns.entry(row, n, path))
        .collect::<Result<Vec<_>>>()
        .map_err(|e| read::at_key(key, e))
}

/// Builds the environment from `config` (reads every file now).
pub(crate) fn build(config: &EnvironmentConfig) -> Result<EnvironmentBox> {
    Ok(environment_box(Dataset::new(config)?))
}

impl Dataset {
    fn new(config: &EnvironmentConfig) -> Result<Dataset> {
        let options = DatasetOptions::parse(config.options_json.as_str())?;
        let default = options
            .reward
            .as_ref()
            .map(|r| verify::build(r, "reward", config))
            .transpose()?;
        let mut by_source = BTreeMap::new();
        for (source, spec) in &options.sources {
            by_source.insert(
                source.clone(),
                verify::build(spec, &format!("sources.{source}"), config)?,
            );
        }
        let needs_answer = default
            .iter()
            .chain(by_source.values())
            .any(|s| s.needs_answer());
        let path = resolve(config, &options.path);
        let rows = read::read_rows(&path, "path")?;
        let columns = Columns::resolve(&options, &rows[0], &path, needs_answer)?;
        let all = entries(rows, &columns, &path, "path")?;
        let (train, held_out, held_key) =
            match (&options.held_out, options.held_out_fraction) {
                (Some(file), _) => {
                    let held_path = resolve(config, file);
                    let held_rows = read::read_rows(&held_path, "held_out")?;
                    (
                        all,
                        entries(held_rows, &columns, &held_path, "held_out")?,
                        "options.held_out",
                    )
                }
                (None, Some(f)) => {
                    let k = (f * all.len() as f64).round().max(1.0) as usize;
                    let (t, h) = split::split_off(all, k, config.seed)
                        .map_err(|e| read::at_key("held_out_fraction", e))?;
                    (t, h, "options.held_out_fraction")
                }
                (None, None) if config.held_out > 0 => {
                    // `held_out: ...` is how `tandem check` knows the error is `[eval] problems`'.
                    let (t, h) = split::split_off(all, config.held_out as usize, config.seed)
                        .map_err(|e| PluginError {
                            message: format!("held_out: {}", e.message).into(),
                            ..e
                        })?;
                    (t, h, "held_out")
                }
                (None, None) => (all, Vec::new(), ""),
            };
        if u32::try_from(train.len()).is_err() {
            return Err(PluginError::invalid_input(format!(
                "options.path: {} training rows: at most {} are supported",
                train.len(),
                u32::MAX
            ))
            .with_help("split the data into smaller files"));
        }
        split::check(&train, &held_out, held_key)?;
        let sources: Vec<String> = train
            .iter()
            .chain(&held_out)
            .map(|e| e.item.source.to_string())
            .filter(|s| !s.is_empty())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        if let Some(unknown) = by_source.keys().find(|s| !sources.contains(s)) {
            return Err(verify::option_error(
                &format!("sources.{unknown}"),
                "no row has this data source",
                &format!("the data sources are: {}", sources.join(", ")),
            ));
        }
        let specs: Vec<Vec<String>> = default
            .iter()
            .chain(by_source.values())
            .map(|s| s.components())
            .collect();
        let components = match specs.split_first() {
            Some((first, rest)) if rest.iter().all(|c| c == first) => first.clone(),
            _ => Vec::new(),
        };
        let mut by_id: HashMap<String, Vec<(bool, usize)>> = HashMap::new();
        for (held, split) in [(false, &train), (true, &held_out)] {
            for (i, e) in split.iter().enumerate() {
                by_id
                    .entry(e.item.id.to_string())
                    .or_default()
                    .push((held, i));
            }
        }
        Ok(Dataset {
            train,
            held_out,
            shuffle: options.shuffle,
            seed: config.seed,
            default,
            by_source,
            sources,
            components,
            by_id,
            orders: Mutex::new(Vec::new()),
        })
    }

    fn order(&self, epoch: u64) -> Arc<Vec<u32>> {
        let mut orders = self.orders.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((_, o)) = orders.iter().find(|(e, _)| *e == epoch) {
            return o.clone();
        }
        let o = Arc::new(split::epoch_order(
            self.train.len(),
            self.seed,
            epoch,
            self.shuffle,
        ));
        if orders.len() >= 2 {
            orders.remove(0);
        }
        orders.push((epoch, o.clone()));
        o
    }

    fn scorers(&self) -> impl Iterator<Item = &dyn Scorer> {
        self.default
            .iter()
            .chain(self.by_source.values())
            .map(|s| s.as_ref())
    }

    /// The row a scored item came from (same id and prompt), when it is one of ours.
    fn row_of(&self, item: &EnvItem) -> Option<&Value> {
        self.by_id
            .get(item.id.as_str())?
            .iter()
            .find_map(|&(held, i)| {
                let e = if held {
                    &self.held_out[i]
                } else {
                    &self.train[i]
                };
                (e.item.prompt == item.prompt && e.item.messages == item.messages).then_some(&e.row)
            })
    }
}

impl EnvironmentImpl for Dataset {
    fn describe(&self) -> Result<EnvironmentInfo> {
        let mut splits = vec![SplitInfo {
            name: TRAIN_SPLIT.into(),
            size: self.train.len() as u64,
        }];
        if !self.held_out.is_empty() {
            splits.push(SplitInfo {
                name: HELD_OUT_SPLIT.into(),
                size: self.held_out.len() as u64,
            });
        }
        let (lo, hi) = self
            .scorers()
            .map(|s| s.range())
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), (a, b)| {
                (lo.min(a), hi.max(b))
            });
        Ok(EnvironmentInfo {
            splits: splits.into(),
            components: self
                .components
                .iter()
                .map(|c| RString::from(c.as_str()))
                .collect::<RVec<_>>(),
            sources: self
                .sources
                .iter()
                .map(|s| RString::from(s.as_str()))
                .collect::<RVec<_>>(),
            reward_min: lo as f32,
            reward_max: hi as f32,
            multi_turn: false,
        })
    }

    fn item(&self, split: &str, index: u64) -> Result<EnvItem> {
        match split {
            TRAIN_SPLIT => {
                let n = self.train.len() as u64;
                let order = self.order(index / n);
                Ok(self.train[order[(index % n) as usize] as usize]
                    .item
                    .clone())
            }
            HELD_OUT_SPLIT => usize::try_from(index)
                .ok()
                .and_then(|i| self.held_out.get(i))
                .map(|e| e.item.clone())
                .ok_or_else(|| {
                    PluginError::invalid_input(format!(
                        "held-out item {index} does not exist: the split has {} items",
                        self.held_out.len()
                    ))
                }),
            other => Err(PluginError::invalid_input(format!(
                "`dataset` has no split `{other}` (it has {TRAIN_SPLIT} and {HELD_OUT_SPLIT})"
            ))),
        }
    }

    fn score(&self, samples: Vec<ScoreSample>) -> Result<Vec<Reward>> {
        let mut out: Vec<Option<Reward>> = vec![None; samples.len()];
        // Samples grouped by scorer: the source's spec, else `reward`'s.
        let mut groups: BTreeMap<Option<&str>, Vec<usize>> = BTreeMap::new();
        for (i, s) in samples.iter().enumerate() {
            let source = s.item.source.as_str();
            if self.by_source.contains_key(source) {
                groups.entry(Some(source)).or_default().push(i);
            } else if self.default.is_some() {
                groups.entry(None).or_default().push(i);
            } else {
                out[i] = Some(Reward::not_applicable(format!(
                    "no reward for data source `{source}`: add it to options.sources or set options.reward"
                )));
            }
        }
        for (source, indices) in groups {
            let scorer = match source {
                Some(s) => self.by_source.get(s),
                None => self.default.as_ref(),
            };
            let Some(scorer) = scorer else { continue };
            let inputs: Vec<ScoreInput<'_>> = indices
                .iter()
                .map(|&i| ScoreInput {
                    sample: &samples[i],
                    row: self.row_of(&samples[i].item),
                })
                .collect();
            let rewards = scorer.score(&inputs);
            let wrong = rewards.len() != inputs.len();
            for (k, &i) in indices.iter().enumerate() {
                out[i] = Some(match rewards.get(k) {
                    Some(r) if !wrong => {
                        let mut r = verify::checked(r.clone(), scorer.range());
                        if self.components.is_empty() {
                            r.components = RVec::new();
                        }
                        r
                    }
                    _ => Reward::failed(format!(
                        "the reward gave {} results for {} samples",
                        rewards.len(),
                        inputs.len()
                    )),
                });
            }
        }
        Ok(out
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Reward::failed("the sample was not scored")))
            .collect())
    }
}
