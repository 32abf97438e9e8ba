//! Per-epoch metrics and the phase timer.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

use routeburn_model::launches::{self, Issued};

use crate::atomic::write_atomic;
use crate::error::TrainError;

/// Where the time of an epoch goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Drawing instances on the CPU.
    Generate,
    /// Host → device: instances and sampling noise.
    Upload,
    /// The sampled decode with gradients.
    Forward,
    /// The baseline's greedy decode (rollout) or nothing.
    Baseline,
    /// Device → host actions, validation and costing on the CPU.
    DownloadCost,
    /// Loss and backward pass.
    Backward,
    /// Gradient clipping and the Adam step.
    Optimizer,
    /// Validation decode and, for the rollout baseline, its end-of-epoch t-test.
    Validation,
}

impl Phase {
    /// The label its kernel launches are charged to ([`launches::label`]; 0 is none).
    pub fn launch_label(self) -> u8 {
        self as u8 + 1
    }

    pub const ALL: [Phase; 8] = [
        Phase::Generate,
        Phase::Upload,
        Phase::Forward,
        Phase::Baseline,
        Phase::DownloadCost,
        Phase::Backward,
        Phase::Optimizer,
        Phase::Validation,
    ];

    /// The phases of a training step: all but validation (which includes the rollout
    /// baseline's end-of-epoch test).
    pub fn step_phases() -> impl Iterator<Item = Phase> {
        Phase::ALL.into_iter().filter(|&p| p != Phase::Validation)
    }

    pub fn name(self) -> &'static str {
        match self {
            Phase::Generate => "generate",
            Phase::Upload => "upload",
            Phase::Forward => "forward",
            Phase::Baseline => "baseline",
            Phase::DownloadCost => "download_cost",
            Phase::Backward => "backward",
            Phase::Optimizer => "optimizer",
            Phase::Validation => "validation",
        }
    }
}

/// Accumulated wall time per phase, and on CubeCL backends the kernels each phase
/// launched (while [`routeburn_model::launches::watch`] is on).
///
/// On lazy backends (CUDA with fusion) work queued in one phase may execute in the next
/// phase that reads the device; on the CPU backends operations run eagerly, so each phase
/// is charged its own work.
#[derive(Debug, Clone, Default)]
pub struct PhaseTimes {
    totals: [Duration; 8],
    launched: [Issued; 8],
}

impl PhaseTimes {
    pub fn time<T>(&mut self, phase: Phase, f: impl FnOnce() -> T) -> T {
        let outer = launches::label(phase.launch_label());
        let (start, issued) = (Instant::now(), launches::issued());
        let out = f();
        self.totals[phase as usize] += start.elapsed();
        self.add_launched(phase, launches::issued().since(issued));
        launches::label(outer);
        out
    }

    pub(crate) fn add_launched(&mut self, phase: Phase, issued: Issued) {
        let launched = &mut self.launched[phase as usize];
        *launched = *launched + issued;
    }

    /// Kernels launched in `phase` (and their device time, when timed); zero unless
    /// launches are watched.
    pub fn launched(&self, phase: Phase) -> Issued {
        self.launched[phase as usize]
    }

    /// Seconds per phase, in [`Phase::ALL`] order (a checkpoint of an interrupted epoch).
    pub(crate) fn to_seconds(&self) -> Vec<f64> {
        Phase::ALL.iter().map(|&p| self.seconds(p)).collect()
    }

    pub(crate) fn from_seconds(seconds: &[f64]) -> Self {
        let mut times = Self::default();
        for (total, s) in times.totals.iter_mut().zip(seconds) {
            *total = Duration::from_secs_f64(s.max(0.0));
        }
        times
    }

    pub fn seconds(&self, phase: Phase) -> f64 {
        self.totals[phase as usize].as_secs_f64()
    }

    /// Time in the training-step phases ([`Phase::step_phases`]).
    pub fn step_seconds(&self) -> f64 {
        Phase::step_phases().map(|p| self.seconds(p)).sum()
    }

    pub fn summary(&self) -> String {
        let total: f64 = Phase::ALL.iter().map(|&p| self.seconds(p)).sum();
        Phase::ALL
            .iter()
            .map(|&p| {
                let s = self.seconds(p);
                format!(
                    "{} {:.2}s ({:.0}%)",
                    p.name(),
                    s,
                    100.0 * s / total.max(1e-12)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// One row of `metrics.csv`.
#[derive(Debug, Clone, Default)]
pub struct EpochMetrics {
    pub epoch: usize,
    pub train_cost: f64,
    pub baseline_cost: f64,
    pub loss: f64,
    pub grad_norm: f64,
    pub lr: f64,
    pub val_cost: f64,
    /// Mean gap to the validation set's reference costs, in percent.
    pub val_gap: Option<f64>,
    pub baseline_updated: bool,
    pub instances_per_second: f64,
    /// Wall time of this epoch.
    pub seconds: f64,
    /// Wall time since the run started (summed over resumed sessions).
    pub elapsed_seconds: f64,
    pub phases: PhaseTimes,
}

const HEADER: &str = "epoch,train_cost,baseline_cost,loss,grad_norm,lr,val_cost,val_gap,baseline_updated,instances_per_s,seconds,elapsed_seconds";

impl EpochMetrics {
    pub fn header() -> String {
        let mut h = HEADER.to_string();
        for p in Phase::ALL {
            h.push_str(&format!(",t_{}", p.name()));
        }
        h
    }

    pub fn csv_row(&self) -> String {
        let mut row = format!(
            "{},{:.6},{:.6},{:.6},{:.6},{},{:.6},{},{},{:.1},{:.3},{:.3}",
            self.epoch,
            self.train_cost,
            self.baseline_cost,
            self.loss,
            self.grad_norm,
            short_exponent(self.lr),
            self.val_cost,
            self.val_gap.map(|g| format!("{g:.4}")).unwrap_or_default(),
            self.baseline_updated as u8,
            self.instances_per_second,
            self.seconds,
            self.elapsed_seconds,
        );
        for p in Phase::ALL {
            row.push_str(&format!(",{:.3}", self.phases.seconds(p)));
        }
        row
    }
}

/// `x` in exponent notation to 7 significant digits, trailing zeros dropped: `1e-3`,
/// `9.6e-4`, `1.246904e-4` (a decayed rate in full would be `1.2469036178115703e-4`).
fn short_exponent(x: f64) -> String {
    let text = format!("{x:.6e}");
    match text.split_once('e') {
        Some((mantissa, exponent)) if mantissa.contains('.') => {
            let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
            format!("{mantissa}e{exponent}")
        }
        _ => text,
    }
}

/// Appends a row to the run's metrics file, writing the header first for a new file.
pub(crate) fn append_metrics(path: &Path, metrics: &EpochMetrics) -> Result<(), TrainError> {
    let new = !path.exists();
    let mut f = OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| TrainError::io(path, e))?;
    let mut text = String::new();
    if new {
        text.push_str(&EpochMetrics::header());
        text.push('\n');
    }
    text.push_str(&metrics.csv_row());
    text.push('\n');
    f.write_all(text.as_bytes())
        .map_err(|e| TrainError::io(path, e))?;
    f.sync_data().map_err(|e| TrainError::io(path, e))
}

/// Keeps only the header and the rows of epochs `1..=keep_epochs` (after a resume, rows of
/// epochs whose checkpoint was never written are dropped, so they are not duplicated).
pub(crate) fn truncate_metrics(path: &Path, keep_epochs: usize) -> Result<(), TrainError> {
    if !path.exists() {
        return Ok(());
    }
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    let mut out = String::new();
    for (i, line) in text.lines().enumerate() {
        let keep = i == 0
            || line
                .split(',')
                .next()
                .and_then(|e| e.parse::<usize>().ok())
                .is_some_and(|e| e <= keep_epochs);
        if keep {
            out.push_str(line);
            out.push('\n');
        }
    }
    write_atomic(path, out.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn learning_rates_print_short() {
        assert_eq!(short_exponent(1e-3), "1e-3");
        assert_eq!(short_exponent(1e-3 * 0.96), "9.6e-4");
        assert_eq!(short_exponent(1.2469036178115703e-4), "1.246904e-4");
        assert_eq!(short_exponent(5e-3), "5e-3");
    }
}
