//! A PEFT LoRA adapter directory as a merge reads it: `adapter_config.json` (rank, alpha,
//! rsLoRA, target modules; every feature a plain `W + scale·B·A` cannot express refused in
//! one line) and the A/B pairs of `adapter_model.safetensors`, keyed by the base tensor they
//! adapt (`base_model.model.<module>.lora_A[.<adapter>].weight` → `<module>.weight`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::tensors::{self, Info};
use crate::error::{ModelError, Result};

/// The adapter's config file.
pub(crate) const CONFIG: &str = "adapter_config.json";
/// The adapter's tensors.
pub(crate) const WEIGHTS: &str = "adapter_model.safetensors";

const HELP: &str = "merge it with PEFT (`merge_and_unload()`), or train a plain LoRA adapter";

/// What `adapter_config.json` says about the merge.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct AdapterConfig {
    /// Rank.
    pub r: usize,
    /// `lora_alpha`.
    pub alpha: f64,
    /// `use_rslora`: scale `alpha / sqrt(r)` instead of `alpha / r`.
    pub rslora: bool,
    /// `target_modules` when it is a list of names (a regex string matches anything).
    pub targets: Option<Vec<String>>,
}

impl AdapterConfig {
    /// The factor of `B·A`.
    pub fn scale(&self) -> f32 {
        let r = self.r as f64;
        (if self.rslora {
            self.alpha / r.sqrt()
        } else {
            self.alpha / r
        }) as f32
    }

    /// Reads and checks `dir/adapter_config.json`.
    pub fn read(dir: &Path) -> Result<AdapterConfig> {
        let path = dir.join(CONFIG);
        if !path.is_file() {
            return Err(ModelError::invalid(
                dir,
                format!("no {CONFIG}: not a PEFT adapter directory"),
            )
            .with_help("give --adapter the directory holding adapter_config.json"));
        }
        let v = tensors::read_json(&path)?;
        let refuse = |m: String| ModelError::invalid(&path, m).with_help(HELP);
        let flag = |k: &str| v.get(k).and_then(Value::as_bool) == Some(true);
        let peft_type = v.get("peft_type").and_then(Value::as_str).unwrap_or("");
        if peft_type != "LORA" {
            return Err(refuse(format!(
                "peft_type is `{peft_type}`; only LORA adapters merge"
            )));
        }
        for (key, what) in [
            ("use_dora", "DoRA (use_dora = true)"),
            ("fan_in_fan_out", "fan_in_fan_out = true (Conv1D layers)"),
            ("lora_bias", "LoRA biases (lora_bias = true)"),
        ] {
            if flag(key) {
                return Err(refuse(format!("{what} is not supported")));
            }
        }
        match v.get("bias").and_then(Value::as_str) {
            None | Some("none") => {}
            Some(b) => {
                return Err(refuse(format!(
                    "bias = \"{b}\" is not supported: the adapter trains bias vectors"
                )));
            }
        }
        match v.get("modules_to_save") {
            None | Some(Value::Null) => {}
            Some(Value::Array(a)) if a.is_empty() => {}
            Some(m) => {
                return Err(refuse(format!(
                    "modules_to_save ({m}) is not supported: the adapter carries whole modules"
                )));
            }
        }
        for (key, what) in [
            (
                "target_parameters",
                "LoRA on parameters (target_parameters)",
            ),
            (
                "trainable_token_indices",
                "trainable tokens (trainable_token_indices)",
            ),
            ("layer_replication", "layer_replication"),
            (
                "alora_invocation_tokens",
                "activated LoRA (alora_invocation_tokens)",
            ),
        ] {
            let set = match v.get(key) {
                None | Some(Value::Null) => false,
                Some(Value::Array(a)) => !a.is_empty(),
                Some(Value::Object(o)) => !o.is_empty(),
                Some(_) => true,
            };
            if set {
                return Err(refuse(format!("{what} is not supported")));
            }
        }
        for key in ["rank_pattern", "alpha_pattern"] {
            if v.get(key)
                .and_then(Value::as_object)
                .is_some_and(|o| !o.is_empty())
            {
                return Err(refuse(format!(
                    "{key} is not supported: every module must share r and lora_alpha"
                )));
            }
        }
        let r = v.get("r").and_then(Value::as_u64).unwrap_or(0) as usize;
        if r == 0 {
            return Err(ModelError::invalid(&path, "needs a positive integer `r`"));
        }
        let alpha = v
            .get("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| ModelError::invalid(&path, "needs a number `lora_alpha`"))?;
        let targets = match v.get("target_modules") {
            Some(Value::Array(a)) => Some(
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect(),
            ),
            _ => None,
        };
        Ok(AdapterConfig {
            r,
            alpha,
            rslora: flag("use_rslora"),
            targets,
        })
    }
}

/// One adapted base tensor: the adapter's names and header entries of its A and B.
#[derive(Debug, Clone)]
pub(crate) struct Pair {
    pub a: Named,
    pub b: Named,
}

/// A tensor's key and header entry.
type Named = (String, Info);
/// The A and the B of one module, as far as they were found.
type Halves = (Option<Named>, Option<Named>);

/// The adapter's A/B pairs by base tensor name (`<module>.weight`).
pub(crate) fn pairs(dir: &Path, cfg: &AdapterConfig) -> Result<BTreeMap<String, Pair>> {
    let path: PathBuf = dir.join(WEIGHTS);
    if !path.is_file() {
        let why = if dir.join("adapter_model.bin").is_file() {
            format!("has adapter_model.bin but no {WEIGHTS}")
        } else {
            format!("no {WEIGHTS}")
        };
        return Err(ModelError::invalid(dir, why)
            .with_help("save the adapter with safe_serialization=True (PEFT's default)"));
    }
    // Base tensor → (A, B) as found so far.
    let mut halves: BTreeMap<String, Halves> = BTreeMap::new();
    for (key, info) in tensors::header(&path)? {
        let (module, is_a) = parse_key(&key).ok_or_else(|| {
            ModelError::invalid(
                &path,
                format!(
                    "tensor `{key}` is not a LoRA A/B matrix of a linear layer (embedding LoRA, \
                     DoRA magnitudes and saved modules are not supported)"
                ),
            )
            .with_help(HELP)
        })?;
        if let Some(targets) = &cfg.targets {
            let named = |t: &String| module == t || module.ends_with(&format!(".{t}"));
            if !targets.iter().any(named) {
                return Err(ModelError::invalid(
                    &path,
                    format!("tensor `{key}` adapts `{module}`, which target_modules does not name"),
                ));
            }
        }
        if !tensors::is_float(info.dtype) || info.shape.len() != 2 {
            return Err(ModelError::invalid(
                &path,
                format!(
                    "tensor `{key}` is {:?} {:?}; a LoRA matrix is a 2-D F32, BF16 or F16 tensor",
                    info.dtype, info.shape
                ),
            ));
        }
        let slot = halves.entry(format!("{module}.weight")).or_default();
        let half = if is_a { &mut slot.0 } else { &mut slot.1 };
        if half.is_some() {
            return Err(ModelError::invalid(
                &path,
                format!(
                    "two LoRA matrices for `{module}` (an adapter file with several adapters?)"
                ),
            ));
        }
        *half = Some((key, info));
    }
    let mut out = BTreeMap::new();
    for (base, halves) in halves {
        let pair = match halves {
            (Some(a), Some(b)) => Pair { a, b },
            (Some((k, _)), None) | (None, Some((k, _))) => {
                return Err(ModelError::invalid(
                    &path,
                    format!("tensor `{k}` has no lora_A/lora_B partner"),
                ));
            }
            (None, None) => continue,
        };
        let (ra, rb) = (pair.a.1.shape[0], pair.b.1.shape[1]);
        if ra != cfg.r || rb != cfg.r {
            return Err(ModelError::invalid(
                &path,
                format!(
                    "`{}` has shape {:?} and `{}` {:?}, but adapter_config.json says r = {}",
                    pair.a.0, pair.a.1.shape, pair.b.0, pair.b.1.shape, cfg.r
                ),
            ));
        }
        out.insert(base, pair);
    }
    if out.is_empty() {
        return Err(ModelError::invalid(&path, "holds no LoRA matrices"));
    }
    Ok(out)
}

/// `base_model.model.<module>.lora_{A,B}[.<adapter>].weight` → (`<module>`, is A).
fn parse_key(key: &str) -> Option<(&str, bool)> {
    let rest = key.strip_prefix("base_model.model.")?;
    for (marker, is_a) in [(".lora_A.", true), (".lora_B.", false)] {
        if let Some(at) = rest.find(marker) {
            let tail = &rest[at + marker.len()..];
            let plain = tail == "weight";
            let named = tail
                .strip_suffix(".weight")
                .is_some_and(|n| !n.is_empty() && !n.contains('.'));
            return (plain || named).then_some((&rest[..at], is_a));
        }
    }
    None
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::parse_key;

    #[test]
    fn peft_keys_parse_with_and_without_an_adapter_name() {
        let k = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
        assert_eq!(
            parse_key(k),
            Some(("model.layers.0.self_attn.q_proj", true))
        );
        let k = "base_model.model.model.layers.3.mlp.down_proj.lora_B.default.weight";
        assert_eq!(parse_key(k), Some(("model.layers.3.mlp.down_proj", false)));
        for bad in [
            "model.layers.0.self_attn.q_proj.lora_A.weight",
            "base_model.model.model.embed_tokens.lora_embedding_A",
            "base_model.model.model.layers.0.self_attn.q_proj.lora_magnitude_vector",
            "base_model.model.lm_head.modules_to_save.default.weight",
            "base_model.model.model.layers.0.self_attn.q_proj.lora_A.bias",
        ] {
            assert_eq!(parse_key(bad), None, "{bad}");
        }
    }
}
