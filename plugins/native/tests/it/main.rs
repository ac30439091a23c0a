//! `tandem-plugin-native`'s integration tests: the plugin contract (`conformance`) and the
//! trainer's `init_preset` options through the root module (`init_preset`).

mod conformance;
mod init_preset;
