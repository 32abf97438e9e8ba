//! `train`: a run of the training method that fits the config's model.

use crate::config::ModelKind;
use crate::error::TrainError;
use crate::reinforce::Reinforce;
use crate::run::skeleton::{run, TrainOptions, TrainSummary};
use crate::supervised::Supervised;

/// Runs (or resumes) a training run to completion: REINFORCE for the attention model,
/// teacher forcing on heuristic labels for the pointer network.
pub fn train(opts: TrainOptions) -> Result<TrainSummary, TrainError> {
    match opts.config.model_kind() {
        ModelKind::Attention => run::<Reinforce>(opts),
        ModelKind::Pointer => run::<Supervised>(opts),
    }
}
