//! Splits and order: the held-out rows taken from the training file by a fraction, the
//! held-out overlap check, and the per-epoch permutation of the training rows.

use super::rows::{Entry, prompt_key};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{RngCore, SeedableRng};
use std::collections::{HashMap, HashSet};
use tandem_plugin_api::PluginError;
use tandem_plugin_api::sdk::Result;

/// Seed offsets keeping the held-out choice and the epoch order independent streams.
const HELD_OUT_STREAM: u64 = 0x6865_6c64; // "held"
const EPOCH_SEED: u64 = 0x6570_6f63_6821; // "epoch!"

/// A uniform number below `n` (`n > 0`), without modulo bias.
fn below(rng: &mut ChaCha8Rng, n: u64) -> u64 {
    let zone = u64::MAX - u64::MAX % n;
    loop {
        let x = rng.next_u64();
        if x < zone {
            return x % n;
        }
    }
}

fn shuffled(n: usize, mut rng: ChaCha8Rng) -> Vec<u32> {
    // Row counts are bounded by `u32` at build time.
    let mut p: Vec<u32> = (0..n as u32).collect();
    for i in (1..n).rev() {
        let j = below(&mut rng, i as u64 + 1) as usize;
        p.swap(i, j);
    }
    p
}

/// The order of the training rows in epoch `epoch`: a permutation of `0..n` from
/// `(seed, epoch)`; the identity when not shuffling.
pub fn epoch_order(n: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<u32> {
    if !shuffle {
        return (0..n as u32).collect();
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed ^ EPOCH_SEED);
    rng.set_stream(epoch);
    shuffled(n, rng)
}

/// Splits `rows` into (train, held-out): `k` rows (`0 < k < n`) chosen from the seed are
/// held out; both keep the file's order.
pub fn split_off(rows: Vec<Entry>, k: usize, seed: u64) -> Result<(Vec<Entry>, Vec<Entry>)> {
    let n = rows.len();
    if k == 0 || k >= n {
        return Err(PluginError::invalid_input(format!(
            "cannot hold out {k} of the data's {n} rows and train on the rest"
        ))
        .with_help("hold out fewer rows (held_out_fraction, [eval] problems), add rows, or give a held_out file"));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    rng.set_stream(HELD_OUT_STREAM);
    let chosen: HashSet<u32> = shuffled(n, rng).into_iter().take(k).collect();
    let (mut train, mut held) = (Vec::with_capacity(n - k), Vec::with_capacity(k));
    for (i, e) in rows.into_iter().enumerate() {
        if chosen.contains(&(i as u32)) {
            held.push(e);
        } else {
            train.push(e);
        }
    }
    Ok((train, held))
}

fn shorten(s: &str) -> String {
    let mut out: String = s.chars().take(60).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out.replace('\n', " ")
}

/// Refuses a held-out split with a prompt that is also a training prompt, and duplicate ids
/// within a split.
/// `held_key` is what made the held-out split (`options.held_out`, `options.held_out_fraction`
/// or `held_out` for `[eval] problems`); the overlap error starts with it.
pub fn check(train: &[Entry], held_out: &[Entry], held_key: &str) -> Result<()> {
    for (name, split) in [("training", train), ("held-out", held_out)] {
        let mut seen = HashMap::with_capacity(split.len());
        for e in split {
            if let Some(_first) = seen.insert(e.item.id.as_str(), ()) {
                return Err(PluginError::invalid_input(format!(
                    "options.id: the {name} split has two rows with id `{}`",
                    e.item.id
                ))
                .with_help("make the id column unique, or drop options.id to number the rows"));
            }
        }
    }
    let prompts: HashSet<String> = train.iter().map(|e| prompt_key(&e.item)).collect();
    if let Some(e) = held_out
        .iter()
        .find(|e| prompts.contains(&prompt_key(&e.item)))
    {
        let shown = if e.item.messages.is_empty() {
            e.item.prompt.to_string()
        } else {
            e.item
                .messages
                .iter()
                .map(|m| m.content.as_str())
                .collect::<Vec<_>>()
                .join(" / ")
        };
        let help = if held_key == "options.held_out" {
            "remove the training rows whose prompts are in the held-out file"
        } else {
            "the data has duplicate prompts: remove the duplicates before holding a fraction out"
        };
        return Err(PluginError::invalid_input(format!(
            "{held_key}: the held-out split overlaps training: held-out row `{}` has the prompt \"{}\" of a training row",
            e.item.id,
            shorten(&shown)
        ))
        .with_help(help));
    }
    Ok(())
}
