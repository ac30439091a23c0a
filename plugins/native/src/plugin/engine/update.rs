//! Weight updates of the engine: a checkpoint directory reloaded in place (staged first, shapes
//! and config checked) and PEFT adapters loaded under a name.

use std::path::Path;

use tandem_plugin_api::PluginError;
use tandem_plugin_api::sdk::Result;

use super::{NativeEngine, lock};
use crate::config::ModelConfig;
use crate::lora::LoraAdapter;
use crate::plugin::common::Ctx;
use crate::st_io;

impl NativeEngine {
    pub(super) fn load_checkpoint_dir(&self, dir: &Path) -> Result<u64> {
        let cfg = ModelConfig::from_dir(dir).ctx("weight update")?;
        let mut guard = lock(&self.inner);
        let model = &mut guard.engine.model;
        if cfg != model.cfg {
            return Err(PluginError::invalid_input(format!(
                "weight update {}: config.json describes another architecture than the served \
                 model {}",
                dir.display(),
                self.model_dir.display()
            )));
        }
        let files = st_io::model_files(dir).ctx("weight update")?;
        // Load beside the served weights first, so a bad checkpoint leaves them untouched.
        let mut staged = vec![0f32; model.layout.total_len()];
        let tied = model.cfg.tie_word_embeddings;
        st_io::load_into(&files, &model.layout, &mut staged, &|n| {
            (!(tied && n == "lm_head.weight")).then(|| n.to_string())
        })
        .ctx(&format!("weight update {}", dir.display()))?;
        model.copy_weights_from(&staged).ctx("weight update")?;
        Ok((staged.len() * 4) as u64)
    }

    pub(super) fn add_adapter(&self, name: &str, dir: &Path) -> Result<u64> {
        let mut guard = lock(&self.inner);
        let inner = &mut *guard;
        let what = format!("adapter `{name}` from {}", dir.display());
        let ad = LoraAdapter::load(dir, &inner.engine.model.cfg, &mut inner.provider).ctx(&what)?;
        let bytes = (ad.layout.total_len() * 4) as u64;
        inner
            .engine
            .add_adapter(name, ad, &mut inner.provider)
            .ctx(&what)?;
        Ok(bytes)
    }
}
