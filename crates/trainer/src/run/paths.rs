//! Where a run's files are.

use std::path::{Path, PathBuf};

/// `path` as given if it exists, else relative to the config's directory or one of its
/// parents (the shipped configs in `configs/` name files from the repository root, so they
/// work from any working directory).
pub(crate) fn resolve(path: &Path, config_dir: Option<&Path>) -> PathBuf {
    if path.is_absolute() || path.exists() {
        return path.to_path_buf();
    }
    config_dir
        .into_iter()
        .flat_map(Path::ancestors)
        .map(|d| d.join(path))
        .find(|p| p.exists())
        .unwrap_or_else(|| path.to_path_buf())
}
