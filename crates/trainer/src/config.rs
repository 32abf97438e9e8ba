//! Training configuration: TOML files deserialised with serde. Unknown keys and bad values
//! are errors that name the file and the key.

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use routeburn_data::HeuristicConfig;
use routeburn_data::{Generator, GeneratorConfig};
use routeburn_model::{
    AttentionModelConfig, GraphEncoderConfig, Normalization, PointerNetworkConfig, RoutingModel,
};
use serde::{Deserialize, Serialize};

use crate::error::CliError;

/// The embedded default config: `cargo xtask train` with no `--config`. Small enough to
/// finish in about two minutes on 2 CPU cores while the validation cost visibly falls.
pub const DEFAULT_CONFIG: &str = include_str!("../../../configs/default.toml");

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub problem: ProblemConfig,
    #[serde(default)]
    pub model: ModelConfig,
    pub training: TrainingConfig,
    #[serde(default)]
    pub validation: ValidationConfig,
    /// Labels and teacher forcing of the pointer network (ignored by gt-rl).
    #[serde(default)]
    pub supervised: SupervisedConfig,
    #[serde(default)]
    pub checkpointing: CheckpointConfig,
    #[serde(default)]
    pub logging: LoggingConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProblemConfig {
    /// Customers per instance.
    pub n: usize,
    /// Vehicle capacity; default Kool's table (20/30/40/50 for n = 10/20/50/100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u32>,
    #[serde(default)]
    pub generator: GeneratorConfig,
}

/// Which model to train; `--model` on the command line overrides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
pub enum ModelKind {
    /// The attention model trained with REINFORCE (GT+RL).
    #[default]
    #[serde(rename = "gt-rl")]
    GtRl,
    /// The LSTM pointer network trained on solver labels.
    #[serde(rename = "ptrnet")]
    PtrNet,
}

impl std::str::FromStr for ModelKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gt-rl" => Ok(Self::GtRl),
            "ptrnet" => Ok(Self::PtrNet),
            _ => Err(format!("unknown model `{s}`; expected gt-rl or ptrnet")),
        }
    }
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::GtRl => "gt-rl",
            Self::PtrNet => "ptrnet",
        })
    }
}

/// Both models' settings: `embed_dim` … `normalization` shape the attention model,
/// `hidden_dim`, `lstm_layers` and `dropout` the pointer network; `tanh_clipping` is both's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelConfig {
    pub kind: ModelKind,
    pub embed_dim: usize,
    pub num_heads: usize,
    pub num_layers: usize,
    pub feed_forward_dim: usize,
    pub normalization: Normalization,
    pub tanh_clipping: f64,
    pub hidden_dim: usize,
    pub lstm_layers: usize,
    pub dropout: f64,
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self {
            kind: ModelKind::GtRl,
            embed_dim: 128,
            num_heads: 8,
            num_layers: 3,
            feed_forward_dim: 512,
            normalization: Normalization::Batch,
            tanh_clipping: 10.0,
            hidden_dim: 256,
            lstm_layers: 2,
            dropout: 0.2,
        }
    }
}

impl ModelConfig {
    pub fn attention_model(&self) -> AttentionModelConfig {
        AttentionModelConfig::new()
            .with_encoder(
                GraphEncoderConfig::new()
                    .with_embed_dim(self.embed_dim)
                    .with_num_heads(self.num_heads)
                    .with_num_layers(self.num_layers)
                    .with_feed_forward_dim(self.feed_forward_dim)
                    .with_normalization(self.normalization),
            )
            .with_tanh_clipping(self.tanh_clipping)
    }

    pub fn pointer_network(&self) -> PointerNetworkConfig {
        PointerNetworkConfig::new()
            .with_hidden_dim(self.hidden_dim)
            .with_num_layers(self.lstm_layers)
            .with_dropout(self.dropout)
            .with_tanh_clipping(self.tanh_clipping)
    }

    /// The model `kind` names, freshly initialised.
    pub fn init(&self, device: &Device) -> RoutingModel {
        match self.kind {
            ModelKind::GtRl => self.attention_model().init(device).into(),
            ModelKind::PtrNet => self.pointer_network().init(device).into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum BaselineKind {
    /// Greedy rollout of a frozen copy, replaced after a one-sided paired t-test (Kool).
    #[default]
    Rollout,
    /// Exponential moving average of the batch's mean cost.
    Exponential,
    /// POMO's shared baseline: the mean over the multi-start rollouts of each instance.
    Pomo,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingConfig {
    pub epochs: usize,
    pub batch_size: usize,
    /// Batches per epoch. Required for gt-rl; for ptrnet 0 (the default) is one pass over
    /// the labels, and a positive value caps the pass.
    #[serde(default)]
    pub batches_per_epoch: usize,
    /// Adam learning rate.
    pub lr: f64,
    /// Multiply the learning rate by this after every epoch (1.0: constant).
    #[serde(default = "one")]
    pub lr_decay: f64,
    /// Global gradient-norm clip (0: no clipping).
    #[serde(default = "one")]
    pub max_grad_norm: f64,
    #[serde(default)]
    pub seed: u64,
    /// REINFORCE baseline (gt-rl only).
    #[serde(default)]
    pub baseline: BaselineKind,
    /// β of the exponential baseline (also the rollout baseline's warm-up).
    #[serde(default = "default_exp_beta")]
    pub exp_beta: f64,
    /// Epochs of exponential warm-up before the rollout baseline takes over.
    #[serde(default = "one_usize")]
    pub warmup_epochs: usize,
    /// Instances in the rollout baseline's evaluation set for the t-test (Kool: 10000).
    #[serde(default = "default_eval_size")]
    pub baseline_eval_size: usize,
    /// Significance level of the one-sided paired t-test.
    #[serde(default = "default_alpha")]
    pub baseline_alpha: f64,
    /// Check whether every decode finished every this many steps (one device read each).
    #[serde(default = "default_check_every")]
    pub decode_check_every: usize,
    /// Device float type: `f32` (default), or `bf16`/`f16` on the cuda backend only.
    #[serde(default)]
    pub precision: Precision,
}

/// The float type of every tensor on the device. Burn has no autocast: `bf16`/`f16` make
/// *all* device tensors (weights, activations, gradients, Adam state) that type; the host
/// side (costs, advantages, metrics) stays f32/f64. Untested: no GPU has been available.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    #[default]
    F32,
    Bf16,
    F16,
}

fn one() -> f64 {
    1.0
}
fn one_usize() -> usize {
    1
}
fn default_exp_beta() -> f64 {
    0.8
}
fn default_eval_size() -> usize {
    10_000
}
fn default_alpha() -> f64 {
    0.05
}
fn default_check_every() -> usize {
    routeburn_model::DecodeOptions::DEFAULT_CHECK_EVERY
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationConfig {
    /// Generated validation instances (ignored when `file` is set).
    pub size: usize,
    /// A JSONL dataset with reference costs, e.g. `data/validation/cvrp20.jsonl`; relative
    /// paths are resolved against the working directory, then the config's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// Decode strategy: `greedy` (the default).
    pub strategy: ValidationStrategy,
    pub batch_size: usize,
    /// Seed of the generated validation set.
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ValidationStrategy {
    Greedy,
    Multistart,
}

impl Default for ValidationConfig {
    fn default() -> Self {
        Self {
            size: 1000,
            file: None,
            strategy: ValidationStrategy::Greedy,
            batch_size: 500,
            seed: 4321,
        }
    }
}

/// The pointer network's supervised training: labels from the classical heuristic and the
/// teacher-forcing schedule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SupervisedConfig {
    /// Labelled training instances (the seeds': 10000).
    pub labels: usize,
    /// Seed of the labelled instances and of the heuristic.
    pub label_seed: u64,
    /// A JSONL file of labelled instances: read when it exists, otherwise written after
    /// labelling, so labels are computed once. Default: `labels.jsonl` in the run directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub labels_file: Option<PathBuf>,
    /// Ruin-and-recreate rounds of the heuristic per instance (more: better labels, slower).
    pub heuristic_rounds: usize,
    /// Probability that a decoder step is fed the previous target rather than the
    /// network's own previous choice.
    pub teacher_forcing: f64,
    /// Multiply `teacher_forcing` by this after every epoch (1.0: constant).
    pub teacher_forcing_decay: f64,
}

impl Default for SupervisedConfig {
    fn default() -> Self {
        Self {
            labels: 10_000,
            label_seed: 7,
            labels_file: None,
            heuristic_rounds: HeuristicConfig::default().perturbation_rounds,
            teacher_forcing: 1.0,
            teacher_forcing_decay: 1.0,
        }
    }
}

impl SupervisedConfig {
    /// The heuristic settings of the labels.
    pub fn heuristic(&self) -> HeuristicConfig {
        HeuristicConfig {
            perturbation_rounds: self.heuristic_rounds,
            seed: self.label_seed,
            ..HeuristicConfig::default()
        }
    }

    /// The teacher-forcing ratio of `epoch` (0-based).
    pub fn teacher_forcing_at(&self, epoch: usize) -> f64 {
        self.teacher_forcing * self.teacher_forcing_decay.powi(epoch as i32)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CheckpointConfig {
    /// Sub-directory of the run directory that holds checkpoints.
    pub dir: PathBuf,
    /// Write a checkpoint every this many epochs (the last epoch always gets one).
    pub every_epochs: usize,
    /// How many checkpoints to keep (older ones are deleted).
    pub keep_last: usize,
}

impl Default for CheckpointConfig {
    fn default() -> Self {
        Self {
            dir: PathBuf::from("checkpoints"),
            every_epochs: 1,
            keep_last: 2,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LoggingConfig {
    /// Show a progress bar (only when stderr is a terminal).
    pub progress: bool,
    /// Print the per-epoch summary with the phase breakdown.
    pub summary: bool,
}

impl Default for LoggingConfig {
    fn default() -> Self {
        Self {
            progress: true,
            summary: true,
        }
    }
}

impl Config {
    /// Parses TOML text; `origin` names the file (or "embedded default config") in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, CliError> {
        Self::from_toml_as(text, origin, None)
    }

    /// Like [`Config::from_toml`], with `model.kind` replaced by `kind` (the command line's
    /// `--model`) before the settings that depend on it are checked.
    pub fn from_toml_as(
        text: &str,
        origin: &str,
        kind: Option<ModelKind>,
    ) -> Result<Self, CliError> {
        let mut config: Config = toml::from_str(text)
            .map_err(|e| CliError::Input(format!("{origin}: {}", e.to_string().trim_end())))?;
        if let Some(kind) = kind {
            config.model.kind = kind;
        }
        config
            .validate()
            .map_err(|e| CliError::Input(format!("{origin}: {e}")))?;
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Self, CliError> {
        Self::load_as(path, None)
    }

    /// [`Config::load`] with `model.kind` replaced by `kind`, see [`Config::from_toml_as`].
    pub fn load_as(path: &Path, kind: Option<ModelKind>) -> Result<Self, CliError> {
        let text = std::fs::read_to_string(path).map_err(|e| CliError::io(path, e))?;
        Self::from_toml_as(&text, &path.display().to_string(), kind)
    }

    /// The embedded default config, as `kind` when given.
    pub fn embedded_default_as(kind: Option<ModelKind>) -> Result<Self, CliError> {
        Self::from_toml_as(DEFAULT_CONFIG, "embedded default config", kind)
    }

    pub fn embedded_default() -> Self {
        Self::from_toml(DEFAULT_CONFIG, "embedded default config")
            .expect("the embedded default config is valid (tested)")
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("configs serialise")
    }

    /// The instance generator the problem section describes.
    pub fn generator(&self) -> Result<Generator, String> {
        Generator::new(
            self.problem.n,
            self.problem.capacity,
            self.problem.generator.clone(),
        )
        .map_err(|e| format!("problem: {e}"))
    }

    /// Checks every value a type cannot: each message names the key.
    pub fn validate(&self) -> Result<(), String> {
        fn positive(key: &str, v: usize) -> Result<(), String> {
            if v == 0 {
                Err(format!("`{key}` must be at least 1, got 0"))
            } else {
                Ok(())
            }
        }
        fn finite_positive(key: &str, v: f64) -> Result<(), String> {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("`{key}` must be a finite number > 0, got {v}"))
            }
        }
        positive("problem.n", self.problem.n)?;
        self.generator()?;
        let m = &self.model;
        positive("model.embed_dim", m.embed_dim)?;
        positive("model.num_heads", m.num_heads)?;
        positive("model.num_layers", m.num_layers)?;
        positive("model.feed_forward_dim", m.feed_forward_dim)?;
        if !m.embed_dim.is_multiple_of(m.num_heads) {
            return Err(format!(
                "`model.embed_dim` ({}) must be divisible by `model.num_heads` ({})",
                m.embed_dim, m.num_heads
            ));
        }
        finite_positive("model.tanh_clipping", m.tanh_clipping)?;
        positive("model.hidden_dim", m.hidden_dim)?;
        positive("model.lstm_layers", m.lstm_layers)?;
        if !(0.0..1.0).contains(&m.dropout) {
            return Err(format!(
                "`model.dropout` must be in [0, 1), got {}",
                m.dropout
            ));
        }
        let t = &self.training;
        positive("training.epochs", t.epochs)?;
        positive("training.batch_size", t.batch_size)?;
        if m.kind == ModelKind::GtRl {
            positive("training.batches_per_epoch", t.batches_per_epoch)?;
        }
        let sup = &self.supervised;
        if m.kind == ModelKind::PtrNet {
            positive("supervised.labels", sup.labels)?;
        }
        if !(0.0..=1.0).contains(&sup.teacher_forcing) {
            return Err(format!(
                "`supervised.teacher_forcing` must be in [0, 1], got {}",
                sup.teacher_forcing
            ));
        }
        if !(0.0..=1.0).contains(&sup.teacher_forcing_decay) {
            return Err(format!(
                "`supervised.teacher_forcing_decay` must be in [0, 1], got {}",
                sup.teacher_forcing_decay
            ));
        }
        finite_positive("training.lr", t.lr)?;
        finite_positive("training.lr_decay", t.lr_decay)?;
        if !(t.max_grad_norm.is_finite() && t.max_grad_norm >= 0.0) {
            return Err(format!(
                "`training.max_grad_norm` must be >= 0 (0 disables clipping), got {}",
                t.max_grad_norm
            ));
        }
        if !(0.0..1.0).contains(&t.exp_beta) {
            return Err(format!(
                "`training.exp_beta` must be in [0, 1), got {}",
                t.exp_beta
            ));
        }
        if !(t.baseline_alpha > 0.0 && t.baseline_alpha < 1.0) {
            return Err(format!(
                "`training.baseline_alpha` must be in (0, 1), got {}",
                t.baseline_alpha
            ));
        }
        if t.baseline == BaselineKind::Rollout && t.baseline_eval_size < 2 {
            return Err("`training.baseline_eval_size` must be at least 2 for the t-test".into());
        }
        positive("training.decode_check_every", t.decode_check_every)?;
        let v = &self.validation;
        if v.file.is_none() {
            positive("validation.size", v.size)?;
        }
        positive("validation.batch_size", v.batch_size)?;
        positive(
            "checkpointing.every_epochs",
            self.checkpointing.every_epochs,
        )?;
        positive("checkpointing.keep_last", self.checkpointing.keep_last)?;
        Ok(())
    }
}
