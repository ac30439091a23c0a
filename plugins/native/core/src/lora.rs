//! LoRA adapters: `y = x Wᵀ + (alpha / r) · (x Aᵀ) Bᵀ` on chosen projections, stored in one
//! flat f32 buffer under PEFT key names, saved/loaded in PEFT format
//! (`adapter_config.json` + `adapter_model.safetensors`).

use std::ops::Range;
use std::path::Path;

use serde_json::{Value, json};

use crate::buffer::{BufferProvider, BufferTag, Region};
use crate::config::ModelConfig;
use crate::error::{NativeError, Result};
use crate::layout::ParamLayout;
use crate::st_io;

/// A projection LoRA can adapt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// self_attn.q_proj
    Q = 0,
    /// self_attn.k_proj
    K = 1,
    /// self_attn.v_proj
    V = 2,
    /// self_attn.o_proj
    O = 3,
    /// mlp.gate_proj
    Gate = 4,
    /// mlp.up_proj
    Up = 5,
    /// mlp.down_proj
    Down = 6,
}

/// All targets in slot order.
pub const ALL_TARGETS: [Target; 7] = [
    Target::Q,
    Target::K,
    Target::V,
    Target::O,
    Target::Gate,
    Target::Up,
    Target::Down,
];

impl Target {
    /// PEFT `target_modules` name.
    pub fn module(self) -> &'static str {
        match self {
            Target::Q => "q_proj",
            Target::K => "k_proj",
            Target::V => "v_proj",
            Target::O => "o_proj",
            Target::Gate => "gate_proj",
            Target::Up => "up_proj",
            Target::Down => "down_proj",
        }
    }
    fn path(self) -> &'static str {
        match self {
            Target::Gate | Target::Up | Target::Down => "mlp",
            _ => "self_attn",
        }
    }
    /// Parses a PEFT module name.
    pub fn from_module(s: &str) -> Option<Target> {
        ALL_TARGETS.into_iter().find(|t| t.module() == s)
    }
    /// `(in, out)` widths of this projection.
    pub fn dims(self, c: &ModelConfig) -> (usize, usize) {
        let d = c.hidden_size;
        match self {
            Target::Q => (d, c.q_dim()),
            Target::K | Target::V => (d, c.kv_dim()),
            Target::O => (c.q_dim(), d),
            Target::Gate | Target::Up => (d, c.intermediate_size),
            Target::Down => (c.intermediate_size, d),
        }
    }
}

/// Hyper-parameters of an adapter.
#[derive(Debug, Clone, PartialEq)]
pub struct LoraConfig {
    /// Rank.
    pub r: usize,
    /// Scaling numerator (`scale = alpha / r`).
    pub alpha: f32,
    /// Adapted projections.
    pub targets: Vec<Target>,
    /// Recorded as `base_model_name_or_path`.
    pub base_model: String,
}

impl LoraConfig {
    /// `alpha / r`.
    pub fn scale(&self) -> f32 {
        self.alpha / self.r as f32
    }
}

/// `(A, B)` ranges of one adapted projection: A is `[r, in]`, B is `[out, r]`.
pub type AbRange = (Range<usize>, Range<usize>);

/// A LoRA adapter whose A/B matrices live in one tagged buffer.
pub struct LoraAdapter {
    /// Hyper-parameters.
    pub cfg: LoraConfig,
    /// PEFT names -> offsets.
    pub layout: ParamLayout,
    /// `[layer][target slot]` -> ranges, `None` when not adapted.
    pub offs: Vec<[Option<AbRange>; 7]>,
    /// The A/B values.
    pub weights: Box<dyn Region>,
}

/// PEFT key prefix of a projection.
fn key(layer: usize, t: Target) -> String {
    format!(
        "base_model.model.model.layers.{layer}.{}.{}",
        t.path(),
        t.module()
    )
}

impl LoraAdapter {
    /// The layout of an adapter for `model` (PEFT names, A then B per projection).
    pub fn layout(
        model: &ModelConfig,
        cfg: &LoraConfig,
    ) -> (ParamLayout, Vec<[Option<AbRange>; 7]>) {
        let mut l = ParamLayout::new();
        let mut offs = Vec::new();
        for layer in 0..model.num_hidden_layers {
            let mut row: [Option<AbRange>; 7] = Default::default();
            for &t in ALL_TARGETS.iter().filter(|t| cfg.targets.contains(t)) {
                let (i, o) = t.dims(model);
                let k = key(layer, t);
                let a = l.push(format!("{k}.lora_A.weight"), vec![cfg.r, i]);
                let b = l.push(format!("{k}.lora_B.weight"), vec![o, cfg.r]);
                row[t as usize] = Some((a, b));
            }
            offs.push(row);
        }
        (l, offs)
    }

    /// A zeroed adapter (B = 0, so it starts as the identity on the model); call
    /// [`init_a`](Self::init_a) to randomise A before training.
    pub fn new(
        model: &ModelConfig,
        cfg: LoraConfig,
        provider: &mut dyn BufferProvider,
    ) -> Result<Self> {
        if cfg.r == 0 || cfg.targets.is_empty() {
            return Err(NativeError::Input(
                "LoRA needs r > 0 and at least one target".into(),
            ));
        }
        let (layout, offs) = Self::layout(model, &cfg);
        let weights = provider.alloc(BufferTag::Weights, "weights/lora", layout.total_len())?;
        Ok(LoraAdapter {
            cfg,
            layout,
            offs,
            weights,
        })
    }

    /// Fills every A with uniform values in ±1/sqrt(in) (PEFT's kaiming-uniform bound, a=√5)
    /// from a seeded generator; B stays zero.
    pub fn init_a(&mut self, seed: u64) {
        let mut rng = crate::sampling::Rng::new(seed);
        let w = self.weights.as_mut_slice();
        for e in self.layout.entries() {
            if e.name.ends_with("lora_A.weight") {
                let bound = 1.0 / (e.shape[1] as f32).sqrt();
                for x in &mut w[e.range()] {
                    *x = (rng.next_f32() * 2.0 - 1.0) * bound;
                }
            }
        }
    }

    /// Errors unless this adapter's tensors have the shapes `model` needs.
    pub fn check_for(&self, model: &ModelConfig) -> Result<()> {
        let (want, _) = Self::layout(model, &self.cfg);
        if want != self.layout {
            return Err(NativeError::Input(format!(
                "LoRA adapter (r={}, targets {:?}) does not fit this model ({} layers, d={}); \
                 was it trained for another base model?",
                self.cfg.r, self.cfg.targets, model.num_hidden_layers, model.hidden_size
            )));
        }
        Ok(())
    }

    /// Writes `adapter_config.json` + `adapter_model.safetensors` into `dir`.
    pub fn save(&self, dir: &Path) -> Result<()> {
        self.save_config(dir)?;
        st_io::save_from(
            &dir.join("adapter_model.safetensors"),
            &self.layout,
            self.weights.as_slice(),
            &|n| n.to_string(),
        )
    }

    /// Writes the PEFT `adapter_config.json` into `dir` (created if missing).
    pub fn save_config(&self, dir: &Path) -> Result<()> {
        std::fs::create_dir_all(dir).map_err(|e| NativeError::io(dir, e))?;
        let modules: Vec<&str> = self.cfg.targets.iter().map(|t| t.module()).collect();
        let conf = json!({
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": self.cfg.r,
            "lora_alpha": self.cfg.alpha,
            "lora_dropout": 0.0,
            "bias": "none",
            "fan_in_fan_out": false,
            "target_modules": modules,
            "base_model_name_or_path": self.cfg.base_model,
            "inference_mode": true,
            "init_lora_weights": true,
            "use_rslora": false,
            "use_dora": false,
            "modules_to_save": null,
            "revision": null,
        });
        let path = dir.join("adapter_config.json");
        let text = serde_json::to_string_pretty(&conf).map_err(|e| NativeError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        st_io::write_in_place(&path, text.as_bytes()).map_err(|e| NativeError::io(&path, e))
    }

    /// Loads a PEFT LoRA adapter directory for `model`.
    pub fn load(
        dir: &Path,
        model: &ModelConfig,
        provider: &mut dyn BufferProvider,
    ) -> Result<Self> {
        Self::load_reusing(dir, model, &mut None, provider, false).map(|(ad, _)| ad)
    }

    /// [`load`](Self::load), reading the tensors into `spare` when it holds exactly this
    /// adapter's number of elements (a buffer of a previous adapter of the same shape: its
    /// pages are already mapped, so loading costs one read of the file, not page faults on
    /// fresh memory); the adapter then owns it. Otherwise (or with `None`) a new buffer is
    /// allocated and `spare` is left as it was. On an error `spare` is kept (its contents are
    /// unspecified). With `digest`, also returns the digest ([`crate::digest`]) of the loaded
    /// weights, computed inside the read when the file is the buffer's bytes.
    pub fn load_reusing(
        dir: &Path,
        model: &ModelConfig,
        spare: &mut Option<Box<dyn Region>>,
        provider: &mut dyn BufferProvider,
        digest: bool,
    ) -> Result<(Self, Option<String>)> {
        let cfg = Self::read_config(dir)?;
        if cfg.r == 0 || cfg.targets.is_empty() {
            return Err(NativeError::Input(
                "LoRA needs r > 0 and at least one target".into(),
            ));
        }
        let (layout, offs) = Self::layout(model, &cfg);
        let reuse = spare
            .as_ref()
            .is_some_and(|b| b.as_slice().len() == layout.total_len());
        let mut weights = match spare.take() {
            Some(b) if reuse => b,
            other => {
                *spare = other;
                provider.alloc(BufferTag::Weights, "weights/lora", layout.total_len())?
            }
        };
        let files = [dir.join("adapter_model.safetensors")];
        // PEFT may save keys with an adapter name (`.lora_A.default.weight`); accept both.
        let rename = |n: &str| {
            Some(
                n.replace(".lora_A.default.", ".lora_A.")
                    .replace(".lora_B.default.", ".lora_B."),
            )
        };
        let buf = weights.as_mut_slice();
        let loaded = if digest {
            st_io::load_into_digest(&files, &layout, buf, &rename).map(|(_, d)| Some(d))
        } else {
            st_io::load_into(&files, &layout, buf, &rename).map(|_| None)
        };
        match loaded {
            Ok(d) => Ok((
                LoraAdapter {
                    cfg,
                    layout,
                    offs,
                    weights,
                },
                d,
            )),
            Err(e) => {
                if reuse {
                    *spare = Some(weights);
                }
                Err(e)
            }
        }
    }

    /// Reads and checks a PEFT `adapter_config.json` in `dir`.
    pub fn read_config(dir: &Path) -> Result<LoraConfig> {
        let path = dir.join("adapter_config.json");
        let text = std::fs::read_to_string(&path).map_err(|e| NativeError::io(&path, e))?;
        let v: Value = serde_json::from_str(&text).map_err(|e| NativeError::Json {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let bad = |m: &str| NativeError::Json {
            path: path.clone(),
            message: m.to_string(),
        };
        if v.get("peft_type").and_then(Value::as_str) != Some("LORA") {
            return Err(bad("peft_type must be \"LORA\""));
        }
        if v.get("fan_in_fan_out").and_then(Value::as_bool) == Some(true) {
            return Err(bad("fan_in_fan_out = true is not supported"));
        }
        if v.get("use_rslora").and_then(Value::as_bool) == Some(true)
            || v.get("use_dora").and_then(Value::as_bool) == Some(true)
        {
            return Err(bad("rsLoRA / DoRA adapters are not supported"));
        }
        let r = v
            .get("r")
            .and_then(Value::as_u64)
            .ok_or_else(|| bad("missing integer `r`"))? as usize;
        let alpha = v
            .get("lora_alpha")
            .and_then(Value::as_f64)
            .ok_or_else(|| bad("missing number `lora_alpha`"))? as f32;
        let mods: Vec<String> = match v.get("target_modules") {
            Some(Value::Array(a)) => a
                .iter()
                .filter_map(|x| x.as_str().map(String::from))
                .collect(),
            Some(Value::String(s)) => vec![s.clone()],
            _ => return Err(bad("missing `target_modules` list")),
        };
        let mut targets = Vec::new();
        for m in &mods {
            let t = Target::from_module(m).ok_or_else(|| {
                bad(&format!(
                    "target module `{m}` is not a Llama projection name"
                ))
            })?;
            targets.push(t);
        }
        Ok(LoraConfig {
            r,
            alpha,
            targets,
            base_model: v
                .get("base_model_name_or_path")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string(),
        })
    }
}
