//! Text ↔ token ids on the controller side: prompts get the model's BOS, completions end
//! with its EOS, and decoded completions drop special tokens.

use crate::error::HostError;
use std::path::Path;
use tandem_plugin_native::config::ModelConfig;
use tandem_plugin_native::tokenizer;
use tokenizers::Tokenizer;

/// The model's tokenizer plus its BOS / EOS ids.
pub struct PromptCodec {
    tk: Tokenizer,
    bos: Option<u32>,
    eos: Vec<u32>,
}

impl PromptCodec {
    /// Loads `config.json` and `tokenizer.json` of a Hugging Face model directory.
    pub fn load(model: &Path) -> Result<PromptCodec, HostError> {
        let cfg = ModelConfig::from_dir(model)
            .map_err(|e| HostError::Usage(format!("model {}: {e}", model.display())))?;
        let tk = tokenizer::load(model).map_err(|e| {
            HostError::Usage(format!(
                "model {}: {e} (help: the controller needs the model's tokenizer.json)",
                model.display()
            ))
        })?;
        Ok(PromptCodec {
            tk,
            bos: cfg.bos_token_id,
            eos: cfg.eos_token_ids.clone(),
        })
    }

    /// Token ids of a prompt: BOS (when the model has one), then the text.
    pub fn prompt(&self, text: &str) -> Result<Vec<u32>, HostError> {
        let mut ids: Vec<u32> = self.bos.into_iter().collect();
        ids.extend(self.encode(text)?);
        Ok(ids)
    }

    /// Token ids of a supervised completion: the text, then EOS.
    pub fn completion(&self, text: &str) -> Result<Vec<u32>, HostError> {
        let mut ids = self.encode(text)?;
        ids.extend(self.eos.first().copied());
        Ok(ids)
    }

    /// Stop tokens of generation.
    pub fn stop_ids(&self) -> &[u32] {
        &self.eos
    }

    /// Decoded text of completion ids (special tokens skipped).
    pub fn decode(&self, ids: &[u32]) -> Result<String, HostError> {
        tokenizer::decode(&self.tk, ids)
            .map_err(|e| HostError::Runtime(format!("decoding a completion: {e}")))
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, HostError> {
        tokenizer::encode(&self.tk, text)
            .map_err(|e| HostError::Runtime(format!("encoding {text:?}: {e}")))
    }
}
