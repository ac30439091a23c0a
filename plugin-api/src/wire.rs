//! How the data types serialise: numeric vectors as byte blobs instead of arrays of numbers.
//!
//! The ABI data types derive serde so the host's control plane can send them between
//! processes (MessagePack, `rmp-serde`). Token ids, logprobs and hidden states are the bulk of
//! that traffic, and `rmp-serde` decodes an array element by element: a 64 × 1024-token reply
//! took 2.5 ms to decode as arrays, 73 µs as blobs (release build, measured on the project
//! machine). Those fields therefore use [`packed`] (`#[serde(with = "crate::wire::packed")]`,
//! an `RVec<T>` as one little-endian blob) or [`packed::nested`] (an `RVec<RVec<T>>` as an
//! array of blobs). A blob whose length is not a multiple of 4 is a decode error, never
//! misread.
//!
//! Nothing here crosses the plugin boundary: serde is not part of the ABI.

use abi_stable::std_types::RVec;

/// A 4-byte number stored little-endian.
pub trait Packable: Copy {
    /// The little-endian bytes.
    fn to_le(self) -> [u8; 4];
    /// The number from its little-endian bytes.
    fn from_le(b: [u8; 4]) -> Self;
}

impl Packable for u32 {
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    fn from_le(b: [u8; 4]) -> Self {
        u32::from_le_bytes(b)
    }
}

impl Packable for f32 {
    fn to_le(self) -> [u8; 4] {
        self.to_le_bytes()
    }
    fn from_le(b: [u8; 4]) -> Self {
        f32::from_le_bytes(b)
    }
}

/// An `RVec<T>` of [`Packable`] numbers as one byte blob (for `#[serde(with = ...)]`).
pub mod packed {
    use super::{Packable, RVec};
    use serde::de::{self, Deserializer, Visitor};
    use serde::ser::Serializer;
    use std::fmt;
    use std::marker::PhantomData;

    fn to_bytes<T: Packable>(v: &[T]) -> Vec<u8> {
        let mut out = vec![0u8; v.len() * 4];
        for (c, x) in out.chunks_exact_mut(4).zip(v) {
            c.copy_from_slice(&x.to_le());
        }
        out
    }

    fn from_bytes<T: Packable, E: de::Error>(b: &[u8]) -> Result<RVec<T>, E> {
        if !b.len().is_multiple_of(4) {
            return Err(E::custom(format!(
                "packed vector of {} bytes (not 4-byte elements)",
                b.len()
            )));
        }
        let v: Vec<T> = b
            .chunks_exact(4)
            .map(|c| T::from_le([c[0], c[1], c[2], c[3]]))
            .collect();
        Ok(RVec::from(v))
    }

    /// Serialises a vector as one byte blob.
    pub fn serialize<T: Packable, S: Serializer>(v: &[T], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(&to_bytes(v))
    }

    struct BlobVisitor<T>(PhantomData<T>);

    impl<T: Packable> Visitor<'_> for BlobVisitor<T> {
        type Value = RVec<T>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a packed vector (bytes)")
        }
        fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<RVec<T>, E> {
            from_bytes(b)
        }
    }

    /// Deserialises a vector written by [`serialize`].
    pub fn deserialize<'de, T: Packable, D: Deserializer<'de>>(d: D) -> Result<RVec<T>, D::Error> {
        d.deserialize_bytes(BlobVisitor(PhantomData))
    }

    /// An `RVec<RVec<T>>` as an array of blobs, one per inner vector.
    pub mod nested {
        use super::{Packable, RVec, fmt, to_bytes};
        use serde::de::{Deserializer, SeqAccess, Visitor};
        use serde::ser::{SerializeSeq, Serializer};
        use std::marker::PhantomData;

        /// Bytes that serialise as one blob (not as an array of `u8`).
        struct Blob(Vec<u8>);

        impl serde::Serialize for Blob {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(&self.0)
            }
        }

        /// Serialises each inner vector as one blob.
        pub fn serialize<T: Packable, S: Serializer>(
            v: &[RVec<T>],
            s: S,
        ) -> Result<S::Ok, S::Error> {
            let mut seq = s.serialize_seq(Some(v.len()))?;
            for inner in v {
                seq.serialize_element(&Blob(to_bytes(inner)))?;
            }
            seq.end()
        }

        struct Inner<T>(RVec<T>);

        impl<'de, T: Packable> serde::Deserialize<'de> for Inner<T> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                super::deserialize(d).map(Inner)
            }
        }

        struct ArrayVisitor<T>(PhantomData<T>);

        impl<'de, T: Packable> Visitor<'de> for ArrayVisitor<T> {
            type Value = RVec<RVec<T>>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of packed vectors")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0).min(1 << 16));
                while let Some(Inner(v)) = seq.next_element::<Inner<T>>()? {
                    out.push(v);
                }
                Ok(RVec::from(out))
            }
        }

        /// Deserialises what [`serialize`] wrote.
        pub fn deserialize<'de, T: Packable, D: Deserializer<'de>>(
            d: D,
        ) -> Result<RVec<RVec<T>>, D::Error> {
            d.deserialize_seq(ArrayVisitor(PhantomData))
        }
    }
}

/// An `RVec<u8>` as one byte blob (for `#[serde(with = ...)]`), not an array of numbers.
pub mod bytes {
    use super::RVec;
    use serde::de::{self, Deserializer, SeqAccess, Visitor};
    use serde::ser::Serializer;
    use std::fmt;

    /// Serialises the bytes as one blob.
    pub fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bytes(v)
    }

    struct BytesVisitor;

    impl<'de> Visitor<'de> for BytesVisitor {
        type Value = RVec<u8>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("bytes")
        }
        fn visit_bytes<E: de::Error>(self, b: &[u8]) -> Result<RVec<u8>, E> {
            Ok(RVec::from(b))
        }
        fn visit_byte_buf<E: de::Error>(self, b: Vec<u8>) -> Result<RVec<u8>, E> {
            Ok(RVec::from(b))
        }
        // (JSON writes bytes as an array of numbers.)
        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<RVec<u8>, A::Error> {
            let mut out = Vec::with_capacity(seq.size_hint().unwrap_or(0));
            while let Some(b) = seq.next_element::<u8>()? {
                out.push(b);
            }
            Ok(RVec::from(out))
        }
    }

    /// Deserialises bytes written by [`serialize`].
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<RVec<u8>, D::Error> {
        d.deserialize_bytes(BytesVisitor)
    }
}
