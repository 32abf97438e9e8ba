//! CVRP instances: construction and validation, seeded generation, CVRPLIB `.vrp`/`.sol`
//! files, JSON Lines datasets, host-side batches for the models, and a classical heuristic
//! that labels instances for supervised training.
//!
//! Nodes are indexed depot first: node 0 is the depot and customers are `1..=n`, as in
//! [`routeburn_cost`].

mod batch;
mod error;
mod generate;
pub mod heuristic;
mod instance;
mod jsonl;
mod labels;
mod sol;
mod vrp;

pub use batch::{normalize_coords, Batch};
pub use error::{DataError, InstanceError};
pub use generate::{kool_capacity, Generator, GeneratorConfig, InstanceRng};
pub use heuristic::HeuristicConfig;
pub use instance::Instance;
pub use jsonl::{read_jsonl, write_jsonl, DatasetReader, Record};
pub use labels::{canonical, label_instances};
pub use sol::{format_sol, parse_sol, read_sol, write_sol, SolFile};
pub use vrp::{format_vrp, parse_vrp, read_vrp, write_vrp, MAX_NODES};
