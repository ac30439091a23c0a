//! The host's one view of a role: the [`Engine`] and [`Trainer`] traits, whatever runs the
//! component.
//!
//! Both are generated from the role table ([`tandem_control::roles`]), with their two
//! implementations: the handle of a component in a worker process ([`RemoteEngine`],
//! [`RemoteTrainer`]: a plugin error comes back as [`RuntimeError::Plugin`] naming the worker
//! and the method; a timeout, a dead worker or a protocol error as [`RuntimeError::Control`]),
//! and a component in this process ([`Local`]: a plugin error comes back as
//! [`RuntimeError::Plugin`] naming the method). The remote handles also have every method as
//! an inherent method, so callers need not import the traits.
//!
//! The methods take and return the ABI's data types (`GenerateRequest`, `WeightUpdate`, ...)
//! except where a plain Rust type reads better at the call site: `&str` for a name or a
//! directory, `&[String]` for memory tags, `Vec<Vec<_>>` for token and logprob rows, and
//! `Vec<Metric>` for metrics.

use crate::error::RuntimeError;
use crate::launch::{RemoteEngine, RemoteTrainer};
use tandem_control::protocol::{Call, EngineCall, EngineReply, Reply, TrainerCall, TrainerReply};
use tandem_control::roles::vocabulary::*;

/// A component in this process, behind the host traits: `Local<EngineBox>` is an [`Engine`],
/// `Local<TrainerBox>` a [`Trainer`].
pub struct Local<B>(pub B);

/// A host-side argument standing for the table's spec `S` (the ABI type, or [`Rows`]).
trait Arg<S> {
    /// The spec's value: sent as is (a remote call), or made the ABI value with `into` (an
    /// in-process call; the identity but for [`Rows`]).
    fn spec(self) -> S;
}

/// A host-side result standing for the table's spec `S`.
trait Ret<S>: Sized {
    /// From the spec's value (a remote reply, or an in-process result after `into`).
    fn from_spec(spec: S) -> Self;
}

impl<T> Arg<T> for T {
    fn spec(self) -> T {
        self
    }
}

impl Arg<RString> for &str {
    fn spec(self) -> RString {
        RString::from(self)
    }
}

impl Arg<RVec<RString>> for &[String] {
    fn spec(self) -> RVec<RString> {
        self.iter().map(|s| RString::from(s.as_str())).collect()
    }
}

impl Arg<Rows<u32>> for Vec<Vec<u32>> {
    fn spec(self) -> Rows<u32> {
        Rows::from(self)
    }
}

impl<T> Ret<T> for T {
    fn from_spec(spec: T) -> T {
        spec
    }
}

impl<T> Ret<RVec<T>> for Vec<T> {
    fn from_spec(spec: RVec<T>) -> Vec<T> {
        spec.into_vec()
    }
}

impl Ret<Rows<f32>> for Vec<Vec<f32>> {
    fn from_spec(spec: Rows<f32>) -> Vec<Vec<f32>> {
        spec.into()
    }
}

/// Generates, per role of the table: the host trait, the remote handle's inherent methods,
/// its implementation of the trait, and [`Local`]'s.
macro_rules! role_surface {
    (@host $spec:ty) => { $spec };
    (@host $spec:ty, $host:ty) => { $host };
    ($(
        $(#[$role_doc:meta])*
        $Role:ident {
            receiver: $receiver:ty,
            abi: &$(mut)? $Abi:ty,
            call: $Call:ident,
            reply: $Reply:ident,
            remote: $Remote:ident $(,)?
        } {$(
            $(#[$doc:meta])*
            $V:ident $name:ident ($($arg:ident: $spec:ty $(as $host:ty)?),* $(,)?)
                -> $ret:ty $(as $ret_host:ty)? $([$speed:ident])?;
        )*}
    )*) => {$(
        $(#[$role_doc])*
        pub trait $Role {$(
            $(#[$doc])*
            fn $name(
                self: $receiver,
                $($arg: role_surface!(@host $spec $(, $host)?)),*
            ) -> Result<role_surface!(@host $ret $(, $ret_host)?), RuntimeError>;
        )*}

        impl $Remote {$(
            $(#[$doc])*
            pub fn $name(
                &self,
                $($arg: role_surface!(@host $spec $(, $host)?)),*
            ) -> Result<role_surface!(@host $ret $(, $ret_host)?), RuntimeError> {
                let call = $Call::$V { $($arg: Arg::<$spec>::spec($arg)),* };
                self.request(Call::$Role(call), |reply| match reply {
                    Reply::$Role($Reply::$V(r)) => Ok(Ret::<$ret>::from_spec(r)),
                    other => Err(other.kind()),
                })
            }
        )*}

        impl $Role for $Remote {$(
            fn $name(
                self: $receiver,
                $($arg: role_surface!(@host $spec $(, $host)?)),*
            ) -> Result<role_surface!(@host $ret $(, $ret_host)?), RuntimeError> {
                $Remote::$name(self, $($arg),*)
            }
        )*}

        impl $Role for Local<$Abi> {$(
            fn $name(
                self: $receiver,
                $($arg: role_surface!(@host $spec $(, $host)?)),*
            ) -> Result<role_surface!(@host $ret $(, $ret_host)?), RuntimeError> {
                self.0
                    .$name($(Arg::<$spec>::spec($arg).into()),*)
                    .into_result()
                    .map(|r| Ret::<$ret>::from_spec(r.into()))
                    .map_err(|e| RuntimeError::plugin(concat!("`", stringify!($name), "`"), e))
            }
        )*}
    )*};
}

tandem_control::role_table!(role_surface);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)] // tests may unwrap

    use super::*;
    use std::sync::Mutex;
    use tandem_plugin_api::ErrorCode;
    use tandem_plugin_api::sdk::{self, EngineImpl};

    /// Remembers the memory tags it was asked to release; scores each token as its id.
    #[derive(Default)]
    struct Probe(Mutex<Vec<String>>);

    impl EngineImpl for Probe {
        fn component(&self) -> &str {
            "probe"
        }
        fn health(&self) -> sdk::Result<EngineHealth> {
            Ok(EngineHealth {
                ready: true,
                weight_version: 3,
                detail: "probe".into(),
            })
        }
        fn score(&self, sequences: Vec<RVec<u32>>) -> sdk::Result<Vec<RVec<f32>>> {
            let row = |s: &RVec<u32>| s.iter().map(|&t| t as f32).collect();
            Ok(sequences.iter().map(row).collect())
        }
        fn release_memory(&self, tags: Vec<String>) -> sdk::Result<()> {
            self.0.lock().unwrap().extend(tags);
            Ok(())
        }
    }

    /// Any engine, through the host trait only.
    fn exercise(engine: &impl Engine) -> Result<(u64, Vec<Vec<f32>>), RuntimeError> {
        engine.release_memory(&["kv_cache".to_owned(), "weights".to_owned()])?;
        Ok((
            engine.health()?.weight_version,
            engine.score(vec![vec![1, 2]])?,
        ))
    }

    #[test]
    fn a_local_engine_serves_the_host_trait() {
        let local = Local(sdk::engine_box(Probe::default()));
        let (version, rows) = exercise(&local).unwrap();
        assert_eq!((version, rows), (3, vec![vec![1.0, 2.0]]));
        // The plugin error keeps its code and gets the method's name as context.
        let err = local.flush_cache().unwrap_err();
        assert!(
            matches!(&err, RuntimeError::Plugin { source, .. } if source.code == ErrorCode::NotSupported),
            "{err:?}"
        );
        assert!(err.to_string().starts_with("`flush_cache`: "), "{err}");
    }
}
