//! Training loops, baselines, checkpoints, metrics and the `routeburn` command line.

pub mod allocator;
pub mod baseline;
pub mod checkpoint;
pub mod cli;
pub mod clip;
pub mod commands;
pub mod config;
pub mod error;
pub mod evaluate;
pub mod inference;
pub mod metrics;
pub mod plot;
pub mod supervised;
pub mod training;

pub use error::CliError;
