//! Checkpoints, written atomically: each is a directory `epoch-NNNN/` under the run's
//! checkpoint directory, built under a temporary name and renamed into place, and a
//! `latest` file (also replaced by rename) names the newest complete one. A run killed at
//! any moment leaves the previous checkpoint intact.
//!
//! A checkpoint holds the model (`model.bpk`), the Adam state (`optimizer.bpk`), the
//! rollout baseline's frozen model (`baseline.bpk`) and everything else needed to continue
//! exactly (`state.json`: epoch, RNG states, baseline state, the config). With
//! `training.average_from`, once averaging has begun, `model.bpk` is the weights' average
//! and `training-model.bpk` the weights training goes on from.

use std::fs::File;
use std::path::{Path, PathBuf};

use burn::module::Module;

use routeburn_data::InstanceRng;
use serde::{Deserialize, Serialize};

use crate::atomic::{sync_parent, write_atomic};
use crate::config::{Config, ModelKind};
use crate::error::TrainError;

pub(crate) const FORMAT_VERSION: u32 = 1;

/// Everything but tensors that a resumed run needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub(crate) struct TrainState {
    pub(crate) format_version: u32,
    pub(crate) model_kind: ModelKind,
    /// Epochs finished; the run resumes at this epoch index.
    pub(crate) epochs_completed: usize,
    pub(crate) train_rng: InstanceRng,
    pub(crate) noise_rng: InstanceRng,
    pub(crate) baseline: BaselineState,
    pub(crate) elapsed_seconds: f64,
    /// The resolved config the run was started with.
    pub(crate) config_toml: String,
    /// A checkpoint written part-way through epoch `epochs_completed + 1` (an
    /// interrupted run): where that epoch stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) in_epoch: Option<EpochProgress>,
    /// The best validation so far (kept in `checkpoints/best`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) best: Option<BestValidation>,
    /// With `training.average_from`: how many epochs' weights `model.bpk` averages (0:
    /// none, and `model.bpk` holds the weights training goes on from, as without it).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) averaged_epochs: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// A validation result, compared by gap when the set has references, else by cost.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub(crate) struct BestValidation {
    /// 1-based epoch (the partial epoch a time limit stopped counts as its number).
    pub(crate) epoch: usize,
    pub(crate) val_cost: f64,
    pub(crate) val_gap: Option<f64>,
}

impl BestValidation {
    /// Whether `self` is better than `other` (a missing `other` is beaten by anything).
    pub(crate) fn beats(&self, other: Option<&BestValidation>) -> bool {
        match other {
            None => true,
            Some(o) => match (self.val_gap, o.val_gap) {
                (Some(a), Some(b)) => a < b,
                _ => self.val_cost < o.val_cost,
            },
        }
    }

    pub(crate) fn describe(&self) -> String {
        match self.val_gap {
            Some(g) => format!("epoch {}, validation gap {g:.2}%", self.epoch),
            None => format!("epoch {}, validation cost {:.4}", self.epoch, self.val_cost),
        }
    }
}

/// How far an interrupted epoch got: its steps and their sums, so the resumed epoch ends
/// with the numbers an uninterrupted one would.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct EpochProgress {
    pub(crate) steps_done: usize,
    pub(crate) cost_sum: f64,
    pub(crate) baseline_sum: f64,
    pub(crate) rows: usize,
    pub(crate) instances: usize,
    pub(crate) stats_seen: usize,
    pub(crate) loss_sum: f64,
    pub(crate) grad_norm_sum: f64,
    /// Seconds per phase ([`crate::run::metrics::Phase::ALL`] order) and in all.
    pub(crate) phase_seconds: Vec<f64>,
    pub(crate) seconds: f64,
}

/// The baselines' state besides tensors; each baseline fills in its own fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct BaselineState {
    pub(crate) exponential_value: Option<f64>,
    /// Rollout baseline: the RNG that draws evaluation-set seeds, and the current set's seed.
    pub(crate) rollout_rng: Option<InstanceRng>,
    pub(crate) rollout_eval_seed: Option<u64>,
}

impl TrainState {
    /// The state after `epochs_completed` whole epochs of a run of `config` (and part of
    /// the next one, `in_epoch`).
    pub(crate) fn new(
        config: &Config,
        epochs_completed: usize,
        rngs: [&InstanceRng; 2],
        baseline: BaselineState,
        elapsed_seconds: f64,
        in_epoch: Option<EpochProgress>,
        best: Option<BestValidation>,
    ) -> Self {
        Self {
            format_version: FORMAT_VERSION,
            model_kind: config.model_kind(),
            epochs_completed,
            train_rng: rngs[0].clone(),
            noise_rng: rngs[1].clone(),
            baseline,
            elapsed_seconds,
            config_toml: config.to_toml(),
            in_epoch,
            best,
            averaged_epochs: 0,
        }
    }

    /// The state of a model imported from elsewhere: no epoch trained here, nothing to
    /// resume (a run starts from it with `train --init-from`).
    pub(crate) fn imported(config: &Config) -> Self {
        let rng = InstanceRng::new(config.training.seed);
        Self::new(
            config,
            0,
            [&rng, &rng],
            BaselineState::default(),
            0.0,
            None,
            None,
        )
    }
}

/// Saves `module`'s tensors to `path` (burnpack); `what` names it in errors.
pub(crate) fn save_module<M: Module>(
    module: &M,
    path: &Path,
    what: &str,
) -> Result<(), TrainError> {
    module
        .clone()
        .save_file(path)
        .map_err(|e| record_error(path, &format!("{what} (saving)"), e))
}

/// The checkpoint directory of a run.
pub(crate) struct Checkpoints {
    pub(crate) dir: PathBuf,
}

pub(crate) const MODEL_FILE: &str = "model.bpk";
pub(crate) const OPTIMIZER_FILE: &str = "optimizer.bpk";
/// The weights training goes on from, where `model.bpk` holds their average instead.
pub(crate) const TRAINING_MODEL_FILE: &str = "training-model.bpk";
pub(crate) const BASELINE_FILE: &str = "baseline.bpk";
pub(crate) const STATE_FILE: &str = "state.json";
/// Pointer files naming the newest and the best checkpoint.
pub(crate) const LATEST: &str = "latest";
pub(crate) const BEST: &str = "best";

impl Checkpoints {
    pub(crate) fn new(dir: impl Into<PathBuf>) -> Self {
        Self { dir: dir.into() }
    }

    /// The name of the checkpoint after `epochs` whole epochs, and `steps` more of the next.
    pub(crate) fn name(epochs: usize, steps: Option<usize>) -> String {
        match steps {
            None => format!("epoch-{epochs:04}"),
            // Sorts after `epoch-{epochs}` and before `epoch-{epochs + 1}`.
            Some(s) => format!("epoch-{epochs:04}-step-{s:06}"),
        }
    }

    /// Writes checkpoint `name` (see [`Checkpoints::name`]): `write` fills the given
    /// (temporary) directory with the `.bpk` files and returns the state, which is added
    /// beside them; then the directory is renamed into place and `latest` updated. Keeps
    /// the newest `keep_last` checkpoints.
    pub(crate) fn save(
        &self,
        name: &str,
        keep_last: usize,
        write: impl FnOnce(&Path) -> Result<TrainState, TrainError>,
    ) -> Result<PathBuf, TrainError> {
        let dir = self.write_dir(name, write)?;
        write_atomic(&self.dir.join(LATEST), name.as_bytes())?;
        self.prune(keep_last)?;
        Ok(dir)
    }

    /// Writes the run's best checkpoint so far as `best-NAME` and points `best` at it;
    /// earlier best checkpoints are removed.
    pub(crate) fn save_best(
        &self,
        name: &str,
        write: impl FnOnce(&Path) -> Result<TrainState, TrainError>,
    ) -> Result<PathBuf, TrainError> {
        let best = format!("best-{name}");
        let dir = self.write_dir(&best, write)?;
        write_atomic(&self.dir.join(BEST), best.as_bytes())?;
        for old in self
            .list_prefixed("best-")
            .into_iter()
            .filter(|n| *n != best)
        {
            let p = self.dir.join(old);
            std::fs::remove_dir_all(&p).map_err(|e| TrainError::io(&p, e))?;
        }
        Ok(dir)
    }

    /// A complete checkpoint directory `name`, written under a temporary name and renamed.
    fn write_dir(
        &self,
        name: &str,
        write: impl FnOnce(&Path) -> Result<TrainState, TrainError>,
    ) -> Result<PathBuf, TrainError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| TrainError::io(&self.dir, e))?;
        let final_dir = self.dir.join(name);
        let tmp_dir = self.dir.join(format!(".{name}.tmp-{}", std::process::id()));
        if tmp_dir.exists() {
            std::fs::remove_dir_all(&tmp_dir).map_err(|e| TrainError::io(&tmp_dir, e))?;
        }
        std::fs::create_dir_all(&tmp_dir).map_err(|e| TrainError::io(&tmp_dir, e))?;
        if let Err(e) = self.fill(&tmp_dir, write) {
            // A full disk (or any failed write) leaves the previous checkpoint as it was.
            let _ = std::fs::remove_dir_all(&tmp_dir);
            return Err(e);
        }
        if final_dir.exists() {
            std::fs::remove_dir_all(&final_dir).map_err(|e| TrainError::io(&final_dir, e))?;
        }
        std::fs::rename(&tmp_dir, &final_dir).map_err(|e| TrainError::io(&final_dir, e))?;
        sync_parent(&final_dir)?;
        Ok(final_dir)
    }

    /// The tensors (`write`), then the state, each file synced.
    fn fill(
        &self,
        tmp_dir: &Path,
        write: impl FnOnce(&Path) -> Result<TrainState, TrainError>,
    ) -> Result<(), TrainError> {
        let state = write(tmp_dir)?;
        let json = serde_json::to_vec_pretty(&state).expect("state serialises");
        write_atomic(&tmp_dir.join(STATE_FILE), &json)?;
        for entry in std::fs::read_dir(tmp_dir).map_err(|e| TrainError::io(tmp_dir, e))? {
            let path = entry.map_err(|e| TrainError::io(tmp_dir, e))?.path();
            File::open(&path)
                .and_then(|f| f.sync_all())
                .map_err(|e| TrainError::io(&path, e))?;
        }
        Ok(())
    }

    fn prune(&self, keep_last: usize) -> Result<(), TrainError> {
        let names = self.list();
        let excess = names.len().saturating_sub(keep_last.max(1));
        for old in &names[..excess] {
            let p = self.dir.join(old);
            std::fs::remove_dir_all(&p).map_err(|e| TrainError::io(&p, e))?;
        }
        Ok(())
    }

    /// The newest complete checkpoint and its state.
    pub(crate) fn latest(&self) -> Result<(PathBuf, TrainState), TrainError> {
        self.pointed(LATEST)
    }

    /// The checkpoint a pointer file (`latest`, `best`) names, and its state.
    pub(crate) fn pointed(&self, pointer: &str) -> Result<(PathBuf, TrainState), TrainError> {
        let path = self.dir.join(pointer);
        let name = std::fs::read_to_string(&path).map_err(|e| {
            TrainError::checkpoint(&path, format!("no `{pointer}` checkpoint ({e})"))
        })?;
        self.named(name.trim())
    }

    /// Checkpoint `name` (`epoch-NNNN`) and its state.
    pub(crate) fn named(&self, name: &str) -> Result<(PathBuf, TrainState), TrainError> {
        let dir = self.dir.join(name);
        if name.is_empty() || name.contains('/') || !dir.is_dir() {
            return Err(TrainError::checkpoint(
                &dir,
                format!(
                    "no checkpoint `{name}` here (checkpoints: {})",
                    self.list().join(", ")
                ),
            ));
        }
        let state_path = dir.join(STATE_FILE);
        let text = std::fs::read(&state_path).map_err(|e| TrainError::io(&state_path, e))?;
        let state: TrainState = serde_json::from_slice(&text).map_err(|e| {
            TrainError::checkpoint(
                &state_path,
                format!("not a routeburn checkpoint state: {e}"),
            )
        })?;
        if state.format_version != FORMAT_VERSION {
            return Err(TrainError::checkpoint(
                &state_path,
                format!(
                    "checkpoint format {} is not supported (expected {FORMAT_VERSION})",
                    state.format_version
                ),
            ));
        }
        Ok((dir, state))
    }

    /// The names of the complete epoch checkpoints, oldest first.
    pub(crate) fn list(&self) -> Vec<String> {
        self.list_prefixed("epoch-")
    }

    fn list_prefixed(&self, prefix: &str) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect();
        names.sort();
        names
    }
}

/// Maps a Burn record error to a clear message naming the file.
pub(crate) fn record_error(path: &Path, what: &str, e: impl std::fmt::Display) -> TrainError {
    TrainError::checkpoint(
        path,
        format!("cannot load the {what} (is it a checkpoint of this model and config?): {e}"),
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::mutate::{config, mutated};

    fn valid_state() -> Vec<u8> {
        let state = TrainState::imported(&Config::embedded_default());
        serde_json::to_vec_pretty(&state).unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 300, ..config() })]

        /// Any `state.json` gives a state or an error naming the file, never a panic.
        #[test]
        fn state_json_never_panics(bytes in mutated(vec![valid_state()])) {
            let dir = std::env::temp_dir().join(format!("routeburn-state-fuzz-{}", std::process::id()));
            let ckpt = dir.join("epoch-0001");
            std::fs::create_dir_all(&ckpt).unwrap();
            std::fs::write(dir.join("latest"), "epoch-0001").unwrap();
            std::fs::write(ckpt.join(STATE_FILE), &bytes).unwrap();
            let result = Checkpoints::new(&dir).latest();
            std::fs::remove_dir_all(&dir).ok();
            if let Err(e) = result {
                prop_assert!(e.to_string().contains("state.json"), "{}", e);
            }
        }
    }
}
