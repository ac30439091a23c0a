//! The tokenizer a GGUF file describes, as Hugging Face files: `tokenizer.json` (built with
//! the `tokenizers` crate from `tokenizer.ggml.tokens`/`merges`/`token_type`),
//! `tokenizer_config.json` + `chat_template.jinja` (special tokens, chat template) and
//! `special_tokens_map.json`.
//!
//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`) only; SentencePiece files (`llama`) are
//! refused. The pre-tokenizer follows `tokenizer.ggml.pre` as llama.cpp does: `smollm` splits
//! digits individually before the GPT-2 byte-level split (SmolLM's vocabulary has no
//! multi-digit token), `llama-bpe`/`llama3` and `qwen2` use their split regex, anything else
//! the GPT-2 one. Control tokens (type 3) become special added tokens, user-defined ones
//! (type 4) plain added tokens, so `<|im_start|>` in a chat-formatted text is one id.

use super::reader::{Gguf, Value};
use serde_json::json;
use std::collections::HashMap;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{BPE, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The tokenizer files of a model directory.
#[derive(Debug)]
pub struct TokenizerFiles {
    /// `tokenizer.json`.
    pub tokenizer: Tokenizer,
    /// `tokenizer_config.json`.
    pub config: serde_json::Value,
    /// `special_tokens_map.json`.
    pub special_map: serde_json::Value,
    /// `chat_template.jinja`, when the file has a template.
    pub chat_template: Option<String>,
    /// BOS, EOS and padding ids.
    pub bos: Option<u32>,
    /// End of sequence.
    pub eos: Option<u32>,
    /// Padding.
    pub pad: Option<u32>,
}

fn strings<'a>(g: &'a Gguf, key: &str) -> Result<Vec<&'a str>, String> {
    let a = g
        .meta
        .get(key)
        .and_then(Value::as_array)
        .ok_or(format!("metadata `{key}` is missing or not an array"))?;
    a.iter()
        .map(|v| {
            v.as_str()
                .ok_or(format!("metadata `{key}` holds a non-string"))
        })
        .collect()
}

fn id(g: &Gguf, key: &str, vocab: usize) -> Result<Option<u32>, String> {
    match g.meta.get(key) {
        None => Ok(None),
        Some(v) => match v.as_u64() {
            Some(i) if (i as usize) < vocab => Ok(Some(i as u32)),
            _ => Err(format!(
                "metadata `{key}` = {v:?} is not a token id below {vocab}"
            )),
        },
    }
}

/// GPT-2's byte → printable character map (the alphabet byte-level vocabularies are spelled in).
fn byte_alphabet() -> HashMap<u8, char> {
    let mut printable: Vec<u8> = (b'!'..=b'~').collect();
    printable.extend(0xA1u8..=0xAC);
    printable.extend(0xAEu8..=0xFF);
    let mut map: HashMap<u8, char> = printable.iter().map(|&b| (b, char::from(b))).collect();
    let mut next = 256u32;
    for b in 0..=255u8 {
        if let std::collections::hash_map::Entry::Vacant(e) = map.entry(b) {
            e.insert(char::from_u32(next).unwrap_or('?'));
            next += 1;
        }
    }
    map
}

/// The 256 characters of the byte alphabet (tests build vocabularies from them).
#[cfg(test)]
pub(super) fn byte_alphabet_for_tests() -> Vec<char> {
    byte_alphabet().into_values().collect()
}

fn pre_tokenizer(pre: &str) -> Result<PreTokenizerWrapper, String> {
    let byte_level = |regex: bool| ByteLevel::new(false, true, regex).into();
    let split = |re: &str| -> Result<PreTokenizerWrapper, String> {
        let s = Split::new(
            SplitPattern::Regex(re.to_owned()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| format!("split regex for `{pre}`: {e}"))?;
        Ok(Sequence::new(vec![s.into(), byte_level(false)]).into())
    };
    match pre {
        "smollm" => Ok(Sequence::new(vec![Digits::new(true).into(), byte_level(true)]).into()),
        "llama-bpe" | "llama3" | "llama-v3" => split(LLAMA3_SPLIT),
        "qwen2" => split(QWEN2_SPLIT),
        _ => Ok(byte_level(true)),
    }
}

/// Builds the tokenizer files from the metadata of `g` (whose model has `vocab` rows).
pub fn build(g: &Gguf, vocab: usize) -> Result<TokenizerFiles, String> {
    let model = g.meta.get("tokenizer.ggml.model").and_then(Value::as_str);
    if model != Some("gpt2") {
        return Err(format!(
            "tokenizer model {model:?} is not supported (only byte-level BPE, `gpt2`)"
        ));
    }
    let tokens = strings(g, "tokenizer.ggml.tokens")?;
    if tokens.len() > vocab {
        return Err(format!(
            "the tokenizer has {} tokens but the model only {vocab} embedding rows",
            tokens.len()
        ));
    }
    let merges = strings(g, "tokenizer.ggml.merges")?;
    let types: Vec<u64> = match g.meta.get("tokenizer.ggml.token_type") {
        Some(v) => v
            .as_array()
            .ok_or("metadata `tokenizer.ggml.token_type` is not an array")?
            .iter()
            .map(|t| t.as_u64().unwrap_or(1))
            .collect(),
        None => vec![1; tokens.len()],
    };
    let alphabet = byte_alphabet();
    let spelled: std::collections::HashSet<char> = alphabet.values().copied().collect();
    let vocab_map: Vocab = tokens
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let text = if t.chars().all(|c| spelled.contains(&c)) {
                (*t).to_owned()
            } else {
                t.bytes().map(|b| alphabet[&b]).collect()
            };
            (text, i as u32)
        })
        .collect();
    let merges: Vec<(String, String)> = merges
        .iter()
        .map(|m| {
            m.split_once(' ')
                .map(|(a, b)| (a.to_owned(), b.to_owned()))
                .ok_or(format!(
                    "merge {m:?} is not two tokens separated by a space"
                ))
        })
        .collect::<Result<_, _>>()?;
    let bpe = BPE::builder()
        .vocab_and_merges(vocab_map, merges)
        .build()
        .map_err(|e| format!("building the BPE model: {e}"))?;
    let pre = g
        .meta
        .get("tokenizer.ggml.pre")
        .and_then(Value::as_str)
        .unwrap_or("default");
    let mut tk = Tokenizer::new(bpe);
    tk.with_pre_tokenizer(Some(pre_tokenizer(pre)?));
    tk.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())));
    let kind = |want: u64| -> Vec<String> {
        tokens
            .iter()
            .zip(&types)
            .filter(|(t, ty)| **ty == want && t.chars().all(|c| spelled.contains(&c)))
            .map(|(t, _)| (*t).to_owned())
            .collect()
    };
    let control = kind(3);
    let specials: Vec<AddedToken> = control
        .iter()
        .map(|t| AddedToken::from(t.clone(), true))
        .collect();
    tk.add_special_tokens(specials)
        .map_err(|e| format!("adding special tokens: {e}"))?;
    let user: Vec<AddedToken> = kind(4)
        .into_iter()
        .map(|t| AddedToken::from(t, false))
        .collect();
    tk.add_tokens(user)
        .map_err(|e| format!("adding user-defined tokens: {e}"))?;

    let n = tokens.len();
    let bos = id(g, "tokenizer.ggml.bos_token_id", n)?;
    let eos = id(g, "tokenizer.ggml.eos_token_id", n)?;
    let unk = id(g, "tokenizer.ggml.unknown_token_id", n)?;
    let pad = id(g, "tokenizer.ggml.padding_token_id", n)?;
    let text = |i: Option<u32>| i.map(|i| tokens[i as usize].to_owned());
    let flag = |key: &str| matches!(g.meta.get(key), Some(Value::Bool(true)));
    let chat_template = g
        .meta
        .get("tokenizer.chat_template")
        .and_then(Value::as_str)
        .map(str::to_owned);
    let max_len = g
        .meta
        .get("general.architecture")
        .and_then(Value::as_str)
        .and_then(|a| g.meta.get(&format!("{a}.context_length")))
        .and_then(Value::as_u64);
    let mut config = json!({
        "tokenizer_class": "PreTrainedTokenizerFast",
        "add_bos_token": flag("tokenizer.ggml.add_bos_token"),
        "add_eos_token": flag("tokenizer.ggml.add_eos_token"),
        "clean_up_tokenization_spaces": false,
        "bos_token": text(bos),
        "eos_token": text(eos),
        "unk_token": text(unk),
        "pad_token": text(pad),
        "model_max_length": max_len,
    });
    if let Some(t) = &chat_template {
        config["chat_template"] = json!(t);
    }
    let special_map = json!({
        "bos_token": text(bos),
        "eos_token": text(eos),
        "unk_token": text(unk),
        "pad_token": text(pad),
        "additional_special_tokens": control,
    });
    Ok(TokenizerFiles {
        tokenizer: tk,
        config,
        special_map,
        chat_template,
        bos,
        eos,
        pad,
    })
}
