//! Files replaced whole: written beside their final name, synced, then renamed into place
//! and the directory synced, so a reader (or a run killed half-way, or a power cut) sees
//! the old file or the new one, never a mix or nothing.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::TrainError;

/// Writes `bytes` to `path` (its directory made if missing) through a temporary file in
/// the same directory and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    create_parent(path)?;
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let written = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        // The user named `path`; the temporary file is ours.
        return Err(TrainError::io(path, e));
    }
    std::fs::rename(&tmp, path).map_err(|e| TrainError::io(path, e))?;
    sync_parent(path)
}

/// Makes the directory an output file goes into, as `gen --out nested/file.jsonl` expects.
pub(crate) fn create_parent(path: &Path) -> Result<(), TrainError> {
    match path.parent().filter(|p| !p.as_os_str().is_empty()) {
        Some(parent) => std::fs::create_dir_all(parent).map_err(|e| TrainError::io(parent, e)),
        None => Ok(()),
    }
}

/// Makes a rename inside `path`'s directory durable.
pub(crate) fn sync_parent(path: &Path) -> Result<(), TrainError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| TrainError::io(dir, e))
}
