//! What a region is: its [`Tag`], element type ([`DType`]), [`BackupPolicy`], and the
//! [`RegionSpec`] that asks for one. All three enums print and parse as the lower-case names used
//! in job files and ledger reports (`weights`, `kv_cache`, `bf16`, `cpu`, ...).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::error::MemoryError;

/// What a region holds. `pause`, `resume`, `keep_resident` and `snapshot` select regions by tag.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Tag {
    /// Model parameters.
    Weights,
    /// Attention key/value cache.
    KvCache,
    /// Optimizer state.
    Optimizer,
    /// Gradients.
    Grads,
    /// Activations kept for backward.
    Activations,
    /// Draft model (speculative decoding).
    Drafter,
    /// Any other name: lower-case ASCII letters, digits, `_`, `-`, `.`; at most 64 bytes.
    Custom(String),
}

const BUILTIN_TAGS: [(&str, Tag); 6] = [
    ("weights", Tag::Weights),
    ("kv_cache", Tag::KvCache),
    ("optimizer", Tag::Optimizer),
    ("grads", Tag::Grads),
    ("activations", Tag::Activations),
    ("drafter", Tag::Drafter),
];

impl Tag {
    /// The tag's name, as printed and parsed.
    pub fn name(&self) -> &str {
        match self {
            Tag::Weights => "weights",
            Tag::KvCache => "kv_cache",
            Tag::Optimizer => "optimizer",
            Tag::Grads => "grads",
            Tag::Activations => "activations",
            Tag::Drafter => "drafter",
            Tag::Custom(s) => s,
        }
    }
}

impl fmt::Display for Tag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Tag {
    type Err = MemoryError;

    /// Built-in names map to their variant (so `"weights"` is never a `Custom`); any other valid
    /// name becomes [`Tag::Custom`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Some((_, t)) = BUILTIN_TAGS.iter().find(|(n, _)| *n == s) {
            return Ok(t.clone());
        }
        let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "_-.".contains(c);
        if s.is_empty() || s.len() > 64 || !s.chars().all(ok_char) {
            return Err(MemoryError::Parse {
                what: "tag",
                value: s.to_string(),
                help: "use weights, kv_cache, optimizer, grads, activations, drafter, or a custom \
                       name of 1-64 lower-case letters, digits, `_`, `-` or `.`"
                    .to_string(),
            });
        }
        Ok(Tag::Custom(s.to_string()))
    }
}

impl From<Tag> for String {
    fn from(t: Tag) -> String {
        t.name().to_string()
    }
}

impl TryFrom<String> for Tag {
    type Error = MemoryError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        s.parse()
    }
}

macro_rules! named_enum {
    ($(#[$m:meta])* $name:ident, $what:literal, { $($(#[$vm:meta])* $var:ident = $s:literal $(: $size:literal)?),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(into = "String", try_from = "String")]
        pub enum $name { $($(#[$vm])* $var),+ }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$var),+];
            /// The lower-case name.
            pub fn name(self) -> &'static str {
                match self { $($name::$var => $s),+ }
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result { f.write_str(self.name()) }
        }
        impl FromStr for $name {
            type Err = MemoryError;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                $name::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| MemoryError::Parse {
                    what: $what,
                    value: s.to_string(),
                    help: format!("expected one of: {}",
                        $name::ALL.iter().map(|v| v.name()).collect::<Vec<_>>().join(", ")),
                })
            }
        }
        impl From<$name> for String {
            fn from(v: $name) -> String { v.name().to_string() }
        }
        impl TryFrom<String> for $name {
            type Error = MemoryError;
            fn try_from(s: String) -> Result<Self, Self::Error> { s.parse() }
        }
    };
}

named_enum!(
    /// Element type of a region (metadata for bridges and typed views).
    DType, "dtype", {
        /// 32-bit float.
        F32 = "f32",
        /// 64-bit float.
        F64 = "f64",
        /// IEEE half.
        F16 = "f16",
        /// bfloat16.
        BF16 = "bf16",
        /// Unsigned byte.
        U8 = "u8",
        /// Signed byte.
        I8 = "i8",
        /// 16-bit signed.
        I16 = "i16",
        /// 16-bit unsigned.
        U16 = "u16",
        /// 32-bit signed.
        I32 = "i32",
        /// 32-bit unsigned.
        U32 = "u32",
        /// 64-bit signed.
        I64 = "i64",
        /// 64-bit unsigned.
        U64 = "u64",
    }
);

impl DType {
    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::U8 | DType::I8 => 1,
            DType::F16 | DType::BF16 | DType::I16 | DType::U16 => 2,
            DType::F32 | DType::I32 | DType::U32 => 4,
            DType::F64 | DType::I64 | DType::U64 => 8,
        }
    }
}

named_enum!(
    /// What `pause` does with a region's contents.
    BackupPolicy, "backup policy", {
        /// Copy to ordinary CPU memory on pause; `resume` restores bit-exact.
        Cpu = "cpu",
        /// Drop the contents; `resume` brings the region back zeroed (e.g. a KV cache).
        Discard = "discard",
    }
);

/// A request for a region: tag, size in bytes, element type, backup policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionSpec {
    /// What the region holds.
    pub tag: Tag,
    /// Size in bytes; must be a positive multiple of `dtype.size_bytes()`.
    pub size: usize,
    /// Element type.
    pub dtype: DType,
    /// What pause does with the contents.
    pub backup: BackupPolicy,
}

impl RegionSpec {
    /// A spec with the default policy ([`BackupPolicy::Cpu`]).
    pub fn new(tag: Tag, size: usize, dtype: DType) -> Self {
        RegionSpec {
            tag,
            size,
            dtype,
            backup: BackupPolicy::Cpu,
        }
    }

    /// The same spec with another backup policy.
    pub fn with_backup(mut self, backup: BackupPolicy) -> Self {
        self.backup = backup;
        self
    }

    /// Checks size against the element type.
    pub(crate) fn validate(&self) -> Result<(), MemoryError> {
        if self.size == 0 {
            return Err(MemoryError::ZeroSize {
                tag: self.tag.to_string(),
            });
        }
        let elem = self.dtype.size_bytes();
        if !self.size.is_multiple_of(elem) {
            return Err(MemoryError::PartialElement {
                tag: self.tag.to_string(),
                size: self.size,
                dtype: self.dtype.to_string(),
                elem,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn tags_round_trip_through_text() {
        for (name, tag) in BUILTIN_TAGS.iter() {
            assert_eq!(tag.to_string(), *name);
            assert_eq!(name.parse::<Tag>().unwrap(), *tag);
        }
        assert_eq!(
            "lora.a".parse::<Tag>().unwrap(),
            Tag::Custom("lora.a".into())
        );
        let err = "Bad Tag".parse::<Tag>().unwrap_err().to_string();
        assert!(err.contains("invalid tag `Bad Tag`"), "{err}");
    }

    #[test]
    fn dtypes_and_policies_parse() {
        assert_eq!("bf16".parse::<DType>().unwrap(), DType::BF16);
        assert_eq!(DType::BF16.size_bytes(), 2);
        assert_eq!(
            "discard".parse::<BackupPolicy>().unwrap(),
            BackupPolicy::Discard
        );
        let err = "fp8".parse::<DType>().unwrap_err().to_string();
        assert!(err.contains("expected one of: f32, f64"), "{err}");
    }

    #[test]
    fn spec_validation_names_the_tag() {
        let e = RegionSpec::new(Tag::Grads, 6, DType::F32)
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("`grads`"), "{e}");
        let e = RegionSpec::new(Tag::Grads, 0, DType::F32)
            .validate()
            .unwrap_err();
        assert!(matches!(e, MemoryError::ZeroSize { .. }));
    }
}
