use std::path::PathBuf;

use thiserror::Error;

/// Everything that can stop a command. Which exit status each maps to is decided in
/// `cli.rs` alone.
#[derive(Debug, Error)]
pub enum TrainError {
    /// An unreadable or malformed dataset, instance or solution file.
    #[error(transparent)]
    Data(#[from] routeburn_data::DataError),
    /// A backend that is not compiled in or cannot start.
    #[error(transparent)]
    Backend(#[from] routeburn_model::BackendError),
    /// A config file (or the embedded default) with a bad key or value.
    #[error("{origin}: {message}")]
    Config { origin: String, message: String },
    /// A checkpoint, run directory or weights file that cannot be used.
    #[error("{path}: {message}")]
    Checkpoint { path: PathBuf, message: String },
    /// Other bad input: a flag, a combination of flags, a file's contents.
    #[error("{0}")]
    Input(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The loss or the log-likelihood stopped being finite: the run stops before its next
    /// checkpoint, so the last good one stays intact.
    #[error("the {what} became {value} at epoch {epoch}, batch {batch}; stopping. The last good checkpoint in {} is intact: lower training.lr or training.max_grad_norm, then resume with --resume", checkpoints.display())]
    NonFinite {
        what: &'static str,
        value: String,
        epoch: usize,
        batch: usize,
        checkpoints: PathBuf,
    },
    /// SIGINT or SIGTERM stopped the run; what was saved and how to go on.
    #[error("{message}")]
    Interrupted { signal: i32, message: String },
    /// A decoded solution that the cost crate's validator rejects: a bug, never costed.
    #[error("the model emitted an infeasible solution: {0}")]
    Infeasible(String),
    /// The device failed while running or reading back queued work (on CUDA a kernel's
    /// fault, or memory that ran out mid-step, surfaces at the next read). Nothing is
    /// saved after it: the last checkpoint stays as it was.
    #[error("the device failed while reading {what}: {message}")]
    Device { what: String, message: String },
    /// A command that started and could not finish (drawing a plot, reading a backend's
    /// output).
    #[error("{0}")]
    Failed(String),
    /// Some of several independent items failed (each was reported as it failed).
    #[error("{0}")]
    Partial(String),
}

impl TrainError {
    /// A failed device read of `what`.
    pub fn device(what: &str, error: impl std::fmt::Display) -> Self {
        Self::Device {
            what: what.to_string(),
            message: error.to_string(),
        }
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    pub(crate) fn config(origin: impl Into<String>, message: impl Into<String>) -> Self {
        Self::Config {
            origin: origin.into(),
            message: message.into(),
        }
    }

    pub(crate) fn checkpoint(path: impl Into<PathBuf>, message: impl Into<String>) -> Self {
        Self::Checkpoint {
            path: path.into(),
            message: message.into(),
        }
    }

    /// A non-finite training statistic at `epoch`/`step` (both 0-based).
    pub(crate) fn non_finite(
        what: &'static str,
        value: f32,
        epoch: usize,
        step: usize,
        checkpoints: impl Into<PathBuf>,
    ) -> Self {
        let value = if value.is_nan() {
            "NaN".to_string()
        } else {
            value.to_string()
        };
        Self::NonFinite {
            what,
            value,
            epoch: epoch + 1,
            batch: step + 1,
            checkpoints: checkpoints.into(),
        }
    }
}
