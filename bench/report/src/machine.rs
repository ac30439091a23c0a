//! The machine's own limits, for benchmarks whose peer is absent: single-thread memcpy
//! bandwidth and the f32 GEMM rate on the rayon pool — the bounds `bench/native` measures
//! through the native core, measured here without it (`gemm` 0.19, the crate the core
//! multiplies with, at 512³), so a host crate can print them too.

use std::time::Instant;

/// Limits of this machine, measured by [`measure`].
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Machine {
    /// Single-thread `copy_from_slice` bandwidth, bytes copied per second (best of 3 × 256 MiB).
    pub memcpy_bytes_per_s: f64,
    /// f32 GEMM rate at 512×512×512 on the rayon pool, FLOP/s (best of 5).
    pub gemm_flops: f64,
    /// Threads of the rayon pool (what the native core computes with).
    pub threads: usize,
}

/// Measures the [`Machine`] limits (about a second).
pub fn measure() -> Machine {
    let n = 64 << 20;
    let src = vec![1.0f32; n];
    let mut dst = vec![0.0f32; n];
    let mut copy = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&mut dst);
        copy = copy.min(t.elapsed().as_secs_f64());
    }
    drop((src, dst));
    let m = 512;
    let a = vec![0.5f32; m * m];
    let mut c = vec![0.0f32; m * m];
    let threads = rayon::current_num_threads();
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        square_gemm(&mut c, &a, m, threads);
        std::hint::black_box(&mut c);
        best = best.min(t.elapsed().as_secs_f64());
    }
    Machine {
        memcpy_bytes_per_s: (n * 4) as f64 / copy,
        gemm_flops: 2.0 * (m * m * m) as f64 / best,
        threads,
    }
}

/// `c = a · a` for row-major `m × m` matrices.
#[allow(unsafe_code)]
fn square_gemm(c: &mut [f32], a: &[f32], m: usize, threads: usize) {
    assert!(
        a.len() >= m * m && c.len() >= m * m,
        "square_gemm: buffers too small"
    );
    // SAFETY: both slices hold at least m·m elements (asserted), every (i, j) addressed with
    // row stride m and column stride 1 lies inside them, and `c` is a unique borrow that
    // cannot alias `a`.
    unsafe {
        gemm::gemm(
            m,
            m,
            m,
            c.as_mut_ptr(),
            1,
            m as isize,
            false,
            a.as_ptr(),
            1,
            m as isize,
            a.as_ptr(),
            1,
            m as isize,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(threads),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn square_gemm_multiplies() {
        // [[1, 2], [3, 4]]² = [[7, 10], [15, 22]]
        let mut c = vec![0.0; 4];
        square_gemm(&mut c, &[1.0, 2.0, 3.0, 4.0], 2, 1);
        assert_eq!(c, [7.0, 10.0, 15.0, 22.0]);
    }
}
