//! Writing a model directory atomically: [`DirWriter`] builds it in a hidden sibling and
//! renames it into place, so a reader (or a failure) never sees half a directory; and the
//! file writers every producer shares (JSON, f32 safetensors).

use crate::error::{ModelError, Result};
use std::path::{Path, PathBuf};

/// A directory being written: `publish` renames it to its target; dropping it unpublished
/// removes it.
#[derive(Debug)]
pub struct DirWriter {
    tmp: PathBuf,
    target: PathBuf,
    published: bool,
}

impl DirWriter {
    /// Starts writing `target`, which must not exist or be an empty directory.
    pub fn new(target: &Path) -> Result<DirWriter> {
        if target.is_file() {
            return Err(ModelError::invalid(target, "is a file")
                .with_help("give a path for a new directory"));
        }
        if let Ok(mut entries) = std::fs::read_dir(target)
            && entries.next().is_some()
        {
            return Err(ModelError::invalid(target, "exists and is not empty")
                .with_help("choose a new output directory, or remove this one"));
        }
        let name = target
            .file_name()
            .ok_or_else(|| ModelError::invalid(target, "has no directory name"))?
            .to_string_lossy()
            .into_owned();
        let parent = match target.parent() {
            Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
            _ => PathBuf::from("."),
        };
        std::fs::create_dir_all(&parent).map_err(ModelError::io(&parent))?;
        let tmp = parent.join(format!(".{name}.tmp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp).map_err(ModelError::io(&tmp))?;
        Ok(DirWriter {
            tmp,
            target: target.to_path_buf(),
            published: false,
        })
    }

    /// The directory to write into.
    pub fn dir(&self) -> &Path {
        &self.tmp
    }

    /// Moves the finished directory to its target.
    pub fn publish(mut self) -> Result<PathBuf> {
        if self.target.is_dir() {
            // Checked empty in `new`; `remove_dir` refuses if something appeared since.
            std::fs::remove_dir(&self.target).map_err(ModelError::io(&self.target))?;
        }
        std::fs::rename(&self.tmp, &self.target).map_err(ModelError::io(&self.target))?;
        self.published = true;
        Ok(self.target.clone())
    }
}

impl Drop for DirWriter {
    fn drop(&mut self) {
        if !self.published {
            let _ = std::fs::remove_dir_all(&self.tmp);
        }
    }
}

/// Writes `value` as pretty JSON.
pub fn write_json(path: &Path, value: &serde_json::Value) -> Result<()> {
    let text = serde_json::to_string_pretty(value)
        .map_err(|e| ModelError::invalid(path, format!("encoding JSON: {e}")))?;
    std::fs::write(path, text + "\n").map_err(ModelError::io(path))
}

/// Writes `(name, shape, values)` tensors as one f32 safetensors file (`{"format": "pt"}`).
pub fn safetensors_f32(path: &Path, tensors: &[(String, Vec<usize>, Vec<f32>)]) -> Result<()> {
    let views = tensors
        .iter()
        .map(|(name, shape, values)| {
            safetensors::tensor::TensorView::new(
                safetensors::Dtype::F32,
                shape.clone(),
                bytemuck::cast_slice(values),
            )
            .map(|v| (name.clone(), v))
        })
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| ModelError::invalid(path, format!("building tensors: {e}")))?;
    let meta = std::collections::HashMap::from([("format".to_owned(), "pt".to_owned())]);
    safetensors::serialize_to_file(views, Some(meta), path)
        .map_err(|e| ModelError::invalid(path, format!("writing safetensors: {e}")))
}
