//! The run skeleton and what every training method shares: the run directory, device,
//! seeding, resume, the epoch loop, validation, metrics, progress and checkpoints.

pub(crate) mod averaging;
pub(crate) mod checkpoint;
pub(crate) mod interrupt;
pub(crate) mod lock;
pub(crate) mod lr_schedule;
pub(crate) mod method;
pub(crate) mod metrics;
pub(crate) mod paths;
pub(crate) mod progress;
pub(crate) mod skeleton;
pub(crate) mod validation;
