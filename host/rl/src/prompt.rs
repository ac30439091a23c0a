//! Text ↔ token ids on the controller side: prompts get the model's BOS, completions end
//! with its EOS, and decoded completions drop special tokens.

use crate::error::RlError;
use std::path::Path;
use tokenizers::Tokenizer;

/// The model's tokenizer plus its BOS / EOS ids.
pub struct PromptCodec {
    tk: Tokenizer,
    bos: Option<u32>,
    eos: Vec<u32>,
}

impl PromptCodec {
    /// Loads `config.json` and `tokenizer.json` of a Hugging Face model directory.
    pub fn load(model: &Path) -> Result<PromptCodec, RlError> {
        let (bos, eos) = special_ids(model)?;
        let path = model.join("tokenizer.json");
        let tk = Tokenizer::from_file(&path).map_err(|e| {
            RlError::usage(format!(
                "model {}: loading {}: {e}",
                model.display(),
                path.display()
            ))
            .with_help("the controller needs the model's tokenizer.json")
        })?;
        Ok(PromptCodec { tk, bos, eos })
    }

    /// Token ids of a prompt: BOS (when the model has one), then the text.
    pub fn prompt(&self, text: &str) -> Result<Vec<u32>, RlError> {
        let mut ids: Vec<u32> = self.bos.into_iter().collect();
        ids.extend(self.encode(text)?);
        Ok(ids)
    }

    /// Token ids of a supervised completion: the text, then EOS.
    pub fn completion(&self, text: &str) -> Result<Vec<u32>, RlError> {
        let mut ids = self.encode(text)?;
        ids.extend(self.eos.first().copied());
        Ok(ids)
    }

    /// Stop tokens of generation.
    pub fn stop_ids(&self) -> &[u32] {
        &self.eos
    }

    /// Decoded text of completion ids (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String, RlError> {
        self.tk
            .decode(ids, true)
            .map_err(|e| RlError::failed(format!("decoding a completion: {e}")))
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, RlError> {
        self.tk
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| RlError::failed(format!("encoding {text:?}: {e}")))
    }
}

/// BOS and EOS ids from `config.json` (`eos_token_id` is one id or a list).
pub fn special_ids(model: &Path) -> Result<(Option<u32>, Vec<u32>), RlError> {
    let path = model.join("config.json");
    let bad = |e: String| {
        RlError::usage(format!(
            "model {}: {}: {e}",
            model.display(),
            path.display()
        ))
    };
    let text = std::fs::read_to_string(&path).map_err(|e| bad(e.to_string()))?;
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    if !v.is_object() {
        return Err(bad("not a JSON object".into()));
    }
    let ids = |key: &str| -> Vec<u32> {
        match v.get(key) {
            Some(serde_json::Value::Array(a)) => a
                .iter()
                .filter_map(serde_json::Value::as_u64)
                .filter_map(|x| u32::try_from(x).ok())
                .collect(),
            Some(n) => n
                .as_u64()
                .and_then(|x| u32::try_from(x).ok())
                .into_iter()
                .collect(),
            None => Vec::new(),
        }
    };
    Ok((ids("bos_token_id").first().copied(), ids("eos_token_id")))
}
