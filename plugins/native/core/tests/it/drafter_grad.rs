//! EAGLE-3 drafter TTT gradients: every trainable tensor against central finite differences
//! of the reported loss, through 3 TTT steps, with GQA, a draft vocabulary smaller than the
//! target's (labels outside it in the batch), two sequences of different lengths and
//! prompt masks.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{random_model, seq, tokens};
use tandem_native_core::buffer::VecProvider;
use tandem_native_core::config::Arch;
use tandem_native_core::drafter::{
    Drafter, DrafterInit, DrafterTrainer, SeqFeatures, TttConfig, layout::EMBED,
};
use tandem_native_core::optim::AdamW;

/// A trainer over a tiny drafter whose trainable weights are randomised (norms included).
pub fn tiny_trainer(steps: usize, p: &mut VecProvider) -> DrafterTrainer {
    let target = random_model(common::tiny_cfg(Arch::Llama, false), 5, p);
    let init = DrafterInit {
        aux_layers: None,
        draft_vocab: Some(vec![12, 0, 2, 3, 5, 7, 8, 11]),
        seed: 3,
    };
    let mut d = Drafter::init_from_target(&target, init, p).unwrap();
    let n = d.trainable_len();
    let noise = seq(n, 0.25, 77);
    for (w, z) in d.weights.as_mut_slice()[..n].iter_mut().zip(noise) {
        *w += z;
    }
    let ttt = TttConfig {
        steps,
        max_tokens: 32,
    };
    let opt = AdamW {
        weight_decay: 0.0,
        ..Default::default()
    };
    DrafterTrainer::new(d, ttt, opt, p).unwrap()
}

#[test]
fn ttt_gradients_match_finite_differences() {
    let mut p = VecProvider::new();
    let mut tr = tiny_trainer(3, &mut p);
    let fd = tr.drafter.cfg.feat_dim();
    assert!(tr.drafter.cfg.draft_vocab_size < tr.drafter.cfg.vocab_size);
    let (t1, t2) = (tokens(11, 13, 1), tokens(8, 13, 2));
    let (f1, f2) = (seq(11 * fd, 1.0, 3), seq(8 * fd, 1.0, 4));
    let batch = [
        SeqFeatures {
            tokens: &t1,
            feats: &f1,
            prompt_len: 5,
        },
        SeqFeatures {
            tokens: &t2,
            feats: &f2,
            prompt_len: 2,
        },
    ];
    // Some labels fall outside the draft vocabulary (1, 4, 6, 9, 10 are not kept).
    assert!(
        t1[2..]
            .iter()
            .chain(&t2[2..])
            .any(|&x| tr.drafter.target_to_draft(x as usize) == u32::MAX)
    );
    let m = tr.compute_grads(&batch).unwrap();
    assert!(m.loss.is_finite() && m.loss_per_step.len() == 3, "{m:?}");
    assert!(m.loss_per_step.iter().all(|&l| l > 0.0), "{m:?}");
    let grads = tr.grads().to_vec();
    let entries = tr.drafter.layout.entries().to_vec();
    let scale = grads.iter().fold(0f32, |a, g| a.max(g.abs()));
    let eps = 1e-2f32;
    for e in entries.iter().filter(|e| e.name != EMBED) {
        let r = e.range();
        let gmax = grads[r.clone()].iter().fold(0f32, |a, g| a.max(g.abs()));
        assert!(gmax > 0.0, "{}: all-zero gradient", e.name);
        // Every element of small tensors, a spread of 48 of large ones.
        let idx: Vec<usize> = if r.len() <= 64 {
            r.clone().collect()
        } else {
            (0..48).map(|j| r.start + (j * 7919) % r.len()).collect()
        };
        for i in idx {
            let w0 = tr.drafter.weights.as_slice()[i];
            tr.drafter.weights.as_mut_slice()[i] = w0 + eps;
            let lp = tr.evaluate(&batch).unwrap().loss;
            tr.drafter.weights.as_mut_slice()[i] = w0 - eps;
            let lm = tr.evaluate(&batch).unwrap().loss;
            tr.drafter.weights.as_mut_slice()[i] = w0;
            let fdv = ((lp - lm) / (2.0 * f64::from(eps))) as f32;
            let err = (fdv - grads[i]).abs();
            assert!(
                err <= 5e-3 * scale + 5e-3 * fdv.abs().max(grads[i].abs()),
                "{}[{}]: analytic {} vs finite-difference {fdv} (max |grad| {scale})",
                e.name,
                i - r.start,
                grads[i]
            );
        }
    }
}
