//! `tandem-tidy`'s integration tests: each rule failing on a small temporary tree
//! (`rules`), and the real tree passing every rule (`tree`).

#![allow(clippy::unwrap_used, clippy::expect_used)] // tests may unwrap

mod common;

mod host_names;
mod rules;
mod tree;
