//! Wire format of the rendezvous store: length-prefixed frames holding an opcode and
//! length-prefixed byte fields. Small and dependency-free on purpose.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

/// Largest frame either side accepts (keys and values are addresses and ids, not tensors).
pub(crate) const MAX_FRAME: usize = 64 << 20;

/// Request opcodes.
pub(crate) mod op {
    pub const HELLO: u8 = 1;
    pub const SET: u8 = 2;
    pub const GET: u8 = 3;
    pub const WAIT: u8 = 4;
    pub const ADD: u8 = 5;
    pub const DELETE: u8 = 6;
}

/// Reply opcodes.
pub(crate) mod reply {
    pub const OK: u8 = 100;
    pub const VALUE: u8 = 101;
    pub const NOT_FOUND: u8 = 102;
    pub const MISSING: u8 = 103;
    pub const INT: u8 = 104;
    pub const ERR: u8 = 105;
}

/// Builds one frame.
#[derive(Default)]
pub(crate) struct Encoder {
    buf: Vec<u8>,
}

impl Encoder {
    pub(crate) fn new(code: u8) -> Self {
        let mut buf = vec![0u8; 4];
        buf.push(code);
        Encoder { buf }
    }
    pub(crate) fn bytes(mut self, b: &[u8]) -> Self {
        self.buf.extend_from_slice(&(b.len() as u32).to_le_bytes());
        self.buf.extend_from_slice(b);
        self
    }
    pub(crate) fn u64(mut self, v: u64) -> Self {
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub(crate) fn finish(mut self) -> Vec<u8> {
        let n = (self.buf.len() - 4) as u32;
        self.buf[..4].copy_from_slice(&n.to_le_bytes());
        self.buf
    }
}

/// Reads the fields of one frame in order.
pub(crate) struct Decoder<'a> {
    rest: &'a [u8],
}

impl<'a> Decoder<'a> {
    /// Splits off the opcode.
    pub(crate) fn new(frame: &'a [u8]) -> Option<(u8, Self)> {
        let (&code, rest) = frame.split_first()?;
        Some((code, Decoder { rest }))
    }
    pub(crate) fn bytes(&mut self) -> Option<&'a [u8]> {
        let n = u32::from_le_bytes(self.rest.get(..4)?.try_into().ok()?) as usize;
        let b = self.rest.get(4..4 + n)?;
        self.rest = &self.rest[4 + n..];
        Some(b)
    }
    pub(crate) fn string(&mut self) -> Option<String> {
        String::from_utf8(self.bytes()?.to_vec()).ok()
    }
    pub(crate) fn u64(&mut self) -> Option<u64> {
        let v = u64::from_le_bytes(self.rest.get(..8)?.try_into().ok()?);
        self.rest = &self.rest[8..];
        Some(v)
    }
}

/// Reads one frame. `idle` is called on every read timeout before the first byte; returning
/// true aborts with `ErrorKind::Interrupted` (used by the server to notice shutdown).
pub(crate) fn read_frame(
    s: &mut impl Read,
    deadline: Option<Instant>,
    idle: &dyn Fn() -> bool,
) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    read_full(s, &mut len, deadline, idle)?;
    let n = u32::from_le_bytes(len) as usize;
    if n == 0 || n > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("frame length {n} out of range"),
        ));
    }
    let mut buf = vec![0u8; n];
    read_full(s, &mut buf, deadline, &|| false)?;
    Ok(buf)
}

fn read_full(
    s: &mut impl Read,
    mut buf: &mut [u8],
    deadline: Option<Instant>,
    idle: &dyn Fn() -> bool,
) -> io::Result<()> {
    let mut started = false;
    while !buf.is_empty() {
        match s.read(buf) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => {
                started = true;
                buf = &mut buf[n..];
            }
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
                ) =>
            {
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    return Err(io::ErrorKind::TimedOut.into());
                }
                if !started && idle() {
                    return Err(io::ErrorKind::Interrupted.into());
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes one frame.
pub(crate) fn write_frame(s: &mut impl Write, frame: &[u8]) -> io::Result<()> {
    s.write_all(frame)?;
    s.flush()
}

/// Compares two tokens without an early exit on the first differing byte.
pub(crate) fn token_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Converts a duration to whole milliseconds for the wire, saturating.
pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
