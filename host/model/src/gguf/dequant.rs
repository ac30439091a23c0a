//! GGML tensor types and their dequantization to f32: F32, F16, BF16, Q4_0, Q4_1 and Q8_0.
//!
//! Block formats (32 weights per block, little-endian, the scale `d` and minimum `m` as f16):
//! Q4_0 = `d, 16 bytes` with weight `j` = `(nibble_j − 8)·d`; Q4_1 = `d, m, 16 bytes` with
//! weight `j` = `nibble_j·d + m`; Q8_0 = `d, 32 × i8` with weight `j` = `q_j·d`. Nibble `j`
//! is the low half of byte `j` for `j < 16` and the high half of byte `j − 16` otherwise.
//! Written here (about ten lines a format) because `ggml-quants`' block structs need an
//! unsafe reinterpretation of the file's bytes, and this crate has no unsafe.

use half::{bf16, f16};

/// A GGML type this importer can dequantize.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GgmlType {
    /// 32-bit float.
    F32,
    /// 16-bit float.
    F16,
    /// bfloat16.
    Bf16,
    /// 4-bit, scale only.
    Q4_0,
    /// 4-bit, scale and minimum.
    Q4_1,
    /// 8-bit, scale only.
    Q8_0,
}

const BLOCK: usize = 32;

impl GgmlType {
    /// The type of a GGML type id, or `Err(name)` naming an unsupported one.
    pub fn from_id(id: u32) -> Result<GgmlType, String> {
        Ok(match id {
            0 => GgmlType::F32,
            1 => GgmlType::F16,
            30 => GgmlType::Bf16,
            2 => GgmlType::Q4_0,
            3 => GgmlType::Q4_1,
            8 => GgmlType::Q8_0,
            other => return Err(type_name(other)),
        })
    }

    /// The name GGML gives the type.
    pub fn name(self) -> &'static str {
        match self {
            GgmlType::F32 => "F32",
            GgmlType::F16 => "F16",
            GgmlType::Bf16 => "BF16",
            GgmlType::Q4_0 => "Q4_0",
            GgmlType::Q4_1 => "Q4_1",
            GgmlType::Q8_0 => "Q8_0",
        }
    }

    /// Weights per block and bytes per block.
    fn block(self) -> (usize, usize) {
        match self {
            GgmlType::F32 => (1, 4),
            GgmlType::F16 | GgmlType::Bf16 => (1, 2),
            GgmlType::Q4_0 => (BLOCK, 2 + BLOCK / 2),
            GgmlType::Q4_1 => (BLOCK, 4 + BLOCK / 2),
            GgmlType::Q8_0 => (BLOCK, 2 + BLOCK),
        }
    }

    /// Bytes of `elements` weights whose innermost dimension is `row`; `None` when `row` is
    /// not a whole number of blocks.
    pub fn bytes_for(self, row: u64, elements: u64) -> Option<u64> {
        let (per, size) = self.block();
        let per = per as u64;
        row.is_multiple_of(per)
            .then(|| elements / per * size as u64)
    }
}

/// GGML's name of a type id (for the error that refuses it).
fn type_name(id: u32) -> String {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    NAMES
        .get(id as usize)
        .map_or_else(|| format!("type id {id}"), |n| (*n).to_owned())
}

/// Dequantizes `bytes` (exactly the tensor's data) into `out` (its element count).
///
/// # Panics
/// Never for sizes from [`GgmlType::bytes_for`]; a mismatch is a caller bug and panics.
pub fn dequantize(ty: GgmlType, bytes: &[u8], out: &mut [f32]) {
    let (per, size) = ty.block();
    assert_eq!(
        bytes.len() / size * per,
        out.len(),
        "dequantize: size mismatch"
    );
    let blocks = bytes.chunks_exact(size).zip(out.chunks_exact_mut(per));
    let h = |b: &[u8], i: usize| f16::from_le_bytes([b[i], b[i + 1]]).to_f32();
    match ty {
        GgmlType::F32 => {
            for (b, o) in blocks {
                o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        GgmlType::F16 => {
            for (b, o) in blocks {
                o[0] = h(b, 0);
            }
        }
        GgmlType::Bf16 => {
            for (b, o) in blocks {
                o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32();
            }
        }
        GgmlType::Q4_0 => {
            for (b, o) in blocks {
                let d = h(b, 0);
                nibbles(&b[2..], o, |q| (f32::from(q) - 8.0) * d);
            }
        }
        GgmlType::Q4_1 => {
            for (b, o) in blocks {
                let (d, m) = (h(b, 0), h(b, 2));
                nibbles(&b[4..], o, |q| f32::from(q) * d + m);
            }
        }
        GgmlType::Q8_0 => {
            for (b, o) in blocks {
                let d = h(b, 0);
                for (x, &q) in o.iter_mut().zip(&b[2..]) {
                    *x = f32::from(q as i8) * d;
                }
            }
        }
    }
}

/// Weights of a 4-bit block: low nibbles first, then high nibbles.
fn nibbles(qs: &[u8], out: &mut [f32], f: impl Fn(u8) -> f32) {
    let (lo, hi) = out.split_at_mut(BLOCK / 2);
    for ((l, hh), &q) in lo.iter_mut().zip(hi.iter_mut()).zip(qs) {
        *l = f(q & 0x0f);
        *hh = f(q >> 4);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16b(x: f32) -> [u8; 2] {
        f16::from_f32(x).to_le_bytes()
    }

    #[test]
    fn q4_1_block_is_low_nibbles_then_high() {
        let mut b = Vec::new();
        b.extend(f16b(0.5));
        b.extend(f16b(-1.0));
        b.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q4_1, &b, &mut out);
        for j in 0..16 {
            assert_eq!(out[j], j as f32 * 0.5 - 1.0);
            assert_eq!(out[16 + j], (15 - j) as f32 * 0.5 - 1.0);
        }
    }

    #[test]
    fn q4_0_and_q8_0_are_signed() {
        let mut b = Vec::new();
        b.extend(f16b(2.0));
        b.extend([0x80u8; 16]);
        let mut out = [0f32; 32];
        dequantize(GgmlType::Q4_0, &b, &mut out);
        assert!(out[..16].iter().all(|&x| x == -16.0));
        assert!(out[16..].iter().all(|&x| x == 0.0));
        let mut b = Vec::new();
        b.extend(f16b(0.25));
        b.extend((0..32).map(|j| (j as i8 - 16) as u8));
        dequantize(GgmlType::Q8_0, &b, &mut out);
        assert_eq!(out[0], -4.0);
        assert_eq!(out[31], 3.75);
    }

    #[test]
    fn sizes_and_names() {
        assert_eq!(GgmlType::Q4_1.bytes_for(576, 576 * 2), Some(36 * 20));
        assert_eq!(GgmlType::Q8_0.bytes_for(30, 30), None);
        assert_eq!(GgmlType::from_id(12), Err("Q4_K".to_owned()));
        assert_eq!(GgmlType::from_id(99), Err("type id 99".to_owned()));
    }
}
