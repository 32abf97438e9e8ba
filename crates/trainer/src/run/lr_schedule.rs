//! The learning rate of each step: Kool's decay by a factor per epoch, or an exponential
//! decay that reaches `training.lr_final` as the run ends.
//!
//! A decay per epoch ties the curve to the machine's speed when a time limit ends the run:
//! the 25-minute recipe ran ~170 epochs on a Zen 3 and ~460 on a Zen 5, so the same
//! factor left 1e-4 on one and 1.5e-6 on the other. `lr_final` fixes the end point
//! instead, and lets the run's progress (by epochs or by the clock, whichever is further)
//! place each step on the curve.

use crate::config::TrainingConfig;

/// How far a run has come: its epoch and step, and the wall-clock seconds of the whole
/// run (resumed sessions included).
#[derive(Debug, Clone, Copy)]
pub(crate) struct RunPosition {
    pub epoch: usize,
    pub step: usize,
    pub steps_per_epoch: usize,
    pub elapsed_seconds: f64,
}

impl RunPosition {
    /// How far through the run this is, from 0 to 1: the larger of the fraction of
    /// `epochs` done and the fraction of `time_limit` (seconds) spent.
    pub(crate) fn progress(&self, epochs: usize, time_limit: Option<f64>) -> f64 {
        let steps = self.steps_per_epoch.max(1) as f64;
        let by_epochs = (self.epoch as f64 + self.step as f64 / steps) / epochs as f64;
        let by_time = time_limit.map_or(0.0, |limit| self.elapsed_seconds / limit);
        by_epochs.max(by_time).clamp(0.0, 1.0)
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LrSchedule {
    /// `lr · lr_decay^epoch`: constant within an epoch, and the same numbers on every
    /// machine.
    PerEpoch { lr: f64, decay: f64 },
    /// `lr · (lr_final / lr)^progress`, where progress runs from 0 to 1 over the run:
    /// the larger of the fraction of epochs done and the fraction of the time limit
    /// spent. With a time limit, the rates (and so the numbers) depend on the machine.
    ToFinal {
        lr: f64,
        lr_final: f64,
        epochs: usize,
        time_limit: Option<f64>,
    },
}

impl LrSchedule {
    pub(crate) fn new(t: &TrainingConfig) -> Self {
        match t.lr_final {
            Some(lr_final) => Self::ToFinal {
                lr: t.lr,
                lr_final,
                epochs: t.epochs,
                time_limit: t.time_limit_seconds(),
            },
            None => Self::PerEpoch {
                lr: t.lr,
                decay: t.lr_decay,
            },
        }
    }

    /// The learning rate of the step at `at`.
    pub(crate) fn rate(&self, at: RunPosition) -> f64 {
        match *self {
            Self::PerEpoch { lr, decay } => lr * decay.powi(at.epoch as i32),
            Self::ToFinal {
                lr,
                lr_final,
                epochs,
                time_limit,
            } => lr * (lr_final / lr).powf(at.progress(epochs, time_limit)),
        }
    }

    /// Whether the rate depends on the clock (and so the numbers on the machine).
    fn follows_the_clock(&self) -> bool {
        matches!(
            self,
            Self::ToFinal {
                time_limit: Some(_),
                ..
            }
        )
    }

    /// One line for the start of a run.
    pub(crate) fn describe(&self) -> String {
        match *self {
            Self::PerEpoch { lr, decay: 1.0 } => format!("learning rate {lr:e}"),
            Self::PerEpoch { lr, decay } => {
                format!("learning rate {lr:e}, multiplied by {decay} after every epoch")
            }
            Self::ToFinal { lr, lr_final, .. } => {
                let clock = match self.follows_the_clock() {
                    true => " or the time limit, whichever comes first; it follows the clock, so the numbers depend on the machine's speed",
                    false => "",
                };
                format!("learning rate {lr:e}, decaying step by step to {lr_final:e} at the last epoch{clock}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(epoch: usize, step: usize, elapsed_seconds: f64) -> RunPosition {
        RunPosition {
            epoch,
            step,
            steps_per_epoch: 4,
            elapsed_seconds,
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-12 * b.abs()
    }

    #[test]
    fn per_epoch_decay_is_kools() {
        let s = LrSchedule::PerEpoch {
            lr: 1e-3,
            decay: 0.5,
        };
        assert_eq!(s.rate(at(0, 3, 99.0)), 1e-3);
        assert_eq!(s.rate(at(2, 0, 0.0)), 2.5e-4);
        assert!(s.describe().contains("0.5 after every epoch"));
    }

    #[test]
    fn to_final_by_epochs_is_geometric_in_steps() {
        // 1e-3 to 1e-5 over 2 epochs of 4 steps: a factor 10^(-2/8) per step.
        let s = LrSchedule::ToFinal {
            lr: 1e-3,
            lr_final: 1e-5,
            epochs: 2,
            time_limit: None,
        };
        assert!(close(s.rate(at(0, 0, 0.0)), 1e-3));
        assert!(close(s.rate(at(0, 2, 1e9)), 1e-4 * 10f64.sqrt()));
        assert!(close(s.rate(at(1, 0, 0.0)), 1e-4));
        assert!(close(s.rate(at(1, 3, 0.0)), 1e-3 * 10f64.powf(-1.75)));
        assert!(close(s.rate(at(2, 0, 0.0)), 1e-5));
        assert!(!s.describe().contains("clock"));
    }

    #[test]
    fn to_final_follows_whichever_ends_the_run_first() {
        // 100 epochs, 600 s: at epoch 10 (10%) and 300 s (50%) the clock leads.
        let s = LrSchedule::ToFinal {
            lr: 1e-3,
            lr_final: 1e-5,
            epochs: 100,
            time_limit: Some(600.0),
        };
        assert!(close(s.rate(at(10, 0, 300.0)), 1e-4));
        // Epoch 50 (50%) after 60 s (10%): the epochs lead.
        assert!(close(s.rate(at(50, 0, 60.0)), 1e-4));
        // Past the limit (the step that crosses it still runs) the rate stays at the end.
        assert!(close(s.rate(at(60, 1, 700.0)), 1e-5));
        assert!(s.describe().contains("follows the clock"));
    }
}
