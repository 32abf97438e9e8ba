//! What a decode is asked for and what it returns; shared by every model.

use burn::tensor::{Int, Tensor};

/// How the next node is chosen at each step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Selection {
    /// The most likely node.
    Greedy,
    /// A sample from the policy, sharpened (T < 1) or flattened (T > 1) by `temperature`.
    /// Samples invert the CDF at the uniforms uploaded with the batch
    /// ([`crate::DeviceBatch::noise`]), so the same noise gives the same samples on every
    /// backend.
    Sample { temperature: f64 },
}

/// Options of one decode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DecodeOptions {
    pub selection: Selection,
    /// POMO's multi-start: one rollout per instance and first customer (n rows each).
    pub multi_start: bool,
    /// Check for "every instance finished" every this many steps (each check is one device
    /// read). Larger values save syncs on a GPU at the cost of up to `check_every - 1`
    /// wasted steps.
    pub check_every: usize,
}

impl DecodeOptions {
    pub const DEFAULT_CHECK_EVERY: usize = 4;

    pub fn greedy() -> Self {
        Self {
            selection: Selection::Greedy,
            multi_start: false,
            check_every: Self::DEFAULT_CHECK_EVERY,
        }
    }

    pub fn sample(temperature: f64) -> Self {
        Self {
            selection: Selection::Sample { temperature },
            ..Self::greedy()
        }
    }

    pub fn with_multi_start(mut self, multi_start: bool) -> Self {
        self.multi_start = multi_start;
        self
    }

    pub fn with_check_every(mut self, check_every: usize) -> Self {
        self.check_every = check_every.max(1);
        self
    }

    pub fn temperature(&self) -> f64 {
        match self.selection {
            Selection::Greedy => 1.0,
            Selection::Sample { temperature } => temperature,
        }
    }
}

/// The result of a decode, the same for every model.
#[derive(Debug, Clone)]
pub struct DecodeOutput {
    /// `[R, T]` visited nodes: 0 for the depot, padded with trailing zeros, on the device.
    /// Rows are instance-major: row `i * rows_per_instance + s`.
    pub actions: Tensor<2, Int>,
    /// `[R]` summed log-probabilities of the chosen nodes; carries gradients on an
    /// autodiff device.
    pub log_likelihood: Tensor<1>,
    /// 1, or n for a multi-start decode.
    pub rows_per_instance: usize,
}
