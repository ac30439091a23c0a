//! The macros that make a plugin type loadable: [`export_plugin!`](crate::export_plugin) (a
//! `cdylib`'s library header) and [`register_builtin!`](crate::register_builtin) (a built-in
//! linked into the host). Both expand to paths through this crate (`$crate::...`), so a
//! plugin crate needs no direct abi_stable or inventory dependency.

/// Exports plugin type `$plugin` as the root module of a `cdylib`.
///
/// Writes the library header abi_stable's loader looks for (what `#[export_root_module]`
/// generates), with paths through this crate so plugin crates need no direct abi_stable
/// dependency. Use it in exactly one `cdylib` crate per plugin: the header is an unmangled
/// symbol, so two of them cannot be linked into one binary.
#[macro_export]
macro_rules! export_plugin {
    ($plugin:ty) => {
        fn __tandem_root_module() -> $crate::PluginModuleRef {
            $crate::sdk::module_of::<$plugin>()
        }

        /// Library header read by the Tandem host's loader.
        #[unsafe(export_name = "_1as_0lib_1header_0root_bmodule_bloader")]
        pub static TANDEM_PLUGIN_LIB_HEADER: $crate::abi_stable::library::LibHeader = {
            extern "C" fn erased_root_module() -> $crate::abi_stable::library::RootModuleResult {
                $crate::abi_stable::library::__call_root_module_loader(__tandem_root_module)
            }
            // SAFETY: `erased_root_module` returns the `PrefixRef` of a `PluginModuleRef`
            // erased by abi_stable's own loader helper, which is what `from_constructor`
            // requires for module type `PluginModuleRef`.
            unsafe {
                $crate::abi_stable::library::LibHeader::from_constructor::<$crate::PluginModuleRef>(
                    erased_root_module,
                    $crate::abi_stable::library::CheckTypeLayout::Yes,
                )
            }
        };
    };
}

/// Registers plugin type `$plugin` as a built-in of any binary that links this crate.
#[macro_export]
macro_rules! register_builtin {
    ($plugin:ty) => {
        $crate::inventory::submit! {
            $crate::module::BuiltinPlugin { root: $crate::sdk::module_of::<$plugin> }
        }
    };
}

#[cfg(test)]
mod tests {
    #[test]
    fn export_symbol_matches_abi_stable() {
        assert_eq!(
            abi_stable::library::ROOT_MODULE_LOADER_NAME,
            "_1as_0lib_1header_0root_bmodule_bloader"
        );
    }
}
