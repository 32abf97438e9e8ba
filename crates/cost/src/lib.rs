//! Scalar CPU evaluation and validation of CVRP solutions.
//!
//! This crate knows nothing of neural networks. It is the single source of truth for
//! what a feasible CVRP solution is and what it costs; every other part of routeburn
//! (decoders, heuristics, file readers, the CLI) goes through it.
//!
//! # Conventions
//! - Node 0 is the depot; customers are `1..=n`.
//! - A [`Solution`] is a list of routes, each a sequence of customer indices. The depot is
//!   implicit at both ends of every route.
//! - An *action sequence* is what a decoder emits: node indices in visiting order, `0` for a
//!   return to the depot, padded with trailing zeros (see [`Solution::from_actions`]).
//! - Demands are indexed by node: `node_demands[0]` is the depot's and is ignored.

mod action;
mod batch;
mod distance;
mod error;
mod solution;
mod validate;

pub use action::ActionIndex;
pub use batch::{batch_costs, validate_batch, BatchError, PARALLEL_MIN_EDGES};
pub use distance::{Distance, DistanceMatrix, Euclidean, Metric, RoundedEuclidean};
pub use error::SolutionError;
pub use solution::Solution;
pub use validate::{validate, validate_actions};
