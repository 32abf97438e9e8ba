//! One writer per run directory: `RUN_DIR/train.lock`, held with an OS file lock (released
//! by the OS when the process ends, however it ends), holding the writer's process id.

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::Path;

use crate::error::TrainError;

pub(crate) const LOCK_FILE: &str = "train.lock";

/// Held for as long as a run trains; dropping it (or the process dying) releases the lock.
pub(crate) struct RunLock {
    _file: File,
}

impl RunLock {
    pub(crate) fn acquire(run_dir: &Path) -> Result<Self, TrainError> {
        std::fs::create_dir_all(run_dir).map_err(|e| TrainError::io(run_dir, e))?;
        let path = run_dir.join(LOCK_FILE);
        let io = |e| TrainError::io(&path, e);
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io)?;
        match file.try_lock() {
            Ok(()) => {
                file.set_len(0).map_err(io)?;
                file.rewind().map_err(io)?;
                write!(file, "{}", std::process::id()).map_err(io)?;
                file.sync_all().map_err(io)?;
                Ok(Self { _file: file })
            }
            Err(TryLockError::WouldBlock) => {
                let mut pid = String::new();
                let _ = file.read_to_string(&mut pid);
                Err(TrainError::Input(format!(
                    "{}: another routeburn process (pid {}) is training this run; wait for it to finish or stop it (lock: {})",
                    run_dir.display(),
                    pid.trim(),
                    path.display()
                )))
            }
            Err(TryLockError::Error(e)) => Err(io(e)),
        }
    }
}
