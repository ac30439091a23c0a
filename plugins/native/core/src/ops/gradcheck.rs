//! Test helper: central finite differences against an analytic gradient.

/// Deterministic pseudo-random values in `[-scale, scale]`.
pub fn seq(n: usize, scale: f32, salt: u64) -> Vec<f32> {
    let mut s = 0x9E37_79B9_7F4A_7C15u64 ^ (salt.wrapping_mul(0xD1B5_4A32_D192_ED03));
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Compares `grad` with central differences of `f` around `x0` (every element, eps 1e-2,
/// f64 loss accumulation); fails with the worst element.
pub fn check(name: &str, x0: &[f32], grad: &[f32], f: impl Fn(&[f32]) -> f64) {
    check_subset(name, x0, grad, f, &(0..x0.len()).collect::<Vec<_>>());
}

/// Like [`check`] over the listed indices only.
pub fn check_subset(
    name: &str,
    x0: &[f32],
    grad: &[f32],
    f: impl Fn(&[f32]) -> f64,
    idx: &[usize],
) {
    let eps = 1e-2f32;
    let mut x = x0.to_vec();
    let scale = grad.iter().fold(0f32, |m, g| m.max(g.abs())).max(1e-3);
    for &i in idx {
        x[i] = x0[i] + eps;
        let fp = f(&x);
        x[i] = x0[i] - eps;
        let fm = f(&x);
        x[i] = x0[i];
        let fd = ((fp - fm) / (2.0 * eps as f64)) as f32;
        let err = (fd - grad[i]).abs();
        assert!(
            err <= 5e-3 * scale + 5e-3 * fd.abs().max(grad[i].abs()),
            "{name}[{i}]: analytic {} vs finite-difference {fd} (max |grad| {scale})",
            grad[i]
        );
    }
}
