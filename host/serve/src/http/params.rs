//! Sampling parameters: SGLang's `sampling_params` object (its key set, unknown keys
//! refused as SGLang's request contract does) into what the native engine takes. Keys the
//! engine cannot honour are accepted at their neutral value and refused otherwise, naming
//! the key (penalties, `min_p`, grammars, stop strings, logit bias, beams).

use serde_json::{Map, Value};

use crate::sched::Sampling;

/// SGLang 0.5.23's `sampling_params` keys (`sglang/api/v1/api_types.py`).
pub const KEYS: [&str; 28] = [
    "max_new_tokens",
    "stop",
    "stop_token_ids",
    "stop_regex",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "min_new_tokens",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "stream_interval",
    "logit_bias",
    "sampling_seed",
    "custom_params",
    "beam_width",
    "watermark",
    "choice",
];

/// Why parameters were refused.
#[derive(Debug)]
pub enum ParamError {
    /// Not SGLang's contract (unknown key, wrong type): `{"error": "..."}`.
    Contract(String),
    /// Valid for SGLang, not doable by the native engine: a handler error.
    Unsupported(String),
}

/// Parsed sampling parameters.
#[derive(Debug, Clone)]
pub struct Params {
    /// 0 = greedy.
    pub temperature: f32,
    /// Nucleus mass.
    pub top_p: f32,
    /// 0 = off.
    pub top_k: u32,
    /// Seed.
    pub seed: Option<u64>,
    /// Token budget.
    pub max_new: u32,
    /// Extra stop ids.
    pub stop_ids: Vec<u32>,
    /// Do not stop at EOS.
    pub ignore_eos: bool,
    /// Skip special tokens in text.
    pub skip_special: bool,
    /// Samples per prompt.
    pub n: u32,
    /// Tokens per streamed chunk.
    pub stream_interval: Option<u32>,
}

impl Default for Params {
    fn default() -> Self {
        Params {
            temperature: 1.0,
            top_p: 1.0,
            top_k: 0,
            seed: None,
            max_new: 128,
            stop_ids: Vec::new(),
            ignore_eos: false,
            skip_special: true,
            n: 1,
            stream_interval: None,
        }
    }
}

impl Params {
    /// The batching key: greedy requests ignore the seed; a seeded one stays in `group`.
    pub fn sampling(&self, eos: &[u32], adapter: Option<String>, group: u64) -> Sampling {
        let mut stop_ids = self.stop_ids.clone();
        if !self.ignore_eos {
            stop_ids.extend(eos.iter().copied().filter(|e| !self.stop_ids.contains(e)));
        }
        let greedy = self.temperature == 0.0;
        let seed = if greedy { None } else { self.seed };
        Sampling {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: if greedy { 0 } else { self.top_k },
            seed,
            stop_ids,
            adapter,
            group: seed.map(|_| group),
        }
    }

    /// Checks the ranges the engine needs.
    pub fn check(&self) -> Result<(), ParamError> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(ParamError::Contract(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            )));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(ParamError::Contract(format!(
                "top_p must be in (0, 1], got {}",
                self.top_p
            )));
        }
        if self.n == 0 {
            return Err(ParamError::Contract("n must be >= 1".into()));
        }
        Ok(())
    }
}

fn wrong(key: &str, want: &str, v: &Value) -> ParamError {
    ParamError::Contract(format!(
        "invalid type for `{key}`: expected {want}, got {v}"
    ))
}

fn f(key: &str, v: &Value) -> Result<Option<f32>, ParamError> {
    match v {
        Value::Null => Ok(None),
        v => v
            .as_f64()
            .map(|x| Some(x as f32))
            .ok_or_else(|| wrong(key, "a number", v)),
    }
}

fn int(key: &str, v: &Value) -> Result<Option<i64>, ParamError> {
    match v {
        Value::Null => Ok(None),
        v => v
            .as_i64()
            .map(Some)
            .ok_or_else(|| wrong(key, "an integer", v)),
    }
}

fn uint(key: &str, v: &Value) -> Result<Option<u32>, ParamError> {
    match int(key, v)? {
        Some(x) => u32::try_from(x)
            .map(Some)
            .map_err(|_| wrong(key, "a non-negative integer", v)),
        None => Ok(None),
    }
}

fn flag(key: &str, v: &Value) -> Result<Option<bool>, ParamError> {
    match v {
        Value::Null => Ok(None),
        Value::Bool(b) => Ok(Some(*b)),
        v => Err(wrong(key, "a boolean", v)),
    }
}

/// A token id list.
pub fn ids(key: &str, v: &Value) -> Result<Vec<u32>, ParamError> {
    match v {
        Value::Null => Ok(Vec::new()),
        Value::Array(a) => a
            .iter()
            .map(|x| {
                x.as_u64()
                    .and_then(|x| u32::try_from(x).ok())
                    .ok_or_else(|| wrong(key, "a list of token ids", v))
            })
            .collect(),
        v => Err(wrong(key, "a list of token ids", v)),
    }
}

/// `true` for null, `""`, `[]`, `{}` and `value`.
fn neutral(v: &Value, value: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.is_empty(),
        v => v == value || v.as_f64().zip(value.as_f64()).is_some_and(|(a, b)| a == b),
    }
}

fn unsupported(key: &str, v: &Value) -> ParamError {
    ParamError::Unsupported(format!(
        "sampling_params.{key} = {v} is not supported by tandem serve's native engine \
         (leave it at its default)"
    ))
}

/// SGLang's `sampling_params` object.
pub fn sglang(v: &Value) -> Result<Params, ParamError> {
    let empty = Map::new();
    let map = match v {
        Value::Null => &empty,
        Value::Object(m) => m,
        v => return Err(wrong("sampling_params", "an object", v)),
    };
    let mut p = Params::default();
    for (key, v) in map {
        let k = key.as_str();
        match k {
            "max_new_tokens" => p.max_new = uint(k, v)?.unwrap_or(128),
            "temperature" => p.temperature = f(k, v)?.unwrap_or(1.0),
            "top_p" => p.top_p = f(k, v)?.unwrap_or(1.0),
            "top_k" => {
                let k = int(k, v)?.unwrap_or(-1);
                p.top_k = if k <= 0 || k >= 1 << 30 { 0 } else { k as u32 };
            }
            "stop_token_ids" => p.stop_ids = ids(k, v)?,
            "ignore_eos" => p.ignore_eos = flag(k, v)?.unwrap_or(false),
            "skip_special_tokens" => p.skip_special = flag(k, v)?.unwrap_or(true),
            "n" => p.n = uint(k, v)?.unwrap_or(1),
            "stream_interval" => p.stream_interval = uint(k, v)?,
            "sampling_seed" => {
                p.seed = int(k, v)?.map(|s| s as u64);
            }
            "spaces_between_special_tokens" | "no_stop_trim" => {
                flag(k, v)?;
            }
            "custom_params" => {}
            "min_p" | "frequency_penalty" | "presence_penalty" | "min_new_tokens" => {
                if !neutral(v, &Value::from(0)) {
                    return Err(unsupported(k, v));
                }
            }
            "repetition_penalty" | "beam_width" => {
                if !neutral(v, &Value::from(1)) {
                    return Err(unsupported(k, v));
                }
            }
            "stop" | "stop_regex" | "json_schema" | "regex" | "ebnf" | "structural_tag"
            | "logit_bias" | "watermark" | "choice" => {
                if !neutral(v, &Value::Null) {
                    return Err(unsupported(k, v));
                }
            }
            other => {
                return Err(ParamError::Contract(format!(
                    "unknown field `{other}`, expected one of {}",
                    KEYS.map(|k| format!("`{k}`")).join(", ")
                )));
            }
        }
    }
    p.check()?;
    Ok(p)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use serde_json::json;

    #[test]
    fn sglang_keys_parse_and_unknown_keys_are_contract_errors() {
        let p = sglang(&json!({"max_new_tokens": 7, "temperature": 0, "top_k": -1,
            "stop_token_ids": [5], "ignore_eos": true, "min_p": 0.0, "stop": [],
            "repetition_penalty": 1.0, "sampling_seed": 3, "stream_interval": 2}))
        .unwrap();
        assert_eq!((p.max_new, p.temperature, p.top_k), (7, 0.0, 0));
        assert_eq!((p.stop_ids, p.ignore_eos, p.seed), (vec![5], true, Some(3)));
        assert_eq!(p.stream_interval, Some(2));
        assert!(
            matches!(sglang(&json!({"bogus": 1})), Err(ParamError::Contract(m)) if m.contains("unknown field `bogus`"))
        );
        assert!(matches!(
            sglang(&json!({"temperature": "hot"})),
            Err(ParamError::Contract(_))
        ));
        assert!(matches!(
            sglang(&json!({"top_p": 0})),
            Err(ParamError::Contract(_))
        ));
        assert!(
            matches!(sglang(&json!({"presence_penalty": 0.5})), Err(ParamError::Unsupported(m)) if m.contains("presence_penalty"))
        );
        assert!(matches!(
            sglang(&json!({"stop": ["\n"]})),
            Err(ParamError::Unsupported(_))
        ));
    }

    #[test]
    fn greedy_requests_share_a_batch_key_and_seeded_ones_keep_their_group() {
        let greedy = sglang(&json!({"temperature": 0, "sampling_seed": 9})).unwrap();
        assert_eq!(
            greedy.sampling(&[2], None, 1),
            greedy.sampling(&[2], None, 2)
        );
        let seeded = sglang(&json!({"temperature": 0.7, "sampling_seed": 9})).unwrap();
        assert_ne!(
            seeded.sampling(&[2], None, 1),
            seeded.sampling(&[2], None, 2)
        );
        let s = sglang(&json!({"ignore_eos": true}))
            .unwrap()
            .sampling(&[2], None, 0);
        assert!(s.stop_ids.is_empty());
        let s = sglang(&json!({"stop_token_ids": [4]}))
            .unwrap()
            .sampling(&[2], None, 0);
        assert_eq!(s.stop_ids, vec![4, 2]);
    }
}
