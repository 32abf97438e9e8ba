use std::path::PathBuf;
use thiserror::Error;

/// A violated invariant of [`crate::Instance`].
#[derive(Debug, Clone, PartialEq, Error)]
pub enum InstanceError {
    #[error("an instance needs at least one customer")]
    NoCustomers,
    #[error("node {node} has a non-finite coordinate ({x}, {y})")]
    NonFiniteCoordinate { node: usize, x: f64, y: f64 },
    #[error("vehicle capacity must be at least 1")]
    ZeroCapacity,
    #[error(
        "customer {customer} has demand {demand}; expected 1 <= demand <= capacity {capacity}"
    )]
    BadDemand {
        customer: usize,
        demand: u32,
        capacity: u32,
    },
    #[error("{what}: expected {expected} entries, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    #[error("distance matrix entry ({i}, {j}) is {value}; expected a finite, non-negative number")]
    BadDistance { i: usize, j: usize, value: f64 },
    #[error("batch instances must have the same number of customers: {first} and {other}")]
    MixedSizes { first: usize, other: usize },
    #[error("instance has no coordinates (EXPLICIT distances without display data); the models need coordinates")]
    NoCoordinates,
}

/// An error reading or writing instance, solution or dataset files.
#[derive(Debug, Error)]
pub enum DataError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// Malformed input: names the file, the 1-based line (0 when the problem is the file
    /// as a whole, e.g. a missing section) and what was expected.
    #[error("{}{}: {message}", path.display(), if *line > 0 { format!(":{line}") } else { String::new() })]
    Format {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: instance `{name}`: {source}", path.display())]
    Instance {
        path: PathBuf,
        name: String,
        #[source]
        source: InstanceError,
    },
}

impl DataError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Self::Io {
            path: path.into(),
            source,
        }
    }
    pub(crate) fn format(
        path: impl Into<PathBuf>,
        line: usize,
        message: impl Into<String>,
    ) -> Self {
        Self::Format {
            path: path.into(),
            line,
            message: message.into(),
        }
    }
}
