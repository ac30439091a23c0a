//! [`Rows`]: the role table's spelling of an `RVec<RVec<T>>` that travels as packed blobs.
//!
//! The ABI data types carry their own serde (derived in `tandem-plugin-api`, with token ids,
//! logprobs and hidden states as one MessagePack `bin` blob per vector through
//! [`tandem_plugin_api::wire::packed`]). A bare `RVec<RVec<f32>>` argument or result of a role
//! method (`score`, `compute_logprobs`) has no field to put `#[serde(with = ...)]` on, so the
//! table names it `Rows<T>`: a newtype with the bytes of [`packed::nested`], converted to and
//! from the ABI type (and the host's `Vec<Vec<T>>`) with `From`.
//!
//! The tests here also check that ABI values survive the wire and that their numeric vectors
//! are blobs.

use serde::{Deserializer, Serializer};
use tandem_plugin_api::RVec;
use tandem_plugin_api::wire::{Packable, packed};

/// Rows of numbers that serialise as an array of blobs (what [`packed::nested`] writes).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Rows<T>(pub RVec<RVec<T>>);

impl<T: Packable> serde::Serialize for Rows<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        packed::nested::serialize(&self.0, s)
    }
}

impl<'de, T: Packable> serde::Deserialize<'de> for Rows<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        packed::nested::deserialize(d).map(Rows)
    }
}

impl<T> From<RVec<RVec<T>>> for Rows<T> {
    fn from(rows: RVec<RVec<T>>) -> Self {
        Rows(rows)
    }
}

impl<T> From<Rows<T>> for RVec<RVec<T>> {
    fn from(rows: Rows<T>) -> Self {
        rows.0
    }
}

impl<T> From<Vec<Vec<T>>> for Rows<T> {
    fn from(rows: Vec<Vec<T>>) -> Self {
        Rows(rows.into_iter().map(RVec::from).collect())
    }
}

impl<T> From<Rows<T>> for Vec<Vec<T>> {
    fn from(rows: Rows<T>) -> Self {
        rows.0.into_iter().map(RVec::into_vec).collect()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may unwrap

    use super::*;
    use serde::{Deserialize, Serialize};
    use tandem_plugin_api::*;

    fn round_trip<T>(v: T)
    where
        T: Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
    {
        let bytes = rmp_serde::to_vec(&v).unwrap();
        assert_eq!(rmp_serde::from_slice::<T>(&bytes).unwrap(), v);
    }

    #[test]
    fn abi_values_survive_the_wire() {
        round_trip(GenerateRequest {
            prompts: vec![RVec::from(vec![1u32, 2]), RVec::new()].into(),
            sampling: SamplingParams {
                seed: ROption::RSome(7),
                stop_token_ids: vec![3u32].into(),
                ..SamplingParams::default()
            },
            adapter: ROption::RSome("lora-v3".into()),
        });
        round_trip(GenerateResponse {
            completions: vec![Completion {
                tokens: vec![1u32, u32::MAX, 0].into(),
                logprobs: vec![-0.5f32, -1e-30, f32::NEG_INFINITY].into(),
                finish_reason: FinishReason::Stop,
                hidden_states: vec![1.25f32; 6].into(),
                hidden_dim: 2,
            }]
            .into(),
            weight_version: 9,
        });
        round_trip(TrainBatch {
            sequences: vec![TrainSequence {
                tokens: vec![5u32, 6, 7].into(),
                prompt_len: 1,
                advantage: -0.25,
                old_logprobs: vec![-0.1f32, -0.2].into(),
                ref_logprobs: RVec::new(),
            }]
            .into(),
            loss: LossConfig {
                kind: LossKind::Grpo,
                clip_eps_low: 0.2,
                clip_eps_high: 0.28,
                kl_coef: 0.0,
                learning_rate: 1e-3,
                grad_clip: 1.0,
            },
        });
        round_trip(WhichWeights::Snapshot("ref".into()));
        round_trip(WhichWeights::Current);
        round_trip(PluginError::invalid_input("bad").with_help("fix it"));
        round_trip(ComponentStats {
            weight_version: 2,
            state: "serving".into(),
            metrics: vec![Metric::new("loss", 0.5)].into(),
        });
        round_trip(PauseMode::Keep);
        round_trip(UpdateKind::TensorBuckets);
        for payload in [
            UpdatePayload::CheckpointDir {
                dir: "/ckpt".into(),
            },
            UpdatePayload::Adapter {
                name: "a".into(),
                dir: "/a".into(),
            },
            UpdatePayload::SharedRegion {
                region: SharedRegionRef {
                    key: "k".into(),
                    device: "cpu".into(),
                    len: 64,
                },
                tensors: vec![TensorSpec {
                    name: "w".into(),
                    dtype: DType::BF16,
                    shape: vec![2u64, 4].into(),
                    offset: 16,
                }]
                .into(),
            },
            UpdatePayload::TensorBuckets {
                group: "g".into(),
                buckets: vec![TensorBucket {
                    tensors: RVec::new(),
                    bytes: 0,
                }]
                .into(),
            },
        ] {
            round_trip(WeightUpdate {
                version: 3,
                payload,
                digest: "ab".into(),
            });
        }
    }

    #[test]
    fn numeric_vectors_travel_as_blobs_and_bad_blobs_are_errors() {
        let tokens = Completion::new(vec![7u32; 1000], RVec::new(), FinishReason::Length);
        let bytes = rmp_serde::to_vec(&tokens).unwrap();
        // 4000 bytes of tokens plus a few bytes of framing, not 1000 array elements.
        assert!((4000..4032).contains(&bytes.len()), "{}", bytes.len());
        // A blob whose length is not a multiple of 4 is refused, not misread.
        let bad = rmp_serde::to_vec(&(serde_bytes_like(&[1, 2, 3]),)).unwrap();
        let r: Result<(WirePacked,), _> = rmp_serde::from_slice(&bad);
        assert!(r.unwrap_err().to_string().contains("not 4-byte elements"));
        let good = rmp_serde::to_vec(&(serde_bytes_like(&[1, 0, 0, 0, 2, 0, 0, 0]),)).unwrap();
        let (WirePacked(v),) = rmp_serde::from_slice(&good).unwrap();
        assert_eq!(v.as_slice(), [1, 2]);
    }

    #[test]
    fn rows_travel_exactly_as_nested_packed_vectors() {
        #[derive(Serialize)]
        struct Nested(#[serde(with = "packed::nested")] RVec<RVec<u32>>);
        let v = vec![vec![1u32, 70_000], vec![], vec![u32::MAX]];
        let rows = Rows::from(v.clone());
        let bytes = rmp_serde::to_vec(&rows).unwrap();
        assert_eq!(bytes, rmp_serde::to_vec(&Nested(rows.0.clone())).unwrap());
        // An array of three blobs (`bin8` of 8, 0 and 4 bytes), little-endian.
        let mut expected = vec![
            0x93, 0xc4, 8, 1, 0, 0, 0, 0x70, 0x11, 1, 0, 0xc4, 0, 0xc4, 4,
        ];
        expected.extend([0xff; 4]);
        assert_eq!(bytes, expected);
        let back: Rows<u32> = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(Vec::<Vec<u32>>::from(back), v);
    }

    fn serde_bytes_like(b: &[u8]) -> impl Serialize {
        struct B(Vec<u8>);
        impl Serialize for B {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.0)
            }
        }
        B(b.to_vec())
    }

    #[derive(Debug, Deserialize)]
    struct WirePacked(#[serde(with = "packed")] RVec<u32>);
}
