use thiserror::Error;

/// Everything that can stop a command, with the exit status it maps to.
#[derive(Debug, Error)]
pub enum CliError {
    /// Unreadable or malformed input (file, config, flag): exit status 2.
    #[error(transparent)]
    Data(#[from] routeburn_data::DataError),
    #[error(transparent)]
    Backend(#[from] routeburn_model::BackendError),
    #[error("{0}")]
    Input(String),
    #[error("{path}: {source}")]
    Io {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A run that started but could not go on (NaN loss, ...): exit status 1.
    #[error("{0}")]
    Failed(String),
}

impl CliError {
    pub fn io(path: impl Into<std::path::PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }

    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Failed(_) => 1,
            _ => 2,
        }
    }
}
