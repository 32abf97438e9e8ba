//! Files replaced whole: written beside their final name, synced, then renamed into place,
//! so a reader (or a run killed half-way) sees the old file or the new one, never a mix.

use std::fs::File;
use std::io::Write;
use std::path::Path;

use crate::error::TrainError;

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let io = |e| TrainError::io(&tmp, e);
    let mut f = File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| TrainError::io(path, e))
}
