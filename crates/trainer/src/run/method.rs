//! What a training method is, apart from the loop that runs it (`run::skeleton`): its
//! model, one step's loss, and what it keeps between epochs and across a resume.

use std::path::{Path, PathBuf};

use burn::module::Module;
use burn::tensor::{Device, Tensor, TensorData};
use routeburn_data::InstanceRng;
use routeburn_model::Policy;

use crate::config::Config;
use crate::error::TrainError;
use crate::run::checkpoint::{BaselineState, TrainState};
use crate::run::metrics::{EpochMetrics, PhaseTimes};
use crate::shards::ShardedStep;

/// What the skeleton hands a method to set itself up.
pub(crate) struct Setup<'a> {
    pub(crate) config: &'a Config,
    pub(crate) run_dir: &'a Path,
    /// Base directory for relative paths in the config.
    pub(crate) config_dir: Option<&'a Path>,
    /// The inference device (no autodiff).
    pub(crate) device: &'a Device,
    pub(crate) verbose: bool,
    /// The checkpoint a resumed run continues from, and its state.
    pub(crate) resume: Option<(&'a Path, &'a TrainState)>,
}

/// The random streams of a run, saved in every checkpoint.
pub(crate) struct RunRngs {
    /// Training instances and the order of labelled examples.
    pub(crate) train: InstanceRng,
    /// Sampling noise of the training decodes.
    pub(crate) noise: InstanceRng,
}

/// What the skeleton hands a method for one step.
pub(crate) struct StepContext<'a> {
    pub(crate) epoch: usize,
    pub(crate) step: usize,
    /// The training (autodiff) device.
    pub(crate) device: &'a Device,
    pub(crate) rngs: &'a mut RunRngs,
    pub(crate) times: &'a mut PhaseTimes,
    pub(crate) stats: &'a mut StepStats,
}

/// One step's loss, its gradients (summed over the shards) and what its rows cost.
pub(crate) struct StepLoss {
    /// The loss, the gradients and the running statistics of the shards.
    pub(crate) learned: ShardedStep,
    /// Summed cost of the step's tours (sampled, or the labels').
    pub(crate) cost_sum: f64,
    /// Summed baseline value of those tours (a supervised step: the labels' cost).
    pub(crate) baseline_sum: f64,
    /// Tours summed above.
    pub(crate) rows: usize,
    /// Instances trained on.
    pub(crate) instances: usize,
}

/// A training method: REINFORCE or supervised teacher forcing.
pub(crate) trait TrainingMethod: Sized {
    type Model: Module + Policy + Send + Sync;

    /// Whether a checkpoint part-way through an epoch resumes exactly (an interrupted run
    /// saves one); otherwise an interrupted epoch is abandoned and redone.
    const RESUMES_MID_EPOCH: bool = false;

    /// A freshly initialised model (Burn's RNG is seeded and locked around the call).
    fn init_model(config: &Config, device: &Device) -> Result<Self::Model, TrainError>;

    /// The method's state, fresh (`model` is the initial model) or from `setup.resume`.
    fn start(setup: Setup, model: &Self::Model) -> Result<Self, TrainError>;

    fn steps_per_epoch(&self) -> usize;

    /// Before an epoch's first step.
    fn begin_epoch(&mut self, _epoch: usize, _rngs: &mut RunRngs) {}

    /// One step's forward and backward passes, over `training.shards` shards; the previous
    /// step's statistics are read with this step's device read (see [`StepStats`]).
    fn step(&mut self, model: &Self::Model, ctx: StepContext) -> Result<StepLoss, TrainError>;

    /// After validation, with an inference copy of the model: whether a baseline changed.
    fn end_epoch(&mut self, _model: &Self::Model, _verbose: bool) -> Result<bool, TrainError> {
        Ok(false)
    }

    /// Writes the method's own tensors into a checkpoint directory, and its state.
    fn save(&self, _dir: &Path, _state: &mut BaselineState) -> Result<(), TrainError> {
        Ok(())
    }

    /// The epoch's costs for the summary line.
    fn describe_costs(metrics: &EpochMetrics) -> String;
}

/// The loss and gradient norm of past steps. A step's statistics stay on the device until
/// the next step reads the device anyway (or the epoch ends), so the NaN guard costs no
/// sync of its own.
pub(crate) struct StepStats {
    pending: Option<Tensor<1>>,
    /// Steps whose statistics were read, and their sums.
    pub(crate) seen: usize,
    pub(crate) loss_sum: f64,
    pub(crate) grad_norm_sum: f64,
    /// Named in the NaN error: the checkpoints that stay intact.
    checkpoints: PathBuf,
}

impl StepStats {
    pub(crate) fn new(checkpoints: PathBuf) -> Self {
        Self {
            pending: None,
            seen: 0,
            loss_sum: 0.0,
            grad_norm_sum: 0.0,
            checkpoints,
        }
    }

    /// Keeps `[loss, grad norm]` of the step just taken.
    pub(crate) fn set_pending(&mut self, stats: Tensor<1>) {
        self.pending = Some(stats);
    }

    /// The previous step's statistics, for a method to add to its own device read.
    pub(crate) fn take_pending(&mut self) -> Option<Tensor<1>> {
        self.pending.take()
    }

    /// Folds in statistics read from the device (`step`: the step they belong to).
    pub(crate) fn record(
        &mut self,
        data: TensorData,
        epoch: usize,
        step: usize,
    ) -> Result<(), TrainError> {
        let s: Vec<f32> = data
            .try_into_vec_as::<f32>()
            .map_err(|e| TrainError::Input(format!("step statistics: {e:?}")))?;
        if !s[0].is_finite() {
            return Err(self.non_finite("loss", s[0], epoch, step));
        }
        self.loss_sum += s[0] as f64;
        self.grad_norm_sum += s[1] as f64;
        self.seen += 1;
        Ok(())
    }

    /// Reads the pending statistics on their own (the epoch's last step, or a method whose
    /// step has no device read).
    pub(crate) fn flush(&mut self, epoch: usize, step: usize) -> Result<(), TrainError> {
        match self.pending.take() {
            Some(p) => {
                let data = p
                    .try_into_data()
                    .map_err(|e| TrainError::device("the loss and gradient norm", e))?;
                self.record(data, epoch, step)
            }
            None => Ok(()),
        }
    }

    pub(crate) fn non_finite(
        &self,
        what: &'static str,
        value: f32,
        epoch: usize,
        step: usize,
    ) -> TrainError {
        TrainError::non_finite(what, value, epoch, step, &self.checkpoints)
    }

    /// Statistics of the steps an interrupted epoch had taken (none pending).
    pub(crate) fn restored(
        checkpoints: PathBuf,
        seen: usize,
        loss_sum: f64,
        grad_norm_sum: f64,
    ) -> Self {
        Self {
            seen,
            loss_sum,
            grad_norm_sum,
            ..Self::new(checkpoints)
        }
    }

    pub(crate) fn mean_loss(&self) -> f64 {
        self.loss_sum / self.seen.max(1) as f64
    }

    pub(crate) fn mean_grad_norm(&self) -> f64 {
        self.grad_norm_sum / self.seen.max(1) as f64
    }
}
