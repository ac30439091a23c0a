//! The weight digest both sides of a weight update compute the same way: the trainer over
//! the weights it exports, the engine over the weights it then serves (for `ipc` over the
//! mapped memory itself, for adapters over the loaded adapter tensors).
//!
//! Format `w64:<elements>:<16 hex digits>`. The hash reads the f32 bit patterns as 64-bit
//! words in four independent lanes (multiply–rotate, a few GB/s on one core) per block of
//! 2^20 elements (blocks in parallel), then folds the blocks in order with the length. It
//! detects any changed, missing or reordered element; it is not a cryptographic hash
//! (nothing here is adversarial). [`digest_writing`], [`digest_reading`] and
//! [`digest_streaming`] compute the same digest inside the pass that writes or reads the
//! data, block by block.

use rayon::prelude::*;

const K: [u64; 4] = [
    0x9E37_79B9_7F4A_7C15,
    0xC2B2_AE3D_27D4_EB4F,
    0x1656_67B1_9E37_79F9,
    0x85EB_CA77_C2B2_AE63,
];

fn mix(h: u64, x: u64, k: u64) -> u64 {
    (h ^ x).wrapping_mul(k).rotate_left(29)
}

fn word(a: f32, b: f32) -> u64 {
    u64::from(a.to_bits()) | (u64::from(b.to_bits()) << 32)
}

/// Elements hashed per block; blocks are hashed in parallel and folded in order, so the
/// digest does not depend on the thread count.
const BLOCK: usize = 1 << 20;

fn block_hash(data: &[f32]) -> u64 {
    let mut lanes = K;
    let chunks = data.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        lanes[0] = mix(lanes[0], word(c[0], c[1]), K[0]);
        lanes[1] = mix(lanes[1], word(c[2], c[3]), K[1]);
        lanes[2] = mix(lanes[2], word(c[4], c[5]), K[2]);
        lanes[3] = mix(lanes[3], word(c[6], c[7]), K[3]);
    }
    let mut h = data.len() as u64;
    for (i, l) in lanes.iter().enumerate() {
        h = mix(h, *l, K[i]);
    }
    for x in tail {
        h = mix(h, u64::from(x.to_bits()), K[0]);
    }
    h
}

/// The digest of `data` (see the module doc).
pub fn digest(data: &[f32]) -> String {
    let blocks: Vec<u64> = data.par_chunks(BLOCK).map(block_hash).collect();
    fold(data.len(), &blocks)
}

/// The digest of `len` elements from their block hashes, in order.
fn fold(len: usize, blocks: &[u64]) -> String {
    let mut h = len as u64;
    for (i, b) in blocks.iter().enumerate() {
        h = mix(h, *b, K[i % 4]);
    }
    // Final avalanche.
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    format!("w64:{len}:{h:016x}")
}

// The three functions below fuse the digest into the I/O pass that moves the data anyway:
// each block (4 MiB) is hashed while it is in the cache, right after it was read or before it
// is written, instead of a second pass over memory (a 26 MB adapter sync makes two such passes
// on each side). Their results equal `digest` of the same data.

/// Writes `data` block by block with `write(first element, block)` and returns its digest;
/// each block is hashed just before it is written. Blocks run in parallel.
pub fn digest_writing<F>(data: &[f32], write: F) -> std::io::Result<String>
where
    F: Fn(usize, &[f32]) -> std::io::Result<()> + Sync,
{
    let blocks = data
        .par_chunks(BLOCK)
        .enumerate()
        .map(|(i, c)| {
            let h = block_hash(c);
            write(i * BLOCK, c).map(|()| h)
        })
        .collect::<std::io::Result<Vec<u64>>>()?;
    Ok(fold(data.len(), &blocks))
}

/// Fills `buf` block by block with `read(first element, block)` and returns the digest of
/// what was read; each block is hashed right after it is filled. Blocks run in parallel.
pub fn digest_reading<F>(buf: &mut [f32], read: F) -> std::io::Result<String>
where
    F: Fn(usize, &mut [f32]) -> std::io::Result<()> + Sync,
{
    let len = buf.len();
    let blocks = buf
        .par_chunks_mut(BLOCK)
        .enumerate()
        .map(|(i, c)| {
            read(i * BLOCK, c)?;
            Ok(block_hash(c))
        })
        .collect::<std::io::Result<Vec<u64>>>()?;
    Ok(fold(len, &blocks))
}

thread_local! {
    /// One block of scratch per thread for [`digest_streaming`], kept between calls: a fresh
    /// 4 MiB buffer per block costs page faults on new memory (slow in a VM, where the host
    /// backs each new page) and would cost more than reading the block.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// The digest of `len` elements read block by block with `read(first element, block)` into a
/// scratch block per thread (kept by each thread for the next call): checks data (e.g. a
/// file) without a buffer of its size.
pub fn digest_streaming<F>(len: usize, read: F) -> std::io::Result<String>
where
    F: Fn(usize, &mut [f32]) -> std::io::Result<()> + Sync,
{
    let blocks = (0..len.div_ceil(BLOCK))
        .into_par_iter()
        .map(|i| {
            let n = BLOCK.min(len - i * BLOCK);
            SCRATCH.with_borrow_mut(|scratch| {
                if scratch.len() < n {
                    scratch.resize(n, 0.0);
                }
                read(i * BLOCK, &mut scratch[..n])?;
                Ok(block_hash(&scratch[..n]))
            })
        })
        .collect::<std::io::Result<Vec<u64>>>()?;
    Ok(fold(len, &blocks))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::digest;

    #[test]
    fn digest_sees_every_element_and_its_position() {
        let a: Vec<f32> = (0..1003).map(|i| i as f32 * 0.5).collect();
        let d = digest(&a);
        assert_eq!(d, digest(&a.clone()));
        assert!(d.starts_with("w64:1003:"), "{d}");
        for i in [0, 7, 8, 500, 1000, 1002] {
            let mut b = a.clone();
            b[i] = f32::from_bits(b[i].to_bits() ^ 1);
            assert_ne!(digest(&b), d, "flip at {i}");
        }
        let mut s = a.clone();
        s.swap(10, 11);
        assert_ne!(digest(&s), d);
        assert_ne!(digest(&a[..1002]), d);
        assert_ne!(digest(&[]), digest(&[0.0]));
    }

    #[test]
    fn blocks_are_folded_in_order() {
        let n = 2 * super::BLOCK + 5;
        let a: Vec<f32> = (0..n).map(|i| (i % 977) as f32).collect();
        let d = digest(&a);
        let mut b = a.clone();
        b[super::BLOCK + 3] += 1.0;
        assert_ne!(digest(&b), d);
        // Swapping two whole blocks changes the digest.
        let mut c = a[super::BLOCK..2 * super::BLOCK].to_vec();
        c.extend_from_slice(&a[..super::BLOCK]);
        c.extend_from_slice(&a[2 * super::BLOCK..]);
        assert_ne!(digest(&c), d);
    }

    #[test]
    fn fused_digests_equal_the_plain_one() {
        use super::{digest_reading, digest_streaming, digest_writing};
        use std::sync::Mutex;
        for n in [0, 5, super::BLOCK, 2 * super::BLOCK + 7] {
            let a: Vec<f32> = (0..n).map(|i| (i % 1013) as f32 * 0.25).collect();
            let d = digest(&a);
            let written = Mutex::new(vec![0f32; n]);
            let w = digest_writing(&a, |at, c| {
                written.lock().unwrap()[at..at + c.len()].copy_from_slice(c);
                Ok(())
            });
            assert_eq!(w.unwrap(), d);
            assert!(written.into_inner().unwrap() == a);
            let mut b = vec![0f32; n];
            let r = digest_reading(&mut b, |at, c| {
                c.copy_from_slice(&a[at..at + c.len()]);
                Ok(())
            });
            assert_eq!(r.unwrap(), d);
            assert!(b == a);
            let s = digest_streaming(n, |at, c| {
                c.copy_from_slice(&a[at..at + c.len()]);
                Ok(())
            });
            assert_eq!(s.unwrap(), d);
        }
        let fail = digest_streaming(10, |_, _| Err(std::io::Error::other("gone")));
        assert!(fail.is_err());
    }
}
