//! The `native` plugin as a `cdylib`: exports [`tandem_plugin_native::NativePlugin`]'s
//! root module. The built-in copy is linked into the host as an rlib (see ARCHITECTURE.md:
//! the library header is an unmangled symbol, so it lives in its own crate).

#![forbid(unsafe_code)]

tandem_plugin_api::export_plugin!(tandem_plugin_native::NativePlugin);
