//! The value loss of a PPO critic, over token-aligned arrays, writing `∂L/∂v`.
//!
//! # Alignment
//! As in [`crate::loss`]: inputs are token-aligned `[B, T]` arrays, entry `(b, j)` refers to
//! token `tokens[b, j]`. The value `v[b, j]` is the value of the state that emits token `j`
//! (the prefix `tokens[b, ..j]`), computed by the value head from the final hidden state at
//! position `j − 1` ([`crate::value_head`]). Entry `j = 0` has no such state and is ignored
//! (its mask is treated as 0). `mask[b, j]` selects the tokens that count (the completion).
//!
//! # The value loss — the one written definition
//! Every trainer that can be a value model (`Trainer::train_step_value` of
//! `tandem-plugin-api`) implements exactly this. For every counted token `i` with value `v_i`,
//! return `R_i` (GAE's λ-return), the value it was valued with at rollout `v_old_i` and the
//! clip range `c ≥ 0`:
//!
//! ```text
//! u_i  = (v_i − R_i)²
//! vc_i = clip(v_i, v_old_i − c, v_old_i + c)          only when c > 0
//! ℓ_i  = max(u_i, (vc_i − R_i)²)   when c > 0,   else u_i
//! L    = ½ · Σ_i mask_i · ℓ_i / Σ_i mask_i
//! ```
//!
//! The normaliser `Σ mask` is that of the **whole batch of the step** (a trainer that splits
//! the batch passes it as `normalizer`). The gradient flows through `v` only:
//! `∂L/∂v_i = mask_i · (v_i − R_i) / Σ mask` when the unclipped term is the maximum (ties
//! included: inside the clip range both terms are equal), else `0` (the clipped value is a
//! constant outside the range). A counted token whose clipped term is strictly larger counts
//! in `clip_frac` (its gradient is clipped away).

use crate::error::{NativeError, Result};

/// The value targets of one batch (token-aligned `[B, T]`).
#[derive(Debug, Clone, Copy)]
pub struct ValueTargets<'a> {
    /// `R`: the return of each token.
    pub returns: &'a [f32],
    /// `v_old`: the rollout's values (needed when `clip > 0`).
    pub old_values: Option<&'a [f32]>,
    /// `c`: the clip range (0: no clipping).
    pub clip: f32,
}

/// Aggregates of one value-loss evaluation.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ValueStats {
    /// The loss `L`.
    pub loss: f64,
    /// Σ mask.
    pub tokens: f64,
    /// Fraction of counted tokens whose gradient the clip took away.
    pub clip_frac: f64,
}

/// Evaluates the value loss of `values` (`[B, T]`, rows of `t`) and writes `∂L/∂v` into
/// `dvalues` (0 on tokens that do not count). `normalizer`: `Σ mask` of the whole batch of
/// the step when these arrays hold only a part of it; `None`: they are the whole batch.
pub fn value_loss(
    values: &[f32],
    t: usize,
    mask: &[f32],
    targets: &ValueTargets<'_>,
    normalizer: Option<f32>,
    dvalues: &mut [f32],
) -> Result<ValueStats> {
    let n = values.len();
    let bad = |m: String| Err(NativeError::Input(m));
    if t == 0 || !n.is_multiple_of(t) || mask.len() != n || dvalues.len() != n {
        return bad(format!(
            "value loss inputs disagree: {n} values, T={t}, {} mask entries, {} gradient entries",
            mask.len(),
            dvalues.len()
        ));
    }
    if targets.returns.len() != n || targets.old_values.is_some_and(|o| o.len() != n) {
        return bad("returns / old values must have one entry per token".into());
    }
    let c = targets.clip;
    if !(c >= 0.0 && c.is_finite()) {
        return bad(format!("the value clip must be finite and >= 0 (got {c})"));
    }
    let old = match (c > 0.0, targets.old_values) {
        (true, None) => return bad("a value clip > 0 needs the old values".into()),
        (true, Some(o)) => Some(o),
        (false, _) => None,
    };
    let counted = |i: usize| if i.is_multiple_of(t) { 0.0 } else { mask[i] };
    let z = normalizer.unwrap_or_else(|| (0..n).map(counted).sum());
    let z = if z > 0.0 { z } else { 1.0 };
    let (mut sum, mut tokens, mut clipped) = (0f64, 0f64, 0f64);
    for i in 0..n {
        let m = counted(i);
        dvalues[i] = 0.0;
        if m == 0.0 {
            continue;
        }
        let (v, r) = (values[i], targets.returns[i]);
        let u = (v - r) * (v - r);
        let (l, grad) = match old {
            Some(o) => {
                let vc = v.clamp(o[i] - c, o[i] + c);
                let uc = (vc - r) * (vc - r);
                if u >= uc {
                    (u, true)
                } else {
                    clipped += f64::from(m);
                    (uc, false)
                }
            }
            None => (u, true),
        };
        if grad {
            dvalues[i] = m * (v - r) / z;
        }
        sum += f64::from(m) * f64::from(l);
        tokens += f64::from(m);
    }
    Ok(ValueStats {
        loss: 0.5 * sum / f64::from(z),
        tokens,
        clip_frac: clipped / tokens.max(1e-12),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    // Two sequences of T = 3; counted: s0 t1, s0 t2, s1 t2 (s1 t1 is prompt, t0 never).
    //   token  v     R     v_old  c = 0.2: vc    (v−R)²  (vc−R)²  ℓ      ∂ℓ/∂v kept
    //   s0 t1  0.5   1.0   0.4    0.5 (inside)   0.25    0.25     0.25   yes
    //   s0 t2  1.0   0.0   0.5    0.7            1.00    0.49     1.00   yes
    //   s1 t2 −1.0   0.5  −0.4   −0.6            2.25    1.21     2.25   yes
    // With v_old(s1 t2) = −1.5 instead: vc = −1.3, (vc − R)² = 3.24 > 2.25: clipped.
    const MASK: [f32; 6] = [1.0, 1.0, 1.0, 0.0, 0.0, 1.0];
    const V: [f32; 6] = [9.0, 0.5, 1.0, 9.0, 9.0, -1.0];
    const R: [f32; 6] = [0.0, 1.0, 0.0, 0.0, 0.0, 0.5];

    fn eval(old: Option<&[f32]>, clip: f32) -> (ValueStats, [f32; 6]) {
        let mut d = [7.0f32; 6];
        let targets = ValueTargets {
            returns: &R,
            old_values: old,
            clip,
        };
        let st = value_loss(&V, 3, &MASK, &targets, None, &mut d).unwrap();
        (st, d)
    }

    fn close(got: f64, want: f64) {
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }

    #[test]
    fn unclipped_value_loss_matches_the_hand_computed_batch() {
        let (st, d) = eval(None, 0.0);
        close(st.loss, 0.5 * (0.25 + 1.0 + 2.25) / 3.0);
        assert_eq!((st.tokens, st.clip_frac), (3.0, 0.0));
        let want = [0.0, -0.5 / 3.0, 1.0 / 3.0, 0.0, 0.0, -1.5 / 3.0];
        for (g, w) in d.iter().zip(want) {
            close(f64::from(*g), w);
        }
    }

    #[test]
    fn clipped_value_loss_matches_the_hand_computed_batch() {
        let old = [0.0, 0.4, 0.5, 0.0, 0.0, -0.4];
        let (st, d) = eval(Some(&old), 0.2);
        // No token's clipped term is larger: the same loss as without the clip.
        close(st.loss, 0.5 * 3.5 / 3.0);
        assert_eq!(st.clip_frac, 0.0);
        close(f64::from(d[5]), -0.5);
        let old = [0.0, 0.4, 0.5, 0.0, 0.0, -1.5];
        let (st, d) = eval(Some(&old), 0.2);
        close(st.loss, 0.5 * (0.25 + 1.0 + 3.24) / 3.0);
        close(st.clip_frac, 1.0 / 3.0);
        assert_eq!(d[5], 0.0, "the clipped token has no gradient");
        close(f64::from(d[1]), -0.5 / 3.0);
        // The batch's own normaliser given explicitly is the same loss; a larger one scales it.
        let targets = ValueTargets {
            returns: &R,
            old_values: Some(&old),
            clip: 0.2,
        };
        let mut d2 = [0f32; 6];
        let st2 = value_loss(&V, 3, &MASK, &targets, Some(3.0), &mut d2).unwrap();
        assert_eq!((st2, d2), (st, d));
        let st6 = value_loss(&V, 3, &MASK, &targets, Some(6.0), &mut d2).unwrap();
        close(st6.loss * 2.0, st.loss);
    }

    #[test]
    fn value_loss_gradient_matches_finite_differences() {
        let old = [0.0, 0.4, 0.5, 0.0, 0.0, -1.5];
        let targets = ValueTargets {
            returns: &R,
            old_values: Some(&old),
            clip: 0.2,
        };
        let mut d = [0f32; 6];
        value_loss(&V, 3, &MASK, &targets, None, &mut d).unwrap();
        let f = |v: &[f32]| {
            let mut s = [0f32; 6];
            value_loss(v, 3, &MASK, &targets, None, &mut s)
                .unwrap()
                .loss
        };
        crate::ops::gradcheck::check("value loss", &V, &d, f);
    }

    #[test]
    fn bad_value_inputs_are_refused() {
        let mut d = [0f32; 6];
        let t = |clip, old| ValueTargets {
            returns: &R,
            old_values: old,
            clip,
        };
        assert!(value_loss(&V, 3, &MASK, &t(0.2, None), None, &mut d).is_err());
        assert!(value_loss(&V, 3, &MASK, &t(-1.0, None), None, &mut d).is_err());
        assert!(value_loss(&V, 4, &MASK, &t(0.0, None), None, &mut d).is_err());
        assert!(value_loss(&V, 3, &MASK[..5], &t(0.0, None), None, &mut d).is_err());
    }
}
