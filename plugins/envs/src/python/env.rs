//! The `python` environment component: a Python class run in a [`Pool`].
//!
//! Options: `class = "module:Class"`, `options = {...}` (the class's keyword arguments), and
//! the pool's (`workers`, `timeout_s`, `start_timeout_s`, `memory_mb`, `cpu_s`, `python`,
//! `python_path`, `reward_range`). Each worker builds `Class(seed=, held_out=, **options)`;
//! `describe()` comes from the first, `item(split, index)` goes to one worker (round robin)
//! and is cached here per `(split, index)`, `score(items, completions)` is batched over the
//! pool. When only checked, no worker starts: the options and the interpreter's path are
//! checked and `describe` reports an endless train split and the declared range.

use super::pool::{Pool, Target};
use super::{POOL_KEYS, PoolOptions, check_target, sample_json, verdict};
use serde_json::{Map, Value, json};
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Mutex, PoisonError};
use tandem_plugin_api::sdk::{EnvironmentImpl, Result, environment_box};
use tandem_plugin_api::{
    ChatMessage, EnvItem, EnvironmentBox, EnvironmentConfig, EnvironmentInfo, HELD_OUT_SPLIT,
    PluginError, RString, RVec, Reward, ScoreSample, SplitInfo, TRAIN_SPLIT,
};

/// A Python environment class in a pool (or, when only checked, its options).
struct PythonEnv {
    pool: Option<Pool>,
    info: EnvironmentInfo,
    what: String,
    cache: Mutex<HashMap<(String, u64), EnvItem>>,
}

fn bad(message: String, help: &str) -> PluginError {
    PluginError::invalid_input(message).with_help(help.to_string())
}

/// The options: `class`, `options` and the pool's.
fn parse(config: &EnvironmentConfig) -> Result<(String, Map<String, Value>, PoolOptions)> {
    const HELP: &str = "the `python` environment takes `class = \"module:Class\"`, `options = \
                        {...}` and the pool's options (workers, timeout_s, start_timeout_s, \
                        memory_mb, cpu_s, python, python_path, reward_range)";
    let mut map: Map<String, Value> = serde_json::from_str(config.options_json.as_str())
        .map_err(|e| bad(format!("options are not a JSON object: {e}"), HELP))?;
    let class = match map.remove("class") {
        Some(Value::String(c)) => c,
        Some(other) => return Err(bad(format!("`class` is {other}, not a string"), HELP)),
        None => return Err(bad("the `python` environment needs `class`".into(), HELP)),
    };
    let what = format!("Python environment `{class}`");
    check_target(&class, "class", &what)?;
    let options = match map.remove("options") {
        None => Map::new(),
        Some(Value::Object(o)) => o,
        Some(other) => {
            return Err(bad(
                format!("{what}: `options` is {other}, not a table"),
                HELP,
            ));
        }
    };
    if let Some(k) = map.keys().find(|k| !POOL_KEYS.contains(&k.as_str())) {
        return Err(bad(format!("{what}: unknown option `{k}`"), HELP));
    }
    let pool: PoolOptions = serde_json::from_value(Value::Object(map))
        .map_err(|e| bad(format!("{what}: {e}"), HELP))?;
    pool.validate(&what)?;
    Ok((class, options, pool))
}

/// Builds the `python` environment of `config` (what the `envs` plugin's `new_environment`
/// calls for `python`).
pub fn build(config: &EnvironmentConfig) -> Result<EnvironmentBox> {
    let (class, options, pool_options) = parse(config)?;
    let what = format!("Python environment `{class}`");
    if config.check_only() {
        pool_options.interpreter(&what)?;
        let [lo, hi] = pool_options.reward_range.unwrap_or([0.0, 1.0]);
        // What the class will say is unknown until it runs: a run that evaluates asks it for
        // `held_out` items, so a check assumes it has them (the run reports it if not).
        let mut declared = json!({"reward_range": [lo, hi]});
        if config.held_out > 0 {
            declared["splits"] = json!({"train": 0, "held_out": config.held_out});
        }
        let info = info_of(&declared, None, &what)?;
        return Ok(environment_box(PythonEnv {
            pool: None,
            info,
            what,
            cache: Mutex::new(HashMap::new()),
        }));
    }
    let mut kwargs = Map::new();
    kwargs.insert("seed".into(), json!(config.seed));
    kwargs.insert("held_out".into(), json!(config.held_out));
    kwargs.extend(options);
    let target = Target::Env {
        class,
        kwargs: Value::Object(kwargs),
    };
    let base = Path::new(config.base_dir.as_str());
    let spec = pool_options.spec(target, base, Path::new(config.run_dir.as_str()), &what)?;
    let pool = Pool::start(spec)?;
    let info = info_of(pool.describe(), pool_options.reward_range, &what)?;
    Ok(environment_box(PythonEnv {
        pool: Some(pool),
        info,
        what,
        cache: Mutex::new(HashMap::new()),
    }))
}

/// `describe()`'s dict as [`EnvironmentInfo`]; `range` overrides its `reward_range`.
fn info_of(d: &Value, range: Option<[f64; 2]>, what: &str) -> Result<EnvironmentInfo> {
    let help = "describe() returns {\"splits\": {\"train\": N or 0, \"held_out\": M}, \
                \"components\": [...], \"sources\": [...], \"reward_range\": [lo, hi]}";
    let strings = |key: &str| -> Result<RVec<RString>> {
        match d.get(key) {
            None | Some(Value::Null) => Ok(RVec::new()),
            Some(Value::Array(a)) => a
                .iter()
                .map(|v| {
                    v.as_str().map(RString::from).ok_or_else(|| {
                        bad(format!("{what}: describe()[\"{key}\"] holds {v}"), help)
                    })
                })
                .collect(),
            Some(v) => Err(bad(format!("{what}: describe()[\"{key}\"] is {v}"), help)),
        }
    };
    let mut splits = vec![SplitInfo {
        name: TRAIN_SPLIT.into(),
        size: 0,
    }];
    if let Some(s) = d.get("splits").and_then(Value::as_object) {
        let mut names: Vec<&String> = s.keys().collect();
        names.sort_by_key(|n| (n.as_str() != TRAIN_SPLIT, n.as_str() != HELD_OUT_SPLIT, *n));
        for name in names {
            let size = match &s[name] {
                Value::Null => 0,
                v => v.as_u64().ok_or_else(|| {
                    bad(
                        format!("{what}: split `{name}` has size {v}, not a count"),
                        help,
                    )
                })?,
            };
            if name == TRAIN_SPLIT {
                splits[0].size = size;
            } else {
                splits.push(SplitInfo {
                    name: name.as_str().into(),
                    size,
                });
            }
        }
    }
    let declared = d
        .get("reward_range")
        .and_then(Value::as_array)
        .and_then(|a| Some([a.first()?.as_f64()?, a.get(1)?.as_f64()?]));
    let [lo, hi] = range.or(declared).unwrap_or([0.0, 1.0]);
    if !(lo.is_finite() && hi.is_finite() && lo < hi) {
        return Err(bad(
            format!("{what}: reward_range [{lo}, {hi}] is not [min, max]"),
            help,
        ));
    }
    Ok(EnvironmentInfo {
        splits: splits.into(),
        components: strings("components")?,
        sources: strings("sources")?,
        reward_min: lo as f32,
        reward_max: hi as f32,
        multi_turn: false,
    })
}

/// `item()`'s dict as an [`EnvItem`].
fn item_of(v: &Value, what: &str, split: &str, index: u64) -> Result<EnvItem> {
    let at = format!("{what}: item(\"{split}\", {index})");
    let help = "item() returns {\"id\", \"prompt\" (str) or \"messages\" ([{role, content}]), \
                \"answer\", \"source\", \"metadata\" (dict)}";
    let text = |key: &str| -> String {
        match v.get(key) {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
        }
    };
    let id = text("id");
    if id.is_empty() {
        return Err(bad(format!("{at} has no `id`"), help));
    }
    let mut messages = RVec::new();
    if let Some(list) = v.get("messages").and_then(Value::as_array) {
        for m in list {
            let (Some(role), Some(content)) = (
                m.get("role").and_then(Value::as_str),
                m.get("content").and_then(Value::as_str),
            ) else {
                return Err(bad(
                    format!("{at}: message {m} is not {{role, content}}"),
                    help,
                ));
            };
            messages.push(ChatMessage {
                role: role.into(),
                content: content.into(),
            });
        }
    }
    let prompt = text("prompt");
    if prompt.is_empty() && messages.is_empty() {
        return Err(bad(
            format!("{at} has neither `prompt` nor `messages`"),
            help,
        ));
    }
    let metadata = match v.get("metadata") {
        Some(m @ Value::Object(_)) => m.to_string(),
        _ => "{}".into(),
    };
    Ok(EnvItem {
        id: id.into(),
        prompt: prompt.into(),
        messages,
        answer: text("answer").into(),
        source: text("source").into(),
        metadata_json: metadata.into(),
    })
}

impl PythonEnv {
    fn pool(&self) -> Result<&Pool> {
        self.pool.as_ref().ok_or_else(|| {
            PluginError::invalid_state(format!("{} was only checked, not started", self.what))
        })
    }
}

impl EnvironmentImpl for PythonEnv {
    fn describe(&self) -> Result<EnvironmentInfo> {
        Ok(self.info.clone())
    }

    fn item(&self, split: &str, index: u64) -> Result<EnvItem> {
        let key = (split.to_string(), index);
        if let Some(it) = self
            .cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(it.clone());
        }
        let answer = self
            .pool()?
            .request(&json!({"op": "item", "split": split, "index": index}))?;
        if let Some(e) = answer.get("error") {
            return Err(PluginError::runtime(format!(
                "{}: item(\"{split}\", {index}) raised {}",
                self.what,
                e.as_str().unwrap_or("an error")
            )));
        }
        let item = item_of(
            answer.get("item").unwrap_or(&Value::Null),
            &self.what,
            split,
            index,
        )?;
        self.cache
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, item.clone());
        Ok(item)
    }

    fn score(&self, samples: Vec<ScoreSample>) -> Result<Vec<Reward>> {
        let pool = self.pool()?;
        let json: Vec<Value> = samples.iter().map(sample_json).collect();
        let range = (
            f64::from(self.info.reward_min),
            f64::from(self.info.reward_max),
        );
        let what = format!("{}.score", self.what);
        Ok(pool
            .score(&json)
            .into_iter()
            .map(|o| verdict::reward(o, range, &what))
            .collect())
    }
}
