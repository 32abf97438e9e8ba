//! Checkpoints, written atomically: each is a directory `epoch-NNNN/` under the run's
//! checkpoint directory, built under a temporary name and renamed into place, and a
//! `latest` file (also replaced by rename) names the newest complete one. A run killed at
//! any moment leaves the previous checkpoint intact.
//!
//! A checkpoint holds the model (`model.bpk`), the Adam state (`optimizer.bpk`), the
//! rollout baseline's frozen model (`baseline.bpk`) and everything else needed to continue
//! exactly (`state.json`: epoch, RNG states, baseline state, the config).

use burn::module::Module;
use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};

use routeburn_data::InstanceRng;
use serde::{Deserialize, Serialize};

use crate::config::{Config, ModelKind};
use crate::error::CliError;
use crate::metrics::EpochMetrics;

pub const FORMAT_VERSION: u32 = 1;

/// Writes `bytes` to `path` through a temporary file in the same directory and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    let io = |e| CliError::io(&tmp, e);
    let mut f = File::create(&tmp).map_err(io)?;
    f.write_all(bytes).map_err(io)?;
    f.sync_all().map_err(io)?;
    std::fs::rename(&tmp, path).map_err(|e| CliError::io(path, e))
}

/// Everything but tensors that a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrainState {
    pub format_version: u32,
    pub model_kind: ModelKind,
    /// Epochs finished; the run resumes at this epoch index.
    pub epochs_completed: usize,
    pub train_rng: InstanceRng,
    pub noise_rng: InstanceRng,
    pub baseline: BaselineState,
    pub elapsed_seconds: f64,
    /// The resolved config the run was started with.
    pub config_toml: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BaselineState {
    pub exponential_value: Option<f64>,
    /// Rollout baseline: the RNG that draws evaluation-set seeds, and the current set's seed.
    pub rollout_rng: Option<InstanceRng>,
    pub rollout_eval_seed: Option<u64>,
}

impl TrainState {
    /// The state after epoch `epoch` (0-based) of a run of `config`.
    pub fn after_epoch(
        config: &Config,
        epoch: usize,
        train_rng: &InstanceRng,
        noise_rng: &InstanceRng,
        baseline: BaselineState,
        metrics: &EpochMetrics,
    ) -> Self {
        Self {
            format_version: FORMAT_VERSION,
            model_kind: config.model.kind,
            epochs_completed: epoch + 1,
            train_rng: train_rng.clone(),
            noise_rng: noise_rng.clone(),
            baseline,
            elapsed_seconds: metrics.elapsed_seconds,
            config_toml: config.to_toml(),
        }
    }
}

impl BaselineState {
    /// No baseline state to keep (POMO's shared baseline, or a supervised run).
    pub fn none() -> Self {
        Self {
            exponential_value: None,
            rollout_rng: None,
            rollout_eval_seed: None,
        }
    }
}

/// Saves `module`'s tensors to `path` (burnpack); `what` names it in errors.
pub fn save_module<M: Module>(module: &M, path: &Path, what: &str) -> Result<(), CliError> {
    module
        .clone()
        .save_file(path)
        .map_err(|e| record_error(path, &format!("{what} (saving)"), e))
}

/// The checkpoint directory of a run.
pub struct Checkpoints {
    pub dir: PathBuf,
}

pub const MODEL_FILE: &str = "model.bpk";
pub const OPTIMIZER_FILE: &str = "optimizer.bpk";
pub const BASELINE_FILE: &str = "baseline.bpk";
pub const STATE_FILE: &str = "state.json";

impl Checkpoints {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// Writes one checkpoint: `write_tensors` fills the given (temporary) directory with
    /// the `.bpk` files, then the state is added, the directory renamed into place and
    /// `latest` updated. Keeps the newest `keep_last` checkpoints.
    pub fn save(
        &self,
        state: &TrainState,
        keep_last: usize,
        write_tensors: impl FnOnce(&Path) -> Result<(), CliError>,
    ) -> Result<PathBuf, CliError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| CliError::io(&self.dir, e))?;
        let name = format!("epoch-{:04}", state.epochs_completed);
        let final_dir = self.dir.join(&name);
        let tmp_dir = self.dir.join(format!(".{name}.tmp-{}", std::process::id()));
        if tmp_dir.exists() {
            std::fs::remove_dir_all(&tmp_dir).map_err(|e| CliError::io(&tmp_dir, e))?;
        }
        std::fs::create_dir_all(&tmp_dir).map_err(|e| CliError::io(&tmp_dir, e))?;
        write_tensors(&tmp_dir)?;
        let json = serde_json::to_vec_pretty(state).expect("state serialises");
        write_atomic(&tmp_dir.join(STATE_FILE), &json)?;
        for entry in std::fs::read_dir(&tmp_dir).map_err(|e| CliError::io(&tmp_dir, e))? {
            let path = entry.map_err(|e| CliError::io(&tmp_dir, e))?.path();
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| CliError::io(&path, e))?;
        }
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(|e| CliError::io(&final_dir, e))?;
        }
        std::fs::rename(&tmp_dir, &final_dir).map_err(|e| CliError::io(&final_dir, e))?;
        write_atomic(&self.dir.join("latest"), name.as_bytes())?;
        self.prune(keep_last)?;
        Ok(final_dir)
    }

    fn prune(&self, keep_last: usize) -> Result<(), CliError> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .map_err(|e| CliError::io(&self.dir, e))?
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("epoch-"))
            .collect();
        names.sort();
        let excess = names.len().saturating_sub(keep_last.max(1));
        for old in &names[..excess] {
            let p = self.dir.join(old);
            std::fs::remove_dir_all(&p).map_err(|e| CliError::io(&p, e))?;
        }
        Ok(())
    }

    /// The newest complete checkpoint and its state.
    pub fn latest(&self) -> Result<(PathBuf, TrainState), CliError> {
        let latest = self.dir.join("latest");
        let name = std::fs::read_to_string(&latest).map_err(|e| {
            CliError::Input(format!(
                "{}: no checkpoint to resume from ({e})",
                latest.display()
            ))
        })?;
        let dir = self.dir.join(name.trim());
        let state_path = dir.join(STATE_FILE);
        let text = std::fs::read(&state_path).map_err(|e| CliError::io(&state_path, e))?;
        let state: TrainState = serde_json::from_slice(&text).map_err(|e| {
            CliError::Input(format!(
                "{}: not a routeburn checkpoint state: {e}",
                state_path.display()
            ))
        })?;
        if state.format_version != FORMAT_VERSION {
            return Err(CliError::Input(format!(
                "{}: checkpoint format {} is not supported (expected {FORMAT_VERSION})",
                state_path.display(),
                state.format_version
            )));
        }
        Ok((dir, state))
    }
}

/// Maps a Burn record error to a clear message naming the file.
pub fn record_error(path: &Path, what: &str, e: impl std::fmt::Display) -> CliError {
    CliError::Input(format!(
        "{}: cannot load the {what} (is it a checkpoint of this model and config?): {e}",
        path.display()
    ))
}
