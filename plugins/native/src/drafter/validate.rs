//! `validate_config` of the `native-drafter` trainer, and the static check of a drafter
//! directory both components name (`[trainer.options] drafter`, `[engine.options] drafter`):
//! its `config.json` read and held against the target's, no weights loaded.

use std::path::Path;

use tandem_native_core::config::ModelConfig;
use tandem_native_core::drafter::DrafterConfig;
use tandem_plugin_api::{ComponentConfig, ConfigProblem};

use super::DrafterOptions;
use crate::common::options_problems;

/// Every problem of the `native-drafter` trainer's options.
pub fn validate_config(config: &ComponentConfig) -> Vec<ConfigProblem> {
    let mut p = options_problems::<DrafterOptions>(&config.options_json);
    if !p.is_empty() {
        return p;
    }
    let Ok(opts) = tandem_plugin_api::sdk::parse_options::<DrafterOptions>(&config.options_json)
    else {
        return p;
    };
    if let Some(d) = &opts.drafter {
        p.extend(drafter_dir_problem(
            "drafter",
            d,
            config.model_path.as_str(),
        ));
    }
    if let Some(layers) = opts.aux_layers
        && let Ok(target) = ModelConfig::from_dir(Path::new(config.model_path.as_str()))
        && let Some(&bad) = layers.iter().find(|&&l| l >= target.num_hidden_layers)
    {
        p.push(
            ConfigProblem::new(
                "aux_layers",
                format!(
                    "layer id {bad} is out of range: the target has {} layers",
                    target.num_hidden_layers
                ),
            )
            .with_help("use three ids below the target's num_hidden_layers, e.g. [1, 2, 3]"),
        );
    }
    p
}

/// The problem with the drafter directory `dir` (option `key`) for the target in
/// `model_path`, if any. A target that does not exist yet (an `init_preset` run) is not
/// compared.
pub fn drafter_dir_problem(key: &str, dir: &str, model_path: &str) -> Option<ConfigProblem> {
    let path = Path::new(dir);
    let cfg = match DrafterConfig::from_dir(path, None) {
        Ok(c) => c,
        Err(e) => {
            return Some(
                ConfigProblem::new(key, e.to_string())
                    .with_help("point it at a drafter directory (config.json + model.safetensors), e.g. a native-drafter checkpoint"),
            );
        }
    };
    let target = ModelConfig::from_dir(Path::new(model_path)).ok()?;
    cfg.check_target(&target).err().map(|e| {
        ConfigProblem::new(key, format!("drafter {dir} does not fit the model: {e}"))
            .with_help("train a drafter for this model ([algorithm] name = \"drafter\")")
    })
}
