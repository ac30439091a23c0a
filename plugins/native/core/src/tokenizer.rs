//! Tokenizer: train a small byte-level BPE locally (no hub) and save/load `tokenizer.json`
//! with the `tokenizers` crate.

use std::path::Path;

use tokenizers::models::bpe::{BPE, BpeTrainerBuilder};
use tokenizers::normalizers::NormalizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{AddedToken, Tokenizer, TokenizerBuilder};

use crate::error::{NativeError, Result};

/// Special tokens every locally trained tokenizer gets, in id order (0, 1, 2).
pub const SPECIAL_TOKENS: [&str; 3] = ["<|pad|>", "<|bos|>", "<|endoftext|>"];

fn tok_err(what: &str, e: impl std::fmt::Display) -> NativeError {
    NativeError::Tokenizer(format!("{what}: {e}"))
}

/// Trains a byte-level BPE with `vocab_size` entries (including the 256 byte symbols and
/// [`SPECIAL_TOKENS`]) on `texts`.
pub fn train_bpe(texts: &[String], vocab_size: usize) -> Result<Tokenizer> {
    if vocab_size < 256 + SPECIAL_TOKENS.len() {
        return Err(NativeError::Tokenizer(format!(
            "vocab_size {vocab_size} is too small for a byte-level BPE (needs >= {})",
            256 + SPECIAL_TOKENS.len()
        )));
    }
    let specials: Vec<AddedToken> = SPECIAL_TOKENS
        .iter()
        .map(|s| AddedToken::from(*s, true))
        .collect();
    let mut trainer = BpeTrainerBuilder::new()
        .show_progress(false)
        .vocab_size(vocab_size)
        .min_frequency(1)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut tk = TokenizerBuilder::<BPE, NormalizerWrapper, ByteLevel, ByteLevel, ByteLevel>::new()
        .with_model(BPE::default())
        .with_pre_tokenizer(Some(ByteLevel::default().add_prefix_space(false)))
        .with_decoder(Some(ByteLevel::default()))
        .with_post_processor(Some(ByteLevel::default().trim_offsets(false)))
        .build()
        .map_err(|e| tok_err("building the tokenizer", e))?;
    tk.train(&mut trainer, texts.iter().cloned())
        .map_err(|e| tok_err("training the BPE", e))?;
    Ok(Tokenizer::from(tk))
}

/// Writes `dir/tokenizer.json`.
pub fn save(tk: &Tokenizer, dir: &Path) -> Result<()> {
    let path = dir.join("tokenizer.json");
    tk.save(&path, false)
        .map_err(|e| tok_err(&format!("saving {}", path.display()), e))
}

/// Loads `dir/tokenizer.json`.
pub fn load(dir: &Path) -> Result<Tokenizer> {
    let path = dir.join("tokenizer.json");
    Tokenizer::from_file(&path).map_err(|e| tok_err(&format!("loading {}", path.display()), e))
}

/// Encodes text into ids (no special tokens added).
pub fn encode(tk: &Tokenizer, text: &str) -> Result<Vec<u32>> {
    Ok(tk
        .encode(text, false)
        .map_err(|e| tok_err("encoding", e))?
        .get_ids()
        .to_vec())
}

/// Decodes ids into text (special tokens skipped).
pub fn decode(tk: &Tokenizer, ids: &[u32]) -> Result<String> {
    tk.decode(ids, true).map_err(|e| tok_err("decoding", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trains_saves_loads_and_round_trips() {
        let texts: Vec<String> = (0..200)
            .map(|i| format!("{i} + {} = {}\nreverse 1234 -> 4321", i * 3, i * 4))
            .collect();
        let tk = train_bpe(&texts, 300).unwrap();
        assert!(tk.get_vocab_size(true) <= 300 && tk.get_vocab_size(true) > 259);
        assert_eq!(tk.token_to_id("<|endoftext|>"), Some(2));
        let dir = tempfile::tempdir().unwrap();
        save(&tk, dir.path()).unwrap();
        let back = load(dir.path()).unwrap();
        let s = "17 + 51 = 68 ünïcode";
        let ids = encode(&back, s).unwrap();
        assert!(ids.len() < s.len(), "merges should compress: {ids:?}");
        assert_eq!(decode(&back, &ids).unwrap(), s);
        assert!(load(&dir.path().join("nope")).is_err());
    }
}
