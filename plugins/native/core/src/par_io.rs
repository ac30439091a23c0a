//! Positional file I/O of large byte runs split over the rayon pool: each piece is one
//! `pwrite`/`pread` at its own offset, so the kernel's page-cache copies (and their per-page
//! work) run on every core instead of one. Used for the data sections of weight and adapter
//! files, where a sync or a checkpoint reload is bounded by that copy. Runs under
//! [`PAR_MIN`] are one call on the calling thread (a split costs more than it saves).

use std::fs::File;
use std::os::unix::fs::FileExt;

use rayon::prelude::*;

/// Smallest run split into pieces.
pub const PAR_MIN: usize = 8 << 20;

/// Piece size: at least 4 MiB, and one piece per pool thread for runs up to that many.
fn piece(len: usize) -> usize {
    let threads = rayon::current_num_threads().max(1);
    len.div_ceil(threads).max(4 << 20)
}

/// Writes all of `bytes` at byte `at` of `f`.
pub fn write_all_at(f: &File, at: u64, bytes: &[u8]) -> std::io::Result<()> {
    if bytes.len() < PAR_MIN {
        return f.write_all_at(bytes, at);
    }
    let p = piece(bytes.len());
    bytes
        .par_chunks(p)
        .enumerate()
        .try_for_each(|(i, c)| f.write_all_at(c, at + (i * p) as u64))
}

/// Fills `out` from byte `at` of `f` (an error if the file ends first).
pub fn read_exact_at(f: &File, at: u64, out: &mut [u8]) -> std::io::Result<()> {
    if out.len() < PAR_MIN {
        return f.read_exact_at(out, at);
    }
    let p = piece(out.len());
    out.par_chunks_mut(p)
        .enumerate()
        .try_for_each(|(i, c)| f.read_exact_at(c, at + (i * p) as u64))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn large_runs_round_trip_at_an_offset_and_short_files_fail() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.bin");
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .unwrap();
        let n = PAR_MIN * 2 + 12_345;
        let data: Vec<u8> = (0..n).map(|i| (i * 31 % 251) as u8).collect();
        f.write_all_at(b"head", 0).unwrap();
        write_all_at(&f, 4, &data).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 4 + n as u64);
        let mut back = vec![0u8; n];
        read_exact_at(&f, 4, &mut back).unwrap();
        assert!(back == data);
        let mut head = [0u8; 4];
        f.read_exact_at(&mut head, 0).unwrap();
        assert_eq!(&head, b"head");
        // One byte more than the file holds: an error, not a short read.
        let mut over = vec![0u8; n + 1];
        assert!(read_exact_at(&f, 4, &mut over).is_err());
        let mut small = vec![0u8; 10];
        read_exact_at(&f, 4, &mut small).unwrap();
        assert_eq!(small, data[..10]);
    }
}
