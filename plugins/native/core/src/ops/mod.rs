//! Elementwise and small-structure ops of the decoder, each with a hand-written backward
//! checked against finite differences in its tests.

pub mod attention;
pub mod mlp;
pub mod norm;
pub mod rope;

#[cfg(test)]
pub(crate) mod gradcheck;
