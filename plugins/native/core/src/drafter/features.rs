//! [`aux_features`]: the target's residual streams a drafter reads, computed with the
//! training forward (for datasets and tests; the engine captures them during its own passes).

use crate::acts::ActLayout;
use crate::error::{NativeError, Result};
use crate::forward::forward;
use crate::model::Model;

/// `[T, layers.len() · hidden]`: for each token position `t` the residual stream entering
/// each target layer of `layers` (`x_in` of that layer; id `num_hidden_layers` = the final
/// residual before the final norm), concatenated in the order of `layers`.
pub fn aux_features(model: &Model, tokens: &[u32], layers: &[usize]) -> Result<Vec<f32>> {
    let c = &model.cfg;
    if let Some(&bad) = layers.iter().find(|&&l| l > c.num_hidden_layers) {
        return Err(NativeError::Input(format!(
            "aux layer id {bad} is out of range for a target of {} layers",
            c.num_hidden_layers
        )));
    }
    let t = tokens.len();
    let al = ActLayout::new(c, 1, t, None);
    let mut acts = vec![0f32; al.total_len()];
    forward(model, None, tokens, &al, &mut acts, false)?;
    let d = c.hidden_size;
    let per = al.per_layer();
    let fin = c.num_hidden_layers * per;
    let k = layers.len();
    let mut out = vec![0f32; t * k * d];
    for (j, &l) in layers.iter().enumerate() {
        // x_in is the first tensor of a layer section; the final residual is the first of the
        // final section.
        let base = if l == c.num_hidden_layers {
            fin
        } else {
            l * per
        };
        for ti in 0..t {
            out[(ti * k + j) * d..(ti * k + j + 1) * d]
                .copy_from_slice(&acts[base + ti * d..base + (ti + 1) * d]);
        }
    }
    Ok(out)
}
