//! Serde mirrors of the ABI data types, and the conversions between the two.
//!
//! The ABI types (`tandem_plugin_api::types`) are `#[repr(C)]` abi_stable types without serde
//! support; each gets a plain-Rust twin here (`Wire*`, same fields, `String`/`Vec`/`Option`)
//! that travels in control-plane frames. [`Mirror`] converts in both directions, through
//! containers too (`RVec<RVec<u32>>` ↔ `Vec<Vec<u32>>`). Callers of the remote handles use the
//! ABI types, so in-process and remote components take the same values; only the protocol
//! (and the control-plane benchmark, which plays a worker) handles the twins.

use super::packed::{self, Packable, Rows};
use serde::{Deserialize, Serialize};
use tandem_plugin_api::{
    CheckpointInfo, Completion, ComponentStats, DType, EngineHealth, ErrorCode, FinishReason,
    GenerateRequest, GenerateResponse, LossConfig, LossKind, Metric, PauseMode, PluginError,
    ROption, RString, RVec, SamplingParams, SharedRegionRef, TensorBucket, TensorSpec, TrainBatch,
    TrainSequence, TrainerInfo, UpdateKind, UpdatePayload, UpdateReport, WeightUpdate,
    WhichWeights,
};

/// A value with an ABI form and a serde form: an ABI type (then `Abi = Self`), or a spelling of
/// one with its own wire encoding ([`Rows`]).
pub trait Mirror {
    /// The ABI type.
    type Abi;
    /// The serde twin.
    type Wire;
    /// ABI → wire.
    fn to_wire(abi: Self::Abi) -> Self::Wire;
    /// Wire → ABI.
    fn from_wire(wire: Self::Wire) -> Self::Abi;
}

macro_rules! identity {
    ($($t:ty),*) => {$(
        impl Mirror for $t {
            type Abi = $t;
            type Wire = $t;
            fn to_wire(abi: $t) -> $t { abi }
            fn from_wire(wire: $t) -> $t { wire }
        }
    )*};
}
identity!((), bool, u32, u64, f32, f64);

impl Mirror for RString {
    type Abi = RString;
    type Wire = String;
    fn to_wire(abi: RString) -> String {
        abi.into_string()
    }
    fn from_wire(wire: String) -> RString {
        RString::from(wire)
    }
}

impl<T: Mirror> Mirror for RVec<T> {
    type Abi = RVec<T::Abi>;
    type Wire = Vec<T::Wire>;
    fn to_wire(abi: Self::Abi) -> Self::Wire {
        abi.into_iter().map(T::to_wire).collect()
    }
    fn from_wire(wire: Self::Wire) -> Self::Abi {
        wire.into_iter().map(T::from_wire).collect()
    }
}

impl<T: Mirror> Mirror for ROption<T> {
    type Abi = ROption<T::Abi>;
    type Wire = Option<T::Wire>;
    fn to_wire(abi: Self::Abi) -> Self::Wire {
        abi.into_option().map(T::to_wire)
    }
    fn from_wire(wire: Self::Wire) -> Self::Abi {
        ROption::from(wire.map(T::from_wire))
    }
}

impl<T: Packable> Mirror for Rows<T> {
    type Abi = RVec<RVec<T>>;
    type Wire = Rows<T>;
    fn to_wire(abi: Self::Abi) -> Rows<T> {
        Rows(abi.into_iter().map(RVec::into_vec).collect())
    }
    fn from_wire(wire: Rows<T>) -> Self::Abi {
        wire.0.into_iter().map(RVec::from).collect()
    }
}

/// A fieldless enum mirrored variant by variant.
macro_rules! mirror_enum {
    ($abi:ident => $wire:ident { $($v:ident),* $(,)? }) => {
        #[doc = concat!("Serde twin of [`", stringify!($abi), "`].")]
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
        pub enum $wire {
            $(#[doc = concat!("[`", stringify!($abi), "::", stringify!($v), "`]")] $v),*
        }
        impl Mirror for $abi {
            type Abi = $abi;
            type Wire = $wire;
            fn to_wire(abi: $abi) -> $wire { match abi { $($abi::$v => $wire::$v),* } }
            fn from_wire(w: $wire) -> $abi { match w { $($wire::$v => $abi::$v),* } }
        }
    };
}

/// A struct mirrored field by field (each field through [`Mirror`]).
macro_rules! mirror_struct {
    ($abi:ident => $wire:ident { $($(#[$m:meta])* $f:ident: $t:ty),* $(,)? }) => {
        #[doc = concat!("Serde twin of [`", stringify!($abi), "`].")]
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        pub struct $wire {
            $(
                #[doc = concat!("[`", stringify!($abi), "::", stringify!($f), "`]")]
                $(#[$m])* pub $f: <$t as Mirror>::Wire
            ),*
        }
        impl Mirror for $abi {
            type Abi = $abi;
            type Wire = $wire;
            fn to_wire(abi: $abi) -> $wire { $wire { $($f: <$t as Mirror>::to_wire(abi.$f)),* } }
            fn from_wire(w: $wire) -> $abi { $abi { $($f: <$t as Mirror>::from_wire(w.$f)),* } }
        }
    };
}

mirror_enum!(ErrorCode => WireErrorCode {
    InvalidInput, NotSupported, NotAvailable, InvalidState, Io, Unavailable, Timeout, Cancelled,
    Corrupt, Runtime, Panicked,
});
mirror_enum!(FinishReason => WireFinishReason { Length, Stop, Aborted });
mirror_enum!(PauseMode => WirePauseMode { Abort, Wait, Keep });
mirror_enum!(LossKind => WireLossKind { Grpo, Sft });
mirror_enum!(UpdateKind => WireUpdateKind { SharedRegion, Adapter, CheckpointDir, TensorBuckets });
mirror_enum!(DType => WireDType { F32, BF16, F16, U8, I32, I64 });

mirror_struct!(PluginError => WirePluginError { code: ErrorCode, message: RString, help: RString });
mirror_struct!(SamplingParams => WireSamplingParams {
    temperature: f32, top_p: f32, top_k: u32, max_tokens: u32, stop_token_ids: RVec<u32>,
    seed: ROption<u64>, logprobs: bool, return_hidden_states: bool,
});
mirror_struct!(GenerateRequest => WireGenerateRequest {
    #[serde(with = "packed::nested")] prompts: RVec<RVec<u32>>,
    sampling: SamplingParams,
    adapter: ROption<RString>,
});
mirror_struct!(Completion => WireCompletion {
    #[serde(with = "packed")] tokens: RVec<u32>,
    #[serde(with = "packed")] logprobs: RVec<f32>,
    finish_reason: FinishReason,
    #[serde(with = "packed")] hidden_states: RVec<f32>,
    hidden_dim: u32,
});
mirror_struct!(GenerateResponse => WireGenerateResponse {
    completions: RVec<Completion>, weight_version: u64,
});
mirror_struct!(EngineHealth => WireEngineHealth { ready: bool, weight_version: u64, detail: RString });
mirror_struct!(Metric => WireMetric { name: RString, value: f64 });
mirror_struct!(ComponentStats => WireComponentStats {
    weight_version: u64, state: RString, metrics: RVec<Metric>,
});
mirror_struct!(TrainSequence => WireTrainSequence {
    #[serde(with = "packed")] tokens: RVec<u32>,
    prompt_len: u32,
    advantage: f32,
    #[serde(with = "packed")] old_logprobs: RVec<f32>,
    #[serde(with = "packed")] ref_logprobs: RVec<f32>,
});
mirror_struct!(LossConfig => WireLossConfig {
    kind: LossKind, clip_eps_low: f32, clip_eps_high: f32, kl_coef: f32, learning_rate: f32,
    grad_clip: f32,
});
mirror_struct!(TrainBatch => WireTrainBatch { sequences: RVec<TrainSequence>, loss: LossConfig });
mirror_struct!(TrainerInfo => WireTrainerInfo {
    trainable_params: u64, total_params: u64, weight_version: u64,
});
mirror_struct!(CheckpointInfo => WireCheckpointInfo { dir: RString, weight_version: u64, bytes: u64 });
mirror_struct!(TensorSpec => WireTensorSpec {
    name: RString, dtype: DType, shape: RVec<u64>, offset: u64,
});
mirror_struct!(SharedRegionRef => WireSharedRegionRef { key: RString, device: RString, len: u64 });
mirror_struct!(TensorBucket => WireTensorBucket { tensors: RVec<TensorSpec>, bytes: u64 });
mirror_struct!(WeightUpdate => WireWeightUpdate {
    version: u64, payload: UpdatePayload, digest: RString,
});
mirror_struct!(UpdateReport => WireUpdateReport { version: u64, digest: RString, bytes_copied: u64 });

/// Serde twin of [`WhichWeights`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum WireWhichWeights {
    /// [`WhichWeights::Current`]
    Current,
    /// [`WhichWeights::Snapshot`]
    Snapshot(String),
}

impl Mirror for WhichWeights {
    type Abi = WhichWeights;
    type Wire = WireWhichWeights;
    fn to_wire(abi: WhichWeights) -> WireWhichWeights {
        match abi {
            WhichWeights::Current => WireWhichWeights::Current,
            WhichWeights::Snapshot(name) => WireWhichWeights::Snapshot(name.into_string()),
        }
    }
    fn from_wire(w: WireWhichWeights) -> WhichWeights {
        match w {
            WireWhichWeights::Current => WhichWeights::Current,
            WireWhichWeights::Snapshot(name) => WhichWeights::Snapshot(name.into()),
        }
    }
}

/// An enum of struct variants mirrored variant by variant and field by field.
macro_rules! mirror_variants {
    ($abi:ident => $wire:ident { $($v:ident { $($f:ident: $t:ty),* }),* $(,)? }) => {
        #[doc = concat!("Serde twin of [`", stringify!($abi), "`].")]
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        pub enum $wire {
            $(
                #[doc = concat!("[`", stringify!($abi), "::", stringify!($v), "`]")]
                $v {
                    $(#[doc = concat!("`", stringify!($f), "`")] $f: <$t as Mirror>::Wire),*
                }
            ),*
        }
        impl Mirror for $abi {
            type Abi = $abi;
            type Wire = $wire;
            fn to_wire(abi: $abi) -> $wire {
                match abi {
                    $($abi::$v { $($f),* } => $wire::$v { $($f: <$t as Mirror>::to_wire($f)),* }),*
                }
            }
            fn from_wire(w: $wire) -> $abi {
                match w {
                    $($wire::$v { $($f),* } => $abi::$v { $($f: <$t as Mirror>::from_wire($f)),* }),*
                }
            }
        }
    };
}

mirror_variants!(UpdatePayload => WireUpdatePayload {
    SharedRegion { region: SharedRegionRef, tensors: RVec<TensorSpec> },
    Adapter { name: RString, dir: RString },
    CheckpointDir { dir: RString },
    TensorBuckets { group: RString, buckets: RVec<TensorBucket> },
});

impl From<PluginError> for WirePluginError {
    fn from(e: PluginError) -> Self {
        PluginError::to_wire(e)
    }
}

impl From<WirePluginError> for PluginError {
    fn from(w: WirePluginError) -> Self {
        PluginError::from_wire(w)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may unwrap

    use super::*;

    fn round_trip<T: Mirror<Abi = T> + Clone + PartialEq + std::fmt::Debug>(v: T)
    where
        T::Wire: Serialize + serde::de::DeserializeOwned,
    {
        let bytes = rmp_serde::to_vec(&T::to_wire(v.clone())).unwrap();
        let back: T::Wire = rmp_serde::from_slice(&bytes).unwrap();
        assert_eq!(T::from_wire(back), v);
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
        let tokens = WireCompletion {
            tokens: vec![7u32; 1000],
            logprobs: Vec::new(),
            finish_reason: WireFinishReason::Length,
            hidden_states: Vec::new(),
            hidden_dim: 0,
        };
        let bytes = rmp_serde::to_vec(&tokens).unwrap();
        // 4000 bytes of tokens plus a few bytes of framing, not 1000 array elements.
        assert!((4000..4032).contains(&bytes.len()), "{}", bytes.len());
        // A blob whose length is not a multiple of 4 is refused, not misread.
        let bad = rmp_serde::to_vec(&(serde_bytes_like(&[1, 2, 3]),)).unwrap();
        let r: Result<(WirePacked,), _> = rmp_serde::from_slice(&bad);
        assert!(r.unwrap_err().to_string().contains("not 4-byte elements"));
        let good = rmp_serde::to_vec(&(serde_bytes_like(&[1, 0, 0, 0, 2, 0, 0, 0]),)).unwrap();
        let (WirePacked(v),) = rmp_serde::from_slice(&good).unwrap();
        assert_eq!(v, [1, 2]);
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
    struct WirePacked(#[serde(with = "packed")] Vec<u32>);
}
