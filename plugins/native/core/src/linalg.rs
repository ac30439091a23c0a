//! Matrix products over f32 slices, via the `gemm` crate (multi-threaded with rayon).
//!
//! Chosen over `matrixmultiply` (threading feature) by a quick measurement on this 2-core
//! machine: equal at large shapes (~65-70 GF/s), but `gemm` is ~10x faster for the
//! matrix-vector shapes of batch-1 decode (21 vs 2 GF/s at 1x256x256).
//!
//! Invariant: every wrapper checks that the strided extents fit in the slices it was given
//! (an `assert!`, a programmer error, never user input) before the one unsafe call.

use gemm::Parallelism;
use rayon::prelude::*;

/// Work (m*n*k) above which a product is split across threads.
const PAR_THRESHOLD: usize = 1 << 21;

fn parallelism(m: usize, n: usize, k: usize) -> Parallelism {
    // Inside a rayon worker (e.g. attention parallelised over heads) stay single-threaded.
    if m * n * k < PAR_THRESHOLD || rayon::current_thread_index().is_some() {
        Parallelism::None
    } else {
        Parallelism::Rayon(rayon::current_num_threads())
    }
}

/// A strided read-only matrix view: element (i, j) is `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub struct Mat<'a> {
    /// Backing slice.
    pub data: &'a [f32],
    /// Row stride.
    pub rs: usize,
    /// Column stride.
    pub cs: usize,
}

impl<'a> Mat<'a> {
    /// Row-major `[rows, cols]` matrix.
    pub fn rm(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            rs: cols,
            cs: 1,
        }
    }
    /// The transpose of a row-major `[rows, cols]` matrix (so a `[cols, rows]` view).
    pub fn rm_t(data: &'a [f32], cols: usize) -> Self {
        Mat {
            data,
            rs: 1,
            cs: cols,
        }
    }
}

fn fits(len: usize, rows: usize, cols: usize, rs: usize, cs: usize) -> bool {
    rows == 0 || cols == 0 || (rows - 1) * rs + (cols - 1) * cs < len
}

/// `dst[m, n] = (accumulate ? dst : 0) + alpha * lhs[m, k] * rhs[k, n]`, `dst` row-major with
/// row stride `dst_rs`.
#[allow(clippy::too_many_arguments)]
pub fn gemm_into(
    dst: &mut [f32],
    dst_rs: usize,
    m: usize,
    n: usize,
    k: usize,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    alpha: f32,
    accumulate: bool,
) {
    gemm_strided(dst, (dst_rs, 1), m, n, k, lhs, rhs, alpha, accumulate);
}

/// `dst[n, m] = (accumulate ? dst : 0) + alpha * (lhs[m, k] * rhs[k, n])ᵀ`, `dst` row-major
/// with row stride `dst_rs`: the product written transposed. For a thin result (`n` small,
/// e.g. a LoRA A gradient `tmpᵀ·x` computed as `(xᵀ·tmp)ᵀ`), the GEMM's blocking then runs
/// along the long side.
#[allow(clippy::too_many_arguments)]
pub fn gemm_into_t(
    dst: &mut [f32],
    dst_rs: usize,
    m: usize,
    n: usize,
    k: usize,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    alpha: f32,
    accumulate: bool,
) {
    gemm_strided(dst, (1, dst_rs), m, n, k, lhs, rhs, alpha, accumulate);
}

/// The product into `dst` with element (i, j) at `i * rs + j * cs`, `(rs, cs)` = `strides`.
#[allow(clippy::too_many_arguments)]
fn gemm_strided(
    dst: &mut [f32],
    (dst_rs, dst_cs): (usize, usize),
    m: usize,
    n: usize,
    k: usize,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    alpha: f32,
    accumulate: bool,
) {
    assert!(fits(dst.len(), m, n, dst_rs, dst_cs), "gemm: dst too small");
    assert!(
        fits(lhs.data.len(), m, k, lhs.rs, lhs.cs),
        "gemm: lhs too small"
    );
    assert!(
        fits(rhs.data.len(), k, n, rhs.rs, rhs.cs),
        "gemm: rhs too small"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    dst[i * dst_rs + j * dst_cs] = 0.0;
                }
            }
        }
        return;
    }
    // SAFETY: the asserts above prove every element (i, j) addressed through the given strides
    // lies inside the corresponding slice; `dst` is a unique borrow and cannot alias the inputs.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            dst_cs as isize,
            dst_rs as isize,
            accumulate,
            lhs.data.as_ptr(),
            lhs.cs as isize,
            lhs.rs as isize,
            rhs.data.as_ptr(),
            rhs.cs as isize,
            rhs.rs as isize,
            1.0,
            alpha,
            false,
            false,
            false,
            parallelism(m, n, k),
        )
    }
}

/// [`gemm_into`] with the output's rows split into one block per thread, each block a
/// single-threaded product (`dst` row-major, row stride `n`). For the thin products of LoRA
/// (one side of width `r`), where the `gemm` crate's own threading splits the narrow side
/// and mostly synchronises: each output element is still one dot product over the same `k`,
/// blocked the same way, so the result equals [`gemm_into`]'s.
#[allow(clippy::too_many_arguments)]
pub fn gemm_rows(
    dst: &mut [f32],
    m: usize,
    n: usize,
    k: usize,
    lhs: Mat<'_>,
    rhs: Mat<'_>,
    alpha: f32,
    accumulate: bool,
) {
    let threads = rayon::current_num_threads();
    if threads < 2 || m < 2 || m * n * k < PAR_THRESHOLD || rayon::current_thread_index().is_some()
    {
        gemm_into(dst, n, m, n, k, lhs, rhs, alpha, accumulate);
        return;
    }
    assert!(dst.len() >= m * n, "gemm_rows: dst too small");
    let rows = m.div_ceil(threads);
    dst[..m * n]
        .par_chunks_mut(rows * n)
        .enumerate()
        .for_each(|(i, blk)| {
            let (r0, mm) = (i * rows, blk.len() / n);
            let lhs = Mat {
                data: &lhs.data[r0 * lhs.rs..],
                ..lhs
            };
            // Inside a rayon worker: `gemm_into` runs single-threaded.
            gemm_into(blk, n, mm, n, k, lhs, rhs, alpha, accumulate);
        });
}

/// Few-row products (decode) at least this large (m·n·k) are split over output features.
const SPLIT_THRESHOLD: usize = 1 << 17;
/// Largest row count handled by the feature-split path.
const SPLIT_MAX_ROWS: usize = 16;

thread_local! {
    /// Transposed-output scratch of the feature-split path (grows once, then reused).
    static YT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Linear layer: `y[m, n] (+)= x[m, k] · w[n, k]ᵀ` (Hugging Face `[out, in]` weights).
///
/// For few rows (decode) the GEMM crate's own threading does not pay off, so the output
/// features are split into blocks computed in parallel as `yᵀ[n, m] = W[n, k] · xᵀ` (each
/// block reads a contiguous slice of weight rows), then transposed into `y`.
pub fn linear(y: &mut [f32], x: &[f32], w: &[f32], m: usize, k: usize, n: usize, accumulate: bool) {
    let threads = rayon::current_num_threads();
    let split = (2..=SPLIT_MAX_ROWS).contains(&m)
        && m * n * k >= SPLIT_THRESHOLD
        && threads > 1
        && n >= 64
        && rayon::current_thread_index().is_none();
    if !split {
        gemm_into(
            y,
            n,
            m,
            n,
            k,
            Mat::rm(x, k),
            Mat::rm_t(w, k),
            1.0,
            accumulate,
        );
        return;
    }
    assert!(
        y.len() >= m * n && x.len() >= m * k && w.len() >= n * k,
        "linear: slices too small"
    );
    YT.with(|cell| {
        let mut yt = cell.borrow_mut();
        if yt.len() < m * n {
            yt.resize(m * n, 0.0);
        }
        let yt = &mut yt[..m * n];
        let blocks = threads * 2;
        let nb = n.div_ceil(blocks).div_ceil(16) * 16;
        yt.par_chunks_mut(nb * m).enumerate().for_each(|(bi, blk)| {
            let (n0, nn) = (bi * nb, blk.len() / m);
            let wb = &w[n0 * k..(n0 + nn) * k];
            gemm_into(
                blk,
                m,
                nn,
                m,
                k,
                Mat::rm(wb, k),
                Mat::rm_t(x, k),
                1.0,
                false,
            );
        });
        for (i, yr) in y.chunks_exact_mut(n).take(m).enumerate() {
            for (j, o) in yr.iter_mut().enumerate() {
                let v = yt[j * m + i];
                if accumulate {
                    *o += v;
                } else {
                    *o = v;
                }
            }
        }
    });
}

/// Input gradient of a linear layer: `dx[m, k] (+)= dy[m, n] · w[n, k]`.
pub fn linear_dx(
    dx: &mut [f32],
    dy: &[f32],
    w: &[f32],
    m: usize,
    k: usize,
    n: usize,
    accumulate: bool,
) {
    gemm_into(
        dx,
        k,
        m,
        k,
        n,
        Mat::rm(dy, n),
        Mat::rm(w, k),
        1.0,
        accumulate,
    );
}

/// Weight gradient of a linear layer: `dw[n, k] += alpha · dy[m, n]ᵀ · x[m, k]`.
pub fn linear_dw(dw: &mut [f32], dy: &[f32], x: &[f32], m: usize, k: usize, n: usize, alpha: f32) {
    gemm_into(dw, k, n, k, m, Mat::rm_t(dy, n), Mat::rm(x, k), alpha, true);
}

/// Adds `bias[n]` to every row of `y[m, n]`.
pub fn add_bias(y: &mut [f32], bias: &[f32]) {
    let n = bias.len();
    for row in y.chunks_exact_mut(n) {
        for (a, b) in row.iter_mut().zip(bias) {
            *a += b;
        }
    }
}

/// `db[n] += Σ_rows dy[m, n]`.
pub fn bias_grad(db: &mut [f32], dy: &[f32]) {
    let n = db.len();
    for row in dy.chunks_exact(n) {
        for (a, b) in db.iter_mut().zip(row) {
            *a += b;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    #[test]
    fn feature_split_path_matches_naive() {
        // m small, n·k large enough to take the parallel feature-split path.
        let (m, k, n) = (3, 128, 400);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.013).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.007).cos()).collect();
        let mut y = vec![0.5; m * n];
        linear(&mut y, &x, &w, m, k, n, true);
        for i in 0..m {
            for j in 0..n {
                let want: f32 = 0.5 + (0..k).map(|p| x[i * k + p] * w[j * k + p]).sum::<f32>();
                assert!(
                    (y[i * n + j] - want).abs() < 1e-3,
                    "({i},{j}) {} vs {want}",
                    y[i * n + j]
                );
            }
        }
    }

    #[test]
    fn gemm_rows_matches_gemm_into() {
        // Above the threshold: the rows are split over threads (when there are several).
        for (m, n, k, lt) in [
            (300, 16, 600, false),
            (16, 600, 300, true),
            (301, 577, 16, false),
        ] {
            let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.013).sin()).collect();
            let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.007).cos()).collect();
            // `lt`: the left operand is the transpose of a row-major `[k, m]`.
            let lhs = if lt { Mat::rm_t(&a, m) } else { Mat::rm(&a, k) };
            let mut want = vec![0.25; m * n];
            gemm_into(&mut want, n, m, n, k, lhs, Mat::rm(&b, n), 0.5, true);
            let mut got = vec![0.25; m * n];
            gemm_rows(&mut got, m, n, k, lhs, Mat::rm(&b, n), 0.5, true);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-5 * w.abs().max(1.0),
                    "{m}x{n}x{k} [{i}]: {g} vs {w}"
                );
            }
        }
    }

    #[test]
    fn gemm_into_t_writes_the_transpose() {
        let (m, n, k) = (7, 3, 5);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.11).cos()).collect();
        let want = naive(&a, &b, m, k, n);
        // dst [n, m] with a row stride of m + 2 (the padding stays untouched).
        let rs = m + 2;
        let mut dst = vec![1.0; n * rs];
        gemm_into_t(
            &mut dst,
            rs,
            m,
            n,
            k,
            Mat::rm(&a, k),
            Mat::rm(&b, n),
            2.0,
            true,
        );
        for j in 0..n {
            for i in 0..rs {
                let got = dst[j * rs + i];
                let w = if i < m {
                    1.0 + 2.0 * want[i * n + j]
                } else {
                    1.0
                };
                assert!((got - w).abs() < 1e-5, "[{j}, {i}]: {got} vs {w}");
            }
        }
    }

    #[test]
    fn linear_and_grads_match_naive() {
        let (m, k, n) = (5, 7, 3);
        let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let w: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect();
        let mut wt = vec![0.0; k * n];
        for o in 0..n {
            for i in 0..k {
                wt[i * n + o] = w[o * k + i];
            }
        }
        let mut y = vec![1.0; m * n];
        linear(&mut y, &x, &w, m, k, n, false);
        let want = naive(&x, &wt, m, k, n);
        for (a, b) in y.iter().zip(&want) {
            assert!((a - b).abs() < 1e-5);
        }
        let mut dx = vec![0.0; m * k];
        linear_dx(&mut dx, &y, &w, m, k, n, false);
        let want_dx = naive(&y, &w, m, n, k);
        for (a, b) in dx.iter().zip(&want_dx) {
            assert!((a - b).abs() < 1e-4);
        }
        let mut dw = vec![1.0; n * k];
        linear_dw(&mut dw, &y, &x, m, k, n, 2.0);
        let mut yt = vec![0.0; n * m];
        for i in 0..m {
            for j in 0..n {
                yt[j * m + i] = y[i * n + j];
            }
        }
        let want_dw = naive(&yt, &x, n, m, k);
        for (a, b) in dw.iter().zip(&want_dw) {
            assert!((a - (1.0 + 2.0 * b)).abs() < 1e-4);
        }
    }
}
