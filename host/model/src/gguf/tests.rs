//! Import of small GGUF files written here: the HF directory it gives, and every kind of bad
//! file refused with nothing written.

#![allow(clippy::unwrap_used)]

use super::*;
use half::f16;

/// A GGUF writer for tests: metadata and F32 / Q8_0 / Q4_1 tensors.
#[derive(Default)]
struct Writer {
    kv: Vec<u8>,
    kv_count: u64,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
}

fn string(out: &mut Vec<u8>, s: &str) {
    out.extend((s.len() as u64).to_le_bytes());
    out.extend(s.as_bytes());
}

impl Writer {
    fn key(&mut self, k: &str, ty: u32) {
        string(&mut self.kv, k);
        self.kv.extend(ty.to_le_bytes());
        self.kv_count += 1;
    }
    fn u32(&mut self, k: &str, v: u32) -> &mut Self {
        self.key(k, 4);
        self.kv.extend(v.to_le_bytes());
        self
    }
    fn f32(&mut self, k: &str, v: f32) -> &mut Self {
        self.key(k, 6);
        self.kv.extend(v.to_le_bytes());
        self
    }
    fn str(&mut self, k: &str, v: &str) -> &mut Self {
        self.key(k, 8);
        string(&mut self.kv, v);
        self
    }
    fn strs(&mut self, k: &str, v: &[String]) -> &mut Self {
        self.key(k, 9);
        self.kv.extend(8u32.to_le_bytes());
        self.kv.extend((v.len() as u64).to_le_bytes());
        for s in v {
            string(&mut self.kv, s);
        }
        self
    }
    fn i32s(&mut self, k: &str, v: &[i32]) -> &mut Self {
        self.key(k, 9);
        self.kv.extend(5u32.to_le_bytes());
        self.kv.extend((v.len() as u64).to_le_bytes());
        for x in v {
            self.kv.extend(x.to_le_bytes());
        }
        self
    }
    /// An HF-shaped tensor `[rows, cols]` (or `[n]`) of `values` stored as `ty`.
    fn tensor(&mut self, name: &str, shape: &[usize], values: &[f32], ty: GgmlType) {
        let bytes = match ty {
            GgmlType::F32 => values.iter().flat_map(|x| x.to_le_bytes()).collect(),
            GgmlType::Q8_0 => values
                .chunks(32)
                .flat_map(|b| {
                    let d = b.iter().fold(0f32, |m, x| m.max(x.abs())) / 127.0;
                    let mut out = f16::from_f32(d).to_le_bytes().to_vec();
                    out.extend(b.iter().map(|x| (x / d).round() as i8 as u8));
                    out
                })
                .collect(),
            GgmlType::Q4_1 => values
                .chunks(32)
                .flat_map(|b| {
                    let (lo, hi) = b
                        .iter()
                        .fold((f32::MAX, f32::MIN), |(l, h), &x| (l.min(x), h.max(x)));
                    let d = (hi - lo) / 15.0;
                    let q = |x: f32| ((x - lo) / d).round().clamp(0.0, 15.0) as u8;
                    let mut out = f16::from_f32(d).to_le_bytes().to_vec();
                    out.extend(f16::from_f32(lo).to_le_bytes());
                    out.extend((0..16).map(|j| q(b[j]) | (q(b[j + 16]) << 4)));
                    out
                })
                .collect(),
            other => panic!("test writer: {other:?}"),
        };
        let dims = shape.iter().rev().map(|&d| d as u64).collect();
        let id = match ty {
            GgmlType::F32 => 0,
            GgmlType::Q8_0 => 8,
            _ => 3,
        };
        self.tensors.push((name.to_owned(), dims, id, bytes));
    }
    fn bytes(&self) -> Vec<u8> {
        let mut out = b"GGUF".to_vec();
        out.extend(3u32.to_le_bytes());
        out.extend((self.tensors.len() as u64).to_le_bytes());
        out.extend(self.kv_count.to_le_bytes());
        out.extend(&self.kv);
        let mut offset = 0u64;
        for (name, dims, ty, data) in &self.tensors {
            string(&mut out, name);
            out.extend((dims.len() as u32).to_le_bytes());
            for d in dims {
                out.extend(d.to_le_bytes());
            }
            out.extend(ty.to_le_bytes());
            out.extend(offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        out.resize(out.len().div_ceil(32) * 32, 0);
        for (_, _, _, data) in &self.tensors {
            out.extend(data);
            out.resize(out.len().div_ceil(32) * 32, 0);
        }
        out
    }
}

const HIDDEN: usize = 64;
const HEADS: usize = 2;
const KV: usize = 1;
const FF: usize = 96;
const SPECIALS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];

fn values(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (((i * 7 + seed * 13) % 29) as f32 - 14.0) / 20.0)
        .collect()
}

/// A one-layer llama with a byte-level vocabulary (3 specials, 256 bytes, 2 merges).
fn llama() -> (Writer, Vec<String>) {
    let alphabet = tokenizer_alphabet();
    let mut tokens: Vec<String> = SPECIALS.iter().map(|s| (*s).to_owned()).collect();
    tokens.extend(alphabet);
    tokens.push("he".into());
    tokens.push("hel".into());
    let vocab = tokens.len();
    let mut types = vec![3; SPECIALS.len()];
    types.resize(vocab, 1);
    let mut w = Writer::default();
    w.str("general.architecture", "llama")
        .u32("llama.block_count", 1)
        .u32("llama.context_length", 128)
        .u32("llama.embedding_length", HIDDEN as u32)
        .u32("llama.feed_forward_length", FF as u32)
        .u32("llama.attention.head_count", HEADS as u32)
        .u32("llama.attention.head_count_kv", KV as u32)
        .f32("llama.rope.freq_base", 10000.0)
        .f32("llama.attention.layer_norm_rms_epsilon", 1e-5)
        .str("tokenizer.ggml.model", "gpt2")
        .str("tokenizer.ggml.pre", "smollm")
        .strs("tokenizer.ggml.tokens", &tokens)
        .i32s("tokenizer.ggml.token_type", &types)
        .strs("tokenizer.ggml.merges", &["h e".into(), "he l".into()])
        .u32("tokenizer.ggml.bos_token_id", 1)
        .u32("tokenizer.ggml.eos_token_id", 2)
        .str("tokenizer.chat_template", "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}");
    let hd = HIDDEN / HEADS;
    w.tensor(
        "token_embd.weight",
        &[vocab, HIDDEN],
        &values(vocab * HIDDEN, 1),
        GgmlType::Q8_0,
    );
    w.tensor(
        "output_norm.weight",
        &[HIDDEN],
        &values(HIDDEN, 2),
        GgmlType::F32,
    );
    w.tensor(
        "blk.0.attn_norm.weight",
        &[HIDDEN],
        &values(HIDDEN, 3),
        GgmlType::F32,
    );
    w.tensor(
        "blk.0.ffn_norm.weight",
        &[HIDDEN],
        &values(HIDDEN, 4),
        GgmlType::F32,
    );
    w.tensor(
        "blk.0.attn_q.weight",
        &[HIDDEN, HIDDEN],
        &values(HIDDEN * HIDDEN, 5),
        GgmlType::Q4_1,
    );
    w.tensor(
        "blk.0.attn_k.weight",
        &[KV * hd, HIDDEN],
        &values(KV * hd * HIDDEN, 6),
        GgmlType::Q4_1,
    );
    w.tensor(
        "blk.0.attn_v.weight",
        &[KV * hd, HIDDEN],
        &values(KV * hd * HIDDEN, 7),
        GgmlType::Q4_1,
    );
    w.tensor(
        "blk.0.attn_output.weight",
        &[HIDDEN, HIDDEN],
        &values(HIDDEN * HIDDEN, 8),
        GgmlType::Q4_1,
    );
    w.tensor(
        "blk.0.ffn_gate.weight",
        &[FF, HIDDEN],
        &values(FF * HIDDEN, 9),
        GgmlType::Q4_1,
    );
    w.tensor(
        "blk.0.ffn_up.weight",
        &[FF, HIDDEN],
        &values(FF * HIDDEN, 10),
        GgmlType::Q4_1,
    );
    w.tensor(
        "blk.0.ffn_down.weight",
        &[HIDDEN, FF],
        &values(FF * HIDDEN, 11),
        GgmlType::Q4_1,
    );
    (w, tokens)
}

fn tokenizer_alphabet() -> Vec<String> {
    let mut bytes: Vec<char> = tokenizer::byte_alphabet_for_tests();
    bytes.sort_unstable();
    bytes.into_iter().map(String::from).collect()
}

fn import_bytes(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf, Result<ImportSummary>) {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    std::fs::write(&src, bytes).unwrap();
    let out = dir.path().join("out");
    let r = import(&src, &out);
    (dir, out, r)
}

#[test]
fn imports_a_llama_file() {
    let (w, _) = llama();
    let (_d, out, r) = import_bytes(&w.bytes());
    let s = r.unwrap();
    assert_eq!(s.hparams.layers, 1);
    assert!(s.hparams.tied && s.chat_template);
    assert_eq!(s.types.get("Q4_1"), Some(&7));
    for f in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
    ] {
        assert!(out.join(f).is_file(), "{f} missing");
    }
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["num_key_value_heads"], 1);
    assert_eq!(cfg["tie_word_embeddings"], true);
    assert_eq!(cfg["rms_norm_eps"], 1e-5);
    assert_eq!(cfg["eos_token_id"], 2);
    let bytes = std::fs::read(out.join("model.safetensors")).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    assert_eq!(st.len(), 11);
    let norm = st.tensor("model.layers.0.input_layernorm.weight").unwrap();
    let norm: Vec<f32> = norm
        .data()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    assert_eq!(norm, values(HIDDEN, 3), "F32 tensors are copied exactly");
    assert_eq!(
        st.tensor("model.layers.0.self_attn.q_proj.weight")
            .unwrap()
            .shape(),
        [HIDDEN, HIDDEN]
    );
    assert!(st.tensor("lm_head.weight").is_err(), "tied: no lm_head");
    let tk = tokenizers::Tokenizer::from_file(out.join("tokenizer.json")).unwrap();
    let ids = tk.encode("<|im_start|>hello<|im_end|>", false).unwrap();
    assert_eq!(ids.get_ids()[0], 1);
    assert_eq!(*ids.get_ids().last().unwrap(), 2);
    assert_eq!(ids.get_tokens()[1], "hel", "merges applied");
    assert_eq!(tk.decode(ids.get_ids(), true).unwrap(), "hello");
}

/// `import` of a broken file: the error's text, and nothing at `--out`.
fn refused(bytes: &[u8]) -> String {
    let (d, out, r) = import_bytes(bytes);
    let e = r.expect_err("import should fail").to_string();
    assert!(!out.exists(), "nothing written at --out for: {e}");
    let leftovers: Vec<_> = std::fs::read_dir(d.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(
        leftovers,
        vec![std::ffi::OsString::from("m.gguf")],
        "no temporary left: {e}"
    );
    assert!(!e.contains('\n'), "one line: {e}");
    e
}

#[test]
fn refuses_bad_files_writing_nothing() {
    assert!(refused(b"PK\x03\x04 not a gguf").contains("not a GGUF file"));
    let good = llama().0.bytes();
    let cut = refused(&good[..good.len() - 100]);
    assert!(cut.contains("truncated"), "{cut}");
    assert!(refused(&good[..40]).contains("file ends inside"));
    let mut v2 = good.clone();
    v2[4] = 2;
    assert!(refused(&v2).contains("version 2"));

    let (mut w, _) = llama();
    w.kv.clear();
    w.kv_count = 0;
    w.str("general.architecture", "mamba");
    assert!(refused(&w.bytes()).contains("architecture `mamba` is not supported"));

    let (mut w, _) = llama();
    w.tensors.retain(|t| t.0 != "blk.0.ffn_up.weight");
    let e = refused(&w.bytes());
    assert!(e.contains("`blk.0.ffn_up.weight` is missing"), "{e}");

    let (mut w, _) = llama();
    w.tensor(
        "blk.1.attn_q.weight",
        &[HIDDEN, HIDDEN],
        &values(HIDDEN * HIDDEN, 5),
        GgmlType::Q4_1,
    );
    assert!(refused(&w.bytes()).contains("unexpected tensor `blk.1.attn_q.weight`"));

    let (mut w, _) = llama();
    w.tensors[4].1 = vec![HIDDEN as u64, 32];
    let half = w.tensors[4].3.len() / 2;
    w.tensors[4].3.truncate(half);
    assert!(refused(&w.bytes()).contains("has shape [32, 64]"));

    let (mut w, _) = llama();
    w.tensors[4].2 = 12;
    let e = refused(&w.bytes());
    assert!(e.contains("type Q4_K"), "{e}");
}

#[test]
fn refuses_a_non_empty_output() {
    let (w, _) = llama();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("m.gguf");
    std::fs::write(&src, w.bytes()).unwrap();
    let out = dir.path().join("out");
    std::fs::create_dir(&out).unwrap();
    std::fs::write(out.join("keep.txt"), "mine").unwrap();
    let e = import(&src, &out).unwrap_err();
    assert!(e.to_string().contains("not empty"), "{e}");
    assert_eq!(
        std::fs::read_to_string(out.join("keep.txt")).unwrap(),
        "mine"
    );
}
