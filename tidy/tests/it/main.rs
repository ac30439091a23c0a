//! `tandem-tidy`'s integration tests: each rule failing on a small temporary tree
//! (`rules`), and the real tree passing every rule (`tree`).

mod common;

mod rules;
mod tree;
