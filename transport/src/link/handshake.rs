//! The hello a connecting rank sends on a fresh tcp or unix socket: its rank and the run's
//! token, so the acceptor knows who connected and rejects strays.

use crate::error::{Result, TransportError};
use std::io::{Read, Write};

const HELLO_MAGIC: u32 = 0x544e_4448; // "TNDH"

/// Encodes a hello for `rank` with the run's `token`.
pub(crate) fn hello(rank: usize, token: &str) -> Vec<u8> {
    let mut b = Vec::with_capacity(12 + token.len());
    b.extend_from_slice(&HELLO_MAGIC.to_le_bytes());
    b.extend_from_slice(&(rank as u32).to_le_bytes());
    b.extend_from_slice(&(token.len() as u32).to_le_bytes());
    b.extend_from_slice(token.as_bytes());
    b
}

/// Writes a hello.
pub(crate) fn send_hello(s: &mut impl Write, rank: usize, token: &str) -> Result<()> {
    s.write_all(&hello(rank, token))
        .map_err(|e| TransportError::io("sending the link hello", e))
}

/// Reads a hello (the socket must have a read timeout set) and checks the token; returns the
/// peer's rank.
pub(crate) fn read_hello(s: &mut impl Read, token: &str, from: &str) -> Result<usize> {
    let bad = |msg: String| TransportError::Protocol {
        peer: from.to_string(),
        msg,
    };
    let mut head = [0u8; 12];
    s.read_exact(&mut head)
        .map_err(|e| bad(format!("no hello received: {e}")))?;
    let word = |i: usize| u32::from_le_bytes([head[i], head[i + 1], head[i + 2], head[i + 3]]);
    if word(0) != HELLO_MAGIC {
        return Err(bad("not a tandem transport hello".into()));
    }
    let n = word(8) as usize;
    if n > 4096 {
        return Err(bad("hello token too long".into()));
    }
    let mut t = vec![0u8; n];
    s.read_exact(&mut t)
        .map_err(|e| bad(format!("truncated hello: {e}")))?;
    let ok = t.len() == token.len()
        && t.iter()
            .zip(token.as_bytes())
            .fold(0u8, |a, (x, y)| a | (x ^ y))
            == 0;
    if !ok {
        return Err(bad(
            "wrong run token (a stray peer from another run?)".into()
        ));
    }
    Ok(word(4) as usize)
}
