//! Training loops, baselines, checkpoints, metrics and the `routeburn` command line.
//!
//! The API is what a program needs to train: [`train`] with [`TrainOptions`] and a
//! [`config::Config`], the [`TrainSummary`] it returns, and the [`cli`] itself.

pub mod allocator;
pub mod cli;
pub mod config;
pub mod error;

mod adam;
mod atomic;
mod commands;
mod evaluate;
mod export;
mod import;
mod inference;
mod memory;
mod plot;
mod reinforce;
mod run;
mod shards;
mod supervised;
mod training;

/// Byte-level mutations of valid files, for the parsers' property tests.
#[cfg(test)]
#[path = "../../data/tests/common/mutate.rs"]
mod mutate;

pub use error::TrainError;
pub use run::metrics::{EpochMetrics, Phase, PhaseTimes};
pub use run::skeleton::{TrainOptions, TrainSummary};
pub use training::train;
