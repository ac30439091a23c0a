//! The `suite!` macro: one `#[test]` per check of the chosen groups, sharing one engine and one
//! trainer per test binary (the `bridge` group builds its own per check).
//!
//! ```text
//! tandem_conformance::suite! {
//!     engine: my_engine(),          // fn call returning EngineSetup (needed by `engine`, `pair`, `bridge`)
//!     trainer: my_trainer(),        // fn call returning TrainerSetup (needed by `trainer`, `pair`, `bridge`)
//!     bridge: my_bridge(),          // fn call returning BridgeSetup (needed by `bridge`)
//!     environment: my_env(),        // fn call returning EnvironmentSetup (needed by `environment`)
//!     checks: [engine, trainer, pair],   // `features`: a trainer on hidden states; `bridge`
//!     no_digests: "why",            // optional: the pair carries no digests (checked instead)
//!     ignore: "why",                // optional: the whole suite needs something absent here
//! }
//! ```

/// Expands the conformance checks of the listed groups into `#[test]` functions.
#[macro_export]
macro_rules! suite {
    (
        $( engine: $engine:expr, )?
        $( trainer: $trainer:expr, )?
        $( bridge: $bridge:expr, )?
        $( environment: $environment:expr, )?
        checks: [ $( $group:ident ),* $(,)? ],
        $( no_digests: $nd:literal, )?
        $( ignore: $why:literal, )?
    ) => {
        // Unused when no group shares a component.
        #[allow(dead_code)]
        const __TANDEM_GROUPS: &[&str] = &[$( stringify!($group) ),*];
        $(
            // Unused when only the `bridge` group uses the setup.
            #[allow(dead_code)]
            static __TANDEM_ENGINE: $crate::Shared<$crate::EngineHarness> =
                $crate::Shared::new($crate::users(__TANDEM_GROUPS, "engine"));
            fn __tandem_engine_setup() -> $crate::EngineSetup {
                $engine
            }
        )?
        $(
            #[allow(dead_code)]
            static __TANDEM_TRAINER: $crate::Shared<$crate::TrainerHarness> =
                $crate::Shared::new($crate::users(__TANDEM_GROUPS, "trainer"));
            fn __tandem_trainer_setup() -> $crate::TrainerSetup {
                $trainer
            }
        )?
        $(
            fn __tandem_bridge_setup() -> $crate::BridgeSetup {
                $bridge
            }
        )?
        $(
            fn __tandem_environment_setup() -> $crate::EnvironmentSetup {
                $environment
            }
        )?
        $crate::__tandem_groups!({ $( $nd )? } { $( $why )? } $( $group )*);
    };
}

/// Expands each listed group with the suite's options (internal to [`suite!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __tandem_groups {
    ($nd:tt $why:tt) => {};
    ($nd:tt $why:tt $group:ident $( $rest:ident )*) => {
        $crate::__tandem_group!($group $nd $why);
        $crate::__tandem_groups!($nd $why $( $rest )*);
    };
}

/// One group of checks (internal to [`suite!`]).
#[doc(hidden)]
#[macro_export]
macro_rules! __tandem_group {
    (engine $nd:tt $why:tt) => {
        $crate::__tandem_engine_tests!(
            $why
            engine_declared_and_healthy = declared_and_healthy,
            engine_generate_is_well_formed = generate_is_well_formed,
            engine_score_agrees_with_generate = score_agrees_with_generate,
            engine_pause_modes = pause_modes,
            engine_release_and_resume = release_and_resume,
            engine_undeclared_updates = undeclared_updates,
            engine_follows_the_state_machine = follows_the_state_machine,
            engine_hidden_states_as_declared = hidden_states_as_declared,
        );
    };
    (trainer $nd:tt $why:tt) => {
        $crate::__tandem_trainer_tests!(
            $why
            trainer_init_twice = init_twice,
            trainer_snapshot_restore_round_trip = snapshot_restore_round_trip,
            trainer_save_load_keeps_version = save_load_keeps_version,
            trainer_offload_onload = offload_onload,
            trainer_undeclared_exports = undeclared_exports,
            trainer_policy_loss_default_is_train_step = policy_loss_default_is_train_step,
            trainer_value_model_as_declared = value_model_as_declared,
            trainer_token_advantages_as_declared = token_advantages_as_declared,
        );
        $crate::__tandem_trainer_tests!(
            $why
            trainer_features_not_supported_unless_declared = features_not_supported_unless_declared,
        );
    };
    (features $nd:tt $why:tt) => {
        $crate::__tandem_trainer_tests!(
            $why
            features_trains_on_features = trains_on_features,
            features_save_load_and_offload = save_load_and_offload,
            features_undeclared_exports = undeclared_exports,
        );
    };
    (pair $nd:tt $why:tt) => {
        // The pair checks get an engine of their own: the engine checks move its version
        // with updates of their own, which a trainer's exports must not have to outrun.
        static __TANDEM_PAIR_ENGINE: $crate::Shared<$crate::EngineHarness> =
            $crate::Shared::new($crate::users(__TANDEM_GROUPS, "pair_engine"));
        $crate::__tandem_pair_tests!(
            $why
            pair_exports_are_served = exports_are_served,
            pair_lower_version_refused = lower_version_refused,
            pair_keeps_two_versions = keeps_two_versions,
        );
        $crate::__tandem_digest_test!($nd $why);
    };
    (bridge $nd:tt $why:tt) => {
        $crate::__tandem_bridge_tests!(
            $why
            bridge_declared_and_planned = declared_and_planned,
            bridge_refuses_undeclared_kinds = refuses_undeclared_kinds,
            bridge_syncs_twice = syncs_twice,
            bridge_resident_tags_declared = resident_tags_declared,
        );
    };
    (environment $nd:tt $why:tt) => {
        $crate::__tandem_environment_tests!(
            $why
            environment_declared_and_described = declared_and_described,
            environment_items_are_deterministic = items_are_deterministic,
            environment_ids_are_unique = ids_are_unique,
            environment_held_out_is_not_in_train = held_out_is_not_in_train,
            environment_past_the_end = past_the_end,
            environment_one_reward_per_sample_in_order = one_reward_per_sample_in_order,
            environment_rewards_are_valid = rewards_are_valid,
            environment_empty_batch = empty_batch,
            environment_odd_completions_are_scored = odd_completions_are_scored,
        );
    };
}

/// Environment tests (internal).
#[doc(hidden)]
#[macro_export]
macro_rules! __tandem_environment_tests {
    ($why:tt $( $name:ident = $check:ident, )*) => {
        $(
            $crate::__tandem_test!($why $name {
                $crate::run_environment(
                    stringify!($name),
                    __tandem_environment_setup,
                    $crate::checks::environment::$check,
                );
            });
        )*
    };
}

/// Bridge tests (internal).
#[doc(hidden)]
#[macro_export]
macro_rules! __tandem_bridge_tests {
    ($why:tt $( $name:ident = $check:ident, )*) => {
        $(
            $crate::__tandem_test!($why $name {
                $crate::run_bridge(
                    stringify!($name),
                    (__tandem_bridge_setup, __tandem_engine_setup, __tandem_trainer_setup),
                    $crate::checks::bridge::$check,
                );
            });
        )*
    };
}

/// Engine tests (internal).
#[doc(hidden)]
#[macro_export]
macro_rules! __tandem_engine_tests {
    ($why:tt $( $name:ident = $check:ident, )*) => {
        $(
            $crate::__tandem_test!($why $name {
                $crate::run_engine(
                    stringify!($name),
                    &__TANDEM_ENGINE,
                    __tandem_engine_setup,
                    $crate::checks::engine::$check,
                );
            });
        )*
    };
}

/// Trainer tests (internal).
#[doc(hidden)]
#[macro_export]
macro_rules! __tandem_trainer_tests {
    ($why:tt $( $name:ident = $check:ident, )*) => {
        $(
            $crate::__tandem_test!($why $name {
                $crate::run_trainer(
                    stringify!($name),
                    &__TANDEM_TRAINER,
                    __tandem_trainer_setup,
                    $crate::checks::trainer::$check,
                );
            });
        )*
    };
}

/// Engine + trainer tests (internal).
#[doc(hidden)]
#[macro_export]
macro_rules! __tandem_pair_tests {
    ($why:tt $( $name:ident = $check:ident, )*) => {
        $(
            $crate::__tandem_test!($why $name {
                $crate::run_pair(
                    stringify!($name),
                    (&__TANDEM_PAIR_ENGINE, __tandem_engine_setup),
                    (&__TANDEM_TRAINER, __tandem_trainer_setup),
                    $crate::checks::pair::$check,
                );
            });
        )*
    };
}

/// The digest rule, or (declared digest-free) the check that no digest is carried (internal).
#[doc(hidden)]
#[macro_export]
macro_rules! __tandem_digest_test {
    ({ $nd:literal } $why:tt) => {
        // Declared digest-free: what is checked instead is that the declaration is true.
        $crate::__tandem_pair_tests!(
            $why
            pair_carries_no_digests = carries_no_digests,
        );
    };
    ({} $why:tt) => {
        $crate::__tandem_pair_tests!(
            $why
            pair_digest_mismatch_refused = digest_mismatch_refused,
            pair_syncs_carry_verified_digests = syncs_carry_verified_digests,
            pair_damaged_file_refused = damaged_file_refused,
        );
    };
}

/// One test, ignored with the suite's reason when it has one (internal).
#[doc(hidden)]
#[macro_export]
macro_rules! __tandem_test {
    ({ $( $why:literal )? } $name:ident $body:block) => {
        #[test]
        $( #[ignore = $why] )?
        fn $name() $body
    };
}
