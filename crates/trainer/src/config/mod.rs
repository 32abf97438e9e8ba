//! Training configuration: TOML files deserialised with serde. Each section has its
//! defaults in its `Default` impl (the model sections take the model crate's); unknown
//! keys, bad values and keys that moved are errors that name the file and the key.

mod migrate;

use std::path::{Path, PathBuf};

use routeburn_data::HeuristicConfig;
use routeburn_data::{Generator, GeneratorConfig};
use routeburn_model::{
    AttentionModelConfig, GradientDecode, GraphEncoderConfig, LoadArithmetic, MatmulPrecision,
    Normalization, PointerNetworkConfig, StepKernel,
};
use serde::{Deserialize, Serialize};

use crate::error::TrainError;

/// The embedded default config: `cargo xtask train` with no `--config`. Small enough to
/// finish in about two minutes on 2 CPU cores while the validation cost visibly falls.
pub const DEFAULT_CONFIG: &str = include_str!("../../../../configs/default.toml");

/// The embedded default config's `validation.file`, and the file itself: a run of the
/// default config validates against it from any working directory (`routeburn train`
/// outside the repository), and resumes there too.
pub(crate) const DEFAULT_VALIDATION_FILE: (&str, &[u8]) = (
    "data/validation/cvrp10.jsonl",
    include_bytes!("../../../../data/validation/cvrp10.jsonl"),
);

/// A whole training config. `[model]` says which model (and so which training method:
/// `[reinforce]` for the attention model, `[supervised]` for the pointer network).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub problem: ProblemConfig,
    #[serde(default)]
    pub model: ModelConfig,
    #[serde(default)]
    pub training: TrainingConfig,
    #[serde(default)]
    pub reinforce: ReinforceConfig,
    #[serde(default)]
    pub supervised: SupervisedConfig,
    #[serde(default)]
    pub validation: ValidationConfig,
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

/// The two models, by the names the CLI, configs and README use: `attention` (Kool's
/// attention model, trained with REINFORCE) and `pointer` (the LSTM pointer network,
/// trained supervised on heuristic labels). The earlier names (`gt-rl`, `ptrnet`) are
/// still accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum ModelKind {
    /// The attention model, trained with REINFORCE.
    #[default]
    #[serde(alias = "gt-rl")]
    #[value(alias = "gt-rl")]
    Attention,
    /// The LSTM pointer network, trained supervised on heuristic labels.
    #[serde(alias = "ptrnet")]
    #[value(alias = "ptrnet")]
    Pointer,
}

impl std::fmt::Display for ModelKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Attention => "attention",
            Self::Pointer => "pointer",
        })
    }
}

/// `[model]`: a section tagged by `kind`, holding only that model's settings. Defaults
/// are the model crate's (`AttentionModelConfig`, `PointerNetworkConfig`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum ModelConfig {
    Attention(AttentionConfig),
    Pointer(PointerConfig),
}

impl Default for ModelConfig {
    fn default() -> Self {
        Self::Attention(AttentionConfig::default())
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AttentionConfig {
    pub embed_dim: usize,
    pub num_heads: usize,
    pub num_layers: usize,
    pub feed_forward_dim: usize,
    pub normalization: Normalization,
    /// Biases in the encoder's attention projections (rl4co's models have them).
    #[serde(skip_serializing_if = "is_false")]
    pub attention_bias: bool,
    pub tanh_clipping: f64,
    /// How a route's load meets the capacity in the masks: `exact` (integer demand units),
    /// or `float32` (Kool's code: float32 fractions of the capacity; imported models).
    pub load_arithmetic: LoadArithmetic,
    /// `fused` (the decoder step as one operation where the backend has one: flex) or
    /// `op-by-op` (Burn's tensor operations, what other backends run).
    #[serde(skip_serializing_if = "is_fused")]
    pub decoder_step: StepKernel,
    /// `fused` (the encoder's attention core as one operation where the backend has one:
    /// flex, cuda, cpu) or `op-by-op`.
    #[serde(skip_serializing_if = "is_fused")]
    pub encoder_attention: StepKernel,
    /// `high` (the device's own matrix products: TF32 on CUDA's tensor cores) or
    /// `highest` (f32 accuracy: each product as three TF32 products on CUDA).
    #[serde(skip_serializing_if = "is_high")]
    pub matmul_precision: MatmulPrecision,
    /// How a training decode runs on CubeCL devices (cuda, cpu): `sample-then-score` (the
    /// tours sampled without gradients, then scored in one decoder step) or `step-by-step`.
    #[serde(skip_serializing_if = "is_sample_then_score")]
    pub gradient_decode: GradientDecode,
}

fn is_sample_then_score(g: &GradientDecode) -> bool {
    *g == GradientDecode::SampleThenScore
}

fn is_high(p: &MatmulPrecision) -> bool {
    *p == MatmulPrecision::High
}

fn is_fused(k: &StepKernel) -> bool {
    *k == StepKernel::Fused
}

impl Default for AttentionConfig {
    fn default() -> Self {
        let m = AttentionModelConfig::new();
        Self {
            embed_dim: m.encoder.embed_dim,
            num_heads: m.encoder.num_heads,
            num_layers: m.encoder.num_layers,
            feed_forward_dim: m.encoder.feed_forward_dim,
            normalization: m.encoder.normalization,
            attention_bias: m.encoder.attention_bias,
            tanh_clipping: m.tanh_clipping,
            load_arithmetic: m.load_arithmetic,
            decoder_step: m.decoder_step,
            encoder_attention: m.encoder.encoder_attention,
            matmul_precision: m.matmul_precision,
            gradient_decode: m.gradient_decode,
        }
    }
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

fn is_false(b: &bool) -> bool {
    !*b
}

impl AttentionConfig {
    pub fn model_config(&self) -> AttentionModelConfig {
        AttentionModelConfig::new()
            .with_encoder(
                GraphEncoderConfig::new()
                    .with_embed_dim(self.embed_dim)
                    .with_num_heads(self.num_heads)
                    .with_num_layers(self.num_layers)
                    .with_feed_forward_dim(self.feed_forward_dim)
                    .with_normalization(self.normalization)
                    .with_attention_bias(self.attention_bias)
                    .with_encoder_attention(self.encoder_attention),
            )
            .with_tanh_clipping(self.tanh_clipping)
            .with_load_arithmetic(self.load_arithmetic)
            .with_decoder_step(self.decoder_step)
            .with_matmul_precision(self.matmul_precision)
            .with_gradient_decode(self.gradient_decode)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PointerConfig {
    pub hidden_dim: usize,
    /// Stacked LSTM layers of the encoder and of the decoder.
    pub num_layers: usize,
    pub dropout: f64,
    pub tanh_clipping: f64,
}

impl Default for PointerConfig {
    fn default() -> Self {
        let m = PointerNetworkConfig::new();
        Self {
            hidden_dim: m.hidden_dim,
            num_layers: m.num_layers,
            dropout: m.dropout,
            tanh_clipping: m.tanh_clipping,
        }
    }
}

impl PointerConfig {
    pub fn model_config(&self) -> PointerNetworkConfig {
        PointerNetworkConfig::new()
            .with_hidden_dim(self.hidden_dim)
            .with_num_layers(self.num_layers)
            .with_dropout(self.dropout)
            .with_tanh_clipping(self.tanh_clipping)
    }
}

impl ModelConfig {
    pub fn kind(&self) -> ModelKind {
        match self {
            Self::Attention(_) => ModelKind::Attention,
            Self::Pointer(_) => ModelKind::Pointer,
        }
    }

    /// The default settings of `kind`.
    pub fn default_of(kind: ModelKind) -> Self {
        match kind {
            ModelKind::Attention => Self::Attention(AttentionConfig::default()),
            ModelKind::Pointer => Self::Pointer(PointerConfig::default()),
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

/// `[training]`: what every training method shares.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TrainingConfig {
    pub epochs: usize,
    pub batch_size: usize,
    /// Adam learning rate.
    pub lr: f64,
    /// Multiply the learning rate by this after every epoch (1.0: constant).
    pub lr_decay: f64,
    /// Decay the learning rate exponentially, step by step, from `lr` to this as the run
    /// ends: by its epochs, or by its `time_limit` if that comes first. Replaces
    /// `lr_decay`, and with a time limit suits every machine's speed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lr_final: Option<f64>,
    /// Global gradient-norm clip (0: no clipping).
    pub max_grad_norm: f64,
    pub seed: u64,
    /// Check whether every decode finished every this many steps (one device read each).
    pub decode_check_every: usize,
    /// Device float type: `f32` (default), or `bf16`/`f16` on the cuda backend only.
    pub precision: Precision,
    /// Wall-clock budget of the whole run, resumed sessions included: `90s`, `25m`, `2h`,
    /// `1h30m`. The run stops after the step that reaches it, validates and checkpoints.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub time_limit: Option<String>,
    /// Adam's (L2) weight decay; 0 for none (Kool's), 1e-6 is POMO's.
    pub weight_decay: f64,
    /// Data-parallel shards of each batch, each decoded and differentiated on a thread of
    /// its own, gradients summed in order: the numbers depend on it, the thread count does
    /// not. Left out: the machine's CPU threads (1 on CUDA), written to the run's config.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub shards: Option<usize>,
    /// Average the weights at the end of every epoch from this fraction of the run on (of
    /// its epochs, or of its `time_limit` if further, as `lr_final` counts it): the
    /// average is what validation scores and checkpoints hold as the model (SWA).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub average_from: Option<f64>,
}

/// Seconds of a duration written as `<number><unit>` groups, units `s`, `m`, `h`
/// (`90s`, `25m`, `1h30m`, `0.5h`).
pub fn parse_duration(text: &str) -> Result<f64, String> {
    let bad = || format!("`{text}` is not a positive duration like 90s, 25m, 2h or 1h30m");
    let (mut total, mut number) = (0.0, String::new());
    for c in text.trim().chars() {
        match c {
            '0'..='9' | '.' => number.push(c),
            's' | 'm' | 'h' => {
                let v: f64 = number.parse().map_err(|_| bad())?;
                total += v * match c {
                    's' => 1.0,
                    'm' => 60.0,
                    _ => 3600.0,
                };
                number.clear();
            }
            _ => return Err(bad()),
        }
    }
    if !(number.is_empty() && total.is_finite() && total > 0.0) {
        return Err(bad());
    }
    Ok(total)
}

impl TrainingConfig {
    /// `time_limit` in seconds (checked by [`Config::validate`]).
    pub fn time_limit_seconds(&self) -> Option<f64> {
        self.time_limit
            .as_deref()
            .and_then(|t| parse_duration(t).ok())
    }
}

/// Kool et al.'s settings where they have one.
impl Default for TrainingConfig {
    fn default() -> Self {
        Self {
            epochs: 100,
            batch_size: 512,
            lr: 1e-4,
            lr_decay: 1.0,
            lr_final: None,
            max_grad_norm: 1.0,
            seed: 0,
            decode_check_every: routeburn_model::DecodeOptions::DEFAULT_CHECK_EVERY,
            precision: Precision::F32,
            time_limit: None,
            weight_decay: 0.0,
            shards: None,
            average_from: None,
        }
    }
}

/// `[reinforce]`: how the attention model learns from its own sampled tours.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReinforceConfig {
    /// Batches of freshly generated instances per epoch.
    pub batches_per_epoch: usize,
    pub baseline: BaselineKind,
    /// β of the exponential baseline (also the rollout baseline's warm-up).
    pub exp_beta: f64,
    /// Epochs of exponential warm-up before the rollout baseline takes over.
    pub warmup_epochs: usize,
    /// Instances in the rollout baseline's evaluation set for the t-test (Kool: 10000).
    pub baseline_eval_size: usize,
    /// Significance level of the one-sided paired t-test.
    pub baseline_alpha: f64,
    /// Leader Reward's α (POMO only): each instance's best sampled tour has its advantage
    /// multiplied by this; 1 is POMO's own.
    pub leader_alpha: f64,
    /// POMO's rollouts per instance (`baseline = "pomo"` only), from the first this many
    /// customers, one each; left out, from every customer (n). Fewer starts make a step
    /// cheaper (its work and memory grow with them) and its shared baseline noisier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub starts: Option<usize>,
    /// β of maximum-entropy REINFORCE: every sampled tour is valued at its cost plus β
    /// times its log-likelihood, which rewards the policy for staying spread out
    /// (multistart and ×8 augmentation pick the best of many tours); 0 is plain REINFORCE.
    #[serde(skip_serializing_if = "is_zero")]
    pub entropy_weight: f64,
    /// The fraction of each instance's sampled tours the loss learns from (POMO only):
    /// those furthest from their baseline, the largest advantages in magnitude. The
    /// others' advantages are set to 0 and flex's backward pass leaves them out, so a
    /// step costs less; left out, every tour.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub learn_from: Option<f64>,
    /// α of preference optimisation (POMO only): the loss ranks each instance's tours by
    /// their costs and learns, pair by pair, to make the cheaper tour the likelier, by
    /// Bradley–Terry over the policy's own log-likelihoods, σ(α (log p_w − log p_l)); left
    /// out, REINFORCE on each tour's cost less the shared baseline. The loss is already
    /// entropy-regularised (α is its temperature), so `entropy_weight` stays 0 with it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub preference_alpha: Option<f64>,
    /// On CUDA, the rollout baseline's greedy decode of each training batch as a device
    /// graph (a CUDA graph, recorded once per frozen policy and replayed); false decodes it
    /// kernel by kernel. The CPU backends have no device graphs and ignore it.
    pub baseline_graph: bool,
}

impl Default for ReinforceConfig {
    fn default() -> Self {
        Self {
            batches_per_epoch: 2500,
            baseline: BaselineKind::Rollout,
            exp_beta: 0.8,
            warmup_epochs: 1,
            baseline_eval_size: 10_000,
            baseline_alpha: 0.05,
            leader_alpha: 1.0,
            starts: None,
            entropy_weight: 0.0,
            learn_from: None,
            preference_alpha: None,
            baseline_graph: true,
        }
    }
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

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ValidationConfig {
    /// Generated validation instances (ignored when `file` is set).
    pub size: usize,
    /// A JSONL dataset with reference costs, e.g. `data/validation/cvrp20.jsonl`; relative
    /// paths are resolved against the working directory, then the config's directory.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<PathBuf>,
    /// Decode strategy: `greedy`, or `multistart` (the default when the baseline is
    /// `pomo`, which trains for multi-start decoding).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub strategy: Option<ValidationStrategy>,
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
            strategy: None,
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
    /// At most this many batches per epoch; 0 (the default) is one full pass over the labels.
    pub max_batches_per_epoch: usize,
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
            max_batches_per_epoch: 0,
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

/// A value no type can rule out, named by its key.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("`{key}` must be {expected}, got {found}")]
pub struct InvalidValue {
    pub key: &'static str,
    pub expected: &'static str,
    pub found: String,
}

fn check<T: std::fmt::Display>(
    ok: bool,
    key: &'static str,
    expected: &'static str,
    found: T,
) -> Result<(), InvalidValue> {
    if ok {
        Ok(())
    } else {
        Err(InvalidValue {
            key,
            expected,
            found: found.to_string(),
        })
    }
}

fn positive(key: &'static str, v: usize) -> Result<(), InvalidValue> {
    check(v > 0, key, "at least 1", v)
}

fn finite_positive(key: &'static str, v: f64) -> Result<(), InvalidValue> {
    check(v.is_finite() && v > 0.0, key, "a finite number > 0", v)
}

impl Config {
    /// Parses TOML text; `origin` names the file (or "embedded default config") in errors.
    pub fn from_toml(text: &str, origin: &str) -> Result<Self, TrainError> {
        Self::from_toml_as(text, origin, None)
    }

    /// Like [`Config::from_toml`], as model `kind` (the command line's `--model`): a
    /// `[model]` section of another kind is replaced by `kind`'s defaults.
    pub fn from_toml_as(
        text: &str,
        origin: &str,
        kind: Option<ModelKind>,
    ) -> Result<Self, TrainError> {
        let mut table = Self::parse_table(text, origin)?;
        migrate::set_model_kind(&mut table, kind);
        Self::from_table(table, origin)
    }

    fn parse_table(text: &str, origin: &str) -> Result<toml::Table, TrainError> {
        let table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| TrainError::config(origin, e.to_string().trim_end()))?;
        migrate::reject_moved_keys(&table).map_err(|m| TrainError::config(origin, m))?;
        Ok(table)
    }

    fn from_table(table: toml::Table, origin: &str) -> Result<Self, TrainError> {
        let config: Config = table
            .try_into()
            .map_err(|e: toml::de::Error| TrainError::config(origin, e.to_string().trim_end()))?;
        config
            .validate()
            .map_err(|e| TrainError::config(origin, e.to_string()))?;
        Ok(config)
    }

    pub fn load(path: &Path) -> Result<Self, TrainError> {
        Self::load_as(path, None)
    }

    /// [`Config::load`] as model `kind`, see [`Config::from_toml_as`].
    pub fn load_as(path: &Path, kind: Option<ModelKind>) -> Result<Self, TrainError> {
        Ok(Self::load_stating_load_arithmetic(path, kind)?.0)
    }

    /// [`Config::load_as`], and the `model.load_arithmetic` that the file states itself (a
    /// default is not stated), or `None`. `train --init-from` replaces the config's
    /// `[model]` with the source model's but keeps a load arithmetic stated here: how loads
    /// meet the capacity is the problem's rule for this run, not part of the architecture.
    pub fn load_stating_load_arithmetic(
        path: &Path,
        kind: Option<ModelKind>,
    ) -> Result<(Self, Option<LoadArithmetic>), TrainError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
        let mut table = Self::parse_table(&text, &origin)?;
        // Read first, so that a bad value is refused naming its key.
        let stated = table.get("model").and_then(|m| m.get("load_arithmetic"));
        let stated = stated.cloned().map(toml::Value::try_into).transpose();
        let stated = stated.map_err(|e: toml::de::Error| {
            TrainError::config(&origin, format!("model.load_arithmetic: {}", e.message()))
        })?;
        migrate::set_model_kind(&mut table, kind);
        let config = Self::from_table(table, &origin)?;
        Ok((config, stated))
    }

    /// The `config.toml` of a run directory. Runs written before the sectioned layout
    /// (their config has `training.baseline`) are migrated on the fly.
    pub fn load_run(path: &Path) -> Result<Self, TrainError> {
        let origin = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
        let mut table: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| TrainError::config(&origin, e.to_string().trim_end()))?;
        migrate::migrate_flat_layout(&mut table);
        migrate::set_model_kind(&mut table, None);
        Self::from_table(table, &origin)
    }

    /// The embedded default config, as `kind` when given.
    pub fn embedded_default_as(kind: Option<ModelKind>) -> Result<Self, TrainError> {
        Self::from_toml_as(DEFAULT_CONFIG, "embedded default config", kind)
    }

    pub fn embedded_default() -> Self {
        Self::from_toml(DEFAULT_CONFIG, "embedded default config")
            .expect("the embedded default config is valid (tested)")
    }

    /// Every section's defaults around `model`, for `n` customers: what an imported model
    /// runs with.
    pub fn with_model(n: usize, model: ModelConfig) -> Self {
        Self {
            problem: ProblemConfig {
                n,
                capacity: None,
                generator: GeneratorConfig::default(),
            },
            model,
            training: TrainingConfig::default(),
            reinforce: ReinforceConfig::default(),
            supervised: SupervisedConfig::default(),
            validation: ValidationConfig::default(),
            checkpointing: CheckpointConfig::default(),
            logging: LoggingConfig::default(),
        }
    }

    pub fn to_toml(&self) -> String {
        toml::to_string_pretty(self).expect("configs serialise")
    }

    /// Sets `model.matmul_precision` (`--matmul-precision`). The pointer network's products
    /// (its LSTMs' among them) run at the device's own precision, `high`.
    pub fn set_matmul_precision(&mut self, precision: MatmulPrecision) -> Result<(), TrainError> {
        match (&mut self.model, precision) {
            (ModelConfig::Attention(a), _) => a.matmul_precision = precision,
            (ModelConfig::Pointer(_), MatmulPrecision::High) => {}
            (ModelConfig::Pointer(_), MatmulPrecision::Highest) => {
                return Err(TrainError::Input(
                    "--matmul-precision highest: only the attention model has it; this is the pointer network (high only)"
                        .into(),
                ))
            }
        }
        Ok(())
    }

    pub fn model_kind(&self) -> ModelKind {
        self.model.kind()
    }

    /// How validation decodes: as `validation.strategy` says, else multi-start for a POMO
    /// run and greedy otherwise.
    pub fn validation_strategy(&self) -> ValidationStrategy {
        self.validation
            .strategy
            .unwrap_or(match (self.model_kind(), self.reinforce.baseline) {
                (ModelKind::Attention, BaselineKind::Pomo) => ValidationStrategy::Multistart,
                _ => ValidationStrategy::Greedy,
            })
    }

    /// The instance generator the problem section describes.
    pub fn generator(&self) -> Result<Generator, TrainError> {
        Generator::new(
            self.problem.n,
            self.problem.capacity,
            self.problem.generator.clone(),
        )
        .map_err(|e| TrainError::Input(format!("problem: {e}")))
    }

    /// Checks every value a type cannot; each error names the key.
    pub fn validate(&self) -> Result<(), InvalidValue> {
        positive("problem.n", self.problem.n)?;
        if let Err(e) = self.generator() {
            return Err(InvalidValue {
                key: "problem",
                expected: "a valid generator",
                found: e.to_string(),
            });
        }
        self.model.validate()?;
        let t = &self.training;
        positive("training.epochs", t.epochs)?;
        positive("training.batch_size", t.batch_size)?;
        finite_positive("training.lr", t.lr)?;
        finite_positive("training.lr_decay", t.lr_decay)?;
        if let Some(lr_final) = t.lr_final {
            finite_positive("training.lr_final", lr_final)?;
            check(
                t.lr_decay == 1.0,
                "training.lr_decay",
                "1.0 (left out) when `training.lr_final` is set: both schedule the rate",
                t.lr_decay,
            )?;
        }
        check(
            t.max_grad_norm.is_finite() && t.max_grad_norm >= 0.0,
            "training.max_grad_norm",
            ">= 0 (0 disables clipping)",
            t.max_grad_norm,
        )?;
        positive("training.decode_check_every", t.decode_check_every)?;
        if let Some(shards) = t.shards {
            positive("training.shards", shards)?;
        }
        if let Some(limit) = &t.time_limit {
            check(
                parse_duration(limit).is_ok(),
                "training.time_limit",
                "a positive duration like 90s, 25m, 2h or 1h30m",
                limit,
            )?;
        }
        if let Some(from) = t.average_from {
            check(
                (0.0..1.0).contains(&from),
                "training.average_from",
                "a fraction of the run, at least 0 and below 1",
                from,
            )?;
        }
        check(
            t.weight_decay.is_finite() && t.weight_decay >= 0.0,
            "training.weight_decay",
            ">= 0",
            t.weight_decay,
        )?;
        match self.model_kind() {
            ModelKind::Attention => self.reinforce.validate(self.problem.n)?,
            ModelKind::Pointer => positive("supervised.labels", self.supervised.labels)?,
        }
        self.supervised.validate()?;
        let v = &self.validation;
        if v.file.is_none() {
            positive("validation.size", v.size)?;
        }
        positive("validation.batch_size", v.batch_size)?;
        positive(
            "checkpointing.every_epochs",
            self.checkpointing.every_epochs,
        )?;
        positive("checkpointing.keep_last", self.checkpointing.keep_last)
    }
}

impl ModelConfig {
    fn validate(&self) -> Result<(), InvalidValue> {
        match self {
            Self::Attention(m) => {
                positive("model.embed_dim", m.embed_dim)?;
                positive("model.num_heads", m.num_heads)?;
                positive("model.num_layers", m.num_layers)?;
                positive("model.feed_forward_dim", m.feed_forward_dim)?;
                check(
                    m.embed_dim.is_multiple_of(m.num_heads),
                    "model.embed_dim",
                    "divisible by `model.num_heads`",
                    format!("{} with {} heads", m.embed_dim, m.num_heads),
                )?;
                finite_positive("model.tanh_clipping", m.tanh_clipping)
            }
            Self::Pointer(m) => {
                positive("model.hidden_dim", m.hidden_dim)?;
                positive("model.num_layers", m.num_layers)?;
                check(
                    (0.0..1.0).contains(&m.dropout),
                    "model.dropout",
                    "in [0, 1)",
                    m.dropout,
                )?;
                finite_positive("model.tanh_clipping", m.tanh_clipping)
            }
        }
    }
}

impl ReinforceConfig {
    fn validate(&self, n: usize) -> Result<(), InvalidValue> {
        positive("reinforce.batches_per_epoch", self.batches_per_epoch)?;
        self.validate_pomo_keys(n)?;
        check(
            (0.0..1.0).contains(&self.exp_beta),
            "reinforce.exp_beta",
            "in [0, 1)",
            self.exp_beta,
        )?;
        check(
            self.baseline_alpha > 0.0 && self.baseline_alpha < 1.0,
            "reinforce.baseline_alpha",
            "in (0, 1)",
            self.baseline_alpha,
        )?;
        check(
            self.entropy_weight.is_finite() && self.entropy_weight >= 0.0,
            "reinforce.entropy_weight",
            "a number at least 0 (0: plain REINFORCE)",
            self.entropy_weight,
        )?;
        check(
            self.baseline != BaselineKind::Rollout || self.baseline_eval_size >= 2,
            "reinforce.baseline_eval_size",
            "at least 2 for the t-test",
            self.baseline_eval_size,
        )
    }

    /// The keys that act on an instance's multi-start tours, which only POMO samples: each
    /// stays at its default unless `baseline = "pomo"`.
    fn validate_pomo_keys(&self, n: usize) -> Result<(), InvalidValue> {
        let pomo = self.baseline == BaselineKind::Pomo;
        if let Some(starts) = self.starts {
            check(
                pomo,
                "reinforce.starts",
                "left out unless `reinforce.baseline = \"pomo\"` (the starts of a multi-start decode)",
                starts,
            )?;
            check(
                (2..=n).contains(&starts),
                "reinforce.starts",
                "from 2 (a tour against the mean of its instance's) to `problem.n`",
                format!("{starts} with n = {n}"),
            )?;
        }
        check(
            self.leader_alpha.is_finite() && self.leader_alpha >= 1.0,
            "reinforce.leader_alpha",
            "a number at least 1",
            self.leader_alpha,
        )?;
        check(
            pomo || self.leader_alpha == 1.0,
            "reinforce.leader_alpha",
            "1 unless `reinforce.baseline = \"pomo\"` (the leader is the best of an instance's multi-start tours)",
            self.leader_alpha,
        )?;
        if let Some(fraction) = self.learn_from {
            check(
                pomo,
                "reinforce.learn_from",
                "left out unless `reinforce.baseline = \"pomo\"` (the tours of an instance against their shared baseline)",
                fraction,
            )?;
            check(
                fraction > 0.0 && fraction <= 1.0,
                "reinforce.learn_from",
                "a fraction in (0, 1] of each instance's tours",
                fraction,
            )?;
        }
        if let Some(alpha) = self.preference_alpha {
            check(
                pomo,
                "reinforce.preference_alpha",
                "left out unless `reinforce.baseline = \"pomo\"` (pairs of an instance's multi-start tours)",
                alpha,
            )?;
            check(
                alpha.is_finite() && alpha > 0.0,
                "reinforce.preference_alpha",
                "a number above 0",
                alpha,
            )?;
            check(
                self.entropy_weight == 0.0 && self.leader_alpha == 1.0,
                "reinforce.preference_alpha",
                "left out with `reinforce.entropy_weight` or `reinforce.leader_alpha` (both act on the advantage it replaces)",
                alpha,
            )?;
        }
        Ok(())
    }
}

impl SupervisedConfig {
    fn validate(&self) -> Result<(), InvalidValue> {
        check(
            (0.0..=1.0).contains(&self.teacher_forcing),
            "supervised.teacher_forcing",
            "in [0, 1]",
            self.teacher_forcing,
        )?;
        check(
            (0.0..=1.0).contains(&self.teacher_forcing_decay),
            "supervised.teacher_forcing_decay",
            "in [0, 1]",
            self.teacher_forcing_decay,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::{parse_duration, Config, LoadArithmetic, ModelKind};

    /// Only a `load_arithmetic` written in the file's `[model]` is stated; a bad one is
    /// refused naming the file and the key.
    #[test]
    fn stated_load_arithmetic_is_what_the_file_writes() {
        let path =
            std::env::temp_dir().join(format!("routeburn-stated-{}.toml", std::process::id()));
        // Every text is a whole config: the problem's section, then `model`.
        let stated = |model: &str, kind: Option<ModelKind>| {
            std::fs::write(&path, format!("[problem]\nn = 5\n{model}")).unwrap();
            Config::load_stating_load_arithmetic(&path, kind).map(|(_, stated)| stated)
        };
        let exact = stated("[model]\nload_arithmetic = \"exact\"\n", None);
        assert_eq!(exact.unwrap(), Some(LoadArithmetic::Exact));
        let text = "[model]\nkind = \"attention\"\nload_arithmetic = \"float32\"\n";
        assert_eq!(stated(text, None).unwrap(), Some(LoadArithmetic::Float32));
        for silent in ["", "[model]\nembed_dim = 64\n"] {
            assert_eq!(stated(silent, None).unwrap(), None, "{silent}");
        }
        // Refused whether the section is read or replaced by `--model`'s.
        let bad = "[model]\nkind = \"attention\"\nload_arithmetic = \"f16\"\n";
        for kind in [None, Some(ModelKind::Pointer)] {
            let e = stated(bad, kind).unwrap_err().to_string();
            assert!(
                e.contains(&path.display().to_string()) && e.contains("model.load_arithmetic"),
                "{kind:?}: {e}"
            );
        }
        std::fs::remove_file(&path).ok();
    }

    #[test]
    fn durations_in_seconds() {
        assert_eq!(parse_duration("90s"), Ok(90.0));
        assert_eq!(parse_duration("1h30m"), Ok(5400.0));
        assert_eq!(parse_duration("0.5h"), Ok(1800.0));
        for bad in ["0s", "0m0s", "25", "m", "-5s", "1d", ""] {
            let e = parse_duration(bad).unwrap_err();
            assert!(e.contains("is not a positive duration"), "{bad}: {e}");
        }
    }
}
