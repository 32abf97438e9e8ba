//! Where a run's files are.

use std::path::{Path, PathBuf};

use crate::config::Config;

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

/// Makes a new run's input files absolute before its `config.toml` is written, so that a
/// resume from another working directory finds them: `validation.file` where it was found
/// (a missing one is left as given, for the validation set's error or the embedded
/// default's copy), `supervised.labels_file` where it is or where the run will write it.
pub(crate) fn pin_input_paths(config: &mut Config, config_dir: Option<&Path>) {
    let pinned = |file: &Path| {
        let found = resolve(file, config_dir);
        let exists = found.exists();
        let path = match exists {
            true => std::fs::canonicalize(&found),
            false => std::path::absolute(&found),
        };
        path.ok().map(|path| (exists, path))
    };
    if let Some((true, path)) = config.validation.file.as_deref().and_then(pinned) {
        config.validation.file = Some(path);
    }
    if let Some((_, path)) = config.supervised.labels_file.as_deref().and_then(pinned) {
        config.supervised.labels_file = Some(path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A validation file found beside the config, and labels not written yet: both become
    /// absolute, the labels where a run started in the working directory writes them; a
    /// missing validation file is left as given.
    #[test]
    fn input_paths_are_pinned_where_they_are_found() {
        let configs = std::env::temp_dir().join(format!("routeburn-pin-{}", std::process::id()));
        std::fs::create_dir_all(configs.join("sets")).unwrap();
        std::fs::write(configs.join("sets/val.jsonl"), "").unwrap();
        let mut config = Config::embedded_default();
        config.validation.file = Some("sets/val.jsonl".into());
        config.supervised.labels_file = Some("labels/new.jsonl".into());
        pin_input_paths(&mut config, Some(&configs.join("configs")));
        let found = std::fs::canonicalize(configs.join("sets/val.jsonl")).unwrap();
        assert_eq!(config.validation.file, Some(found));
        let cwd = std::env::current_dir().unwrap();
        assert_eq!(
            config.supervised.labels_file,
            Some(cwd.join("labels/new.jsonl"))
        );

        config.validation.file = Some("nowhere/val.jsonl".into());
        pin_input_paths(&mut config, Some(&configs));
        assert_eq!(config.validation.file, Some("nowhere/val.jsonl".into()));
        std::fs::remove_dir_all(&configs).ok();
    }
}
