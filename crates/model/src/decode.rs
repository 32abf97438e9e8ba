//! What a decode is asked for and what it returns; shared by every model.

use burn::tensor::{Int, Tensor};

use crate::problem::{max_decode_steps, DeviceBatch};
use crate::state::{CvrpState, LoadArithmetic};

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

    /// Decodes per instance: n for a multi-start decode over n customers, else 1.
    pub fn rows_per_instance(&self, n: usize) -> usize {
        if self.multi_start {
            n
        } else {
            1
        }
    }

    pub fn temperature(&self) -> f64 {
        match self.selection {
            Selection::Greedy => 1.0,
            Selection::Sample { temperature } => temperature,
        }
    }
}

/// A model that decodes solutions: evaluation, solving and baselines need nothing else.
pub trait Policy {
    /// Encodes the batch and decodes a full solution for every instance (or, with
    /// multi-start, one per instance and first customer).
    fn decode(&self, problem: &DeviceBatch, options: &DecodeOptions) -> DecodeOutput;
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

/// The step loop every model shares: the CVRP state, POMO's forced first customer, node
/// selection, the completion check and the log-likelihood.
///
/// `next_log_probs` gives the log-probabilities of the next node for every row from the
/// state (a model reads the node the vehicle stands at from [`CvrpState::last_node`]); a
/// recurrent model keeps its hidden state in the closure.
///
/// # Host syncs
/// The loop never reads the device, except for one boolean "all finished?" read every
/// `check_every` steps, starting only once the host-side lower bound
/// [`DeviceBatch::min_steps`] is reached; it is also bounded by [`max_decode_steps`] = 2n,
/// which no decode can exceed. Rows that finish early stay at the depot with
/// log-probability 0, so the batch decodes in lockstep.
///
/// # Shapes
/// - `next_log_probs`: state of R rows → `[R, N]`, −∞ at masked nodes
/// - output `actions`: `[R, T]`, `log_likelihood`: `[R]`, R = B × rows per instance
pub(crate) fn rollout(
    problem: &DeviceBatch,
    options: &DecodeOptions,
    arithmetic: LoadArithmetic,
    mut next_log_probs: impl FnMut(&CvrpState) -> Tensor<2>,
) -> DecodeOutput {
    let [b, n_nodes, _] = problem.coords.dims();
    let n = n_nodes - 1;
    let starts = options.rows_per_instance(n);
    let rows = b * starts;
    let device = problem.coords.device();
    let mut state = CvrpState::with_arithmetic(
        repeat_rows(problem.demands.clone(), starts),
        repeat_rows(problem.capacity.clone(), starts),
        arithmetic,
    );

    let max_steps = max_decode_steps(n);
    let mut actions: Vec<Tensor<2, Int>> = Vec::with_capacity(max_steps);
    let mut log_probs: Vec<Tensor<2>> = Vec::with_capacity(max_steps);
    let mut first_step = 0;
    if options.multi_start {
        // POMO: row (instance i, start s) begins with customer s + 1. The forced move has
        // no probability of its own, so it adds nothing to the log-likelihood.
        let forced = Tensor::<1, Int>::arange(1..n as i64 + 1, &device)
            .reshape([1, n])
            .expand([b, n])
            .reshape([rows, 1]); // [R, 1]
        state.step(forced.clone());
        actions.push(forced);
        first_step = 1;
    }

    let first_check = problem.min_steps.max(1);
    for step in first_step..max_steps {
        let check_now =
            step >= first_check && (step - first_check).is_multiple_of(options.check_every.max(1));
        if check_now && state.finished().all().into_scalar::<bool>() {
            break;
        }
        let log_p = next_log_probs(&state); // [R, N]
        let action = match options.selection {
            Selection::Greedy => log_p.clone().argmax(1), // [R, 1]
            Selection::Sample { .. } => {
                let noise = problem
                    .noise
                    .as_ref()
                    .expect("a sampled decode needs DeviceBatch noise");
                sample_inverse_cdf(log_p.clone(), noise.clone().slice_dim(1, step..step + 1))
            }
        };
        log_probs.push(log_p.gather(1, action.clone())); // [R, 1]
        state.step(action.clone());
        actions.push(action);
    }

    let log_likelihood = if log_probs.is_empty() {
        Tensor::zeros([rows], &device)
    } else {
        Tensor::cat(log_probs, 1).sum_dim(1).squeeze_dim::<1>(1) // [R]
    };
    DecodeOutput {
        actions: Tensor::cat(actions, 1), // [R, T]
        log_likelihood,
        rows_per_instance: starts,
    }
}

/// Repeats each row `times` times, instance-major: `[B, ...]` → `[B × times, ...]`.
pub(crate) fn repeat_rows<const D: usize>(t: Tensor<D>, times: usize) -> Tensor<D> {
    if times == 1 {
        return t;
    }
    let b = t.dims()[0];
    let rows =
        Tensor::<1, Int>::arange(0..(b * times) as i64, &t.device()).div_scalar(times as i64); // [B × times]
    t.select(0, rows)
}

/// Samples one node per row by inverting the cumulative distribution at a uniform from the
/// batch's noise. Masked nodes have probability exactly 0 (exp(−∞)), so they occupy no
/// interval of the CDF and can never be selected; deterministic for a given noise.
///
/// # Shapes
/// - `log_p`: `[R, N]`, `uniform`: `[R, 1]` in (0, 1) → `[R, 1]`
fn sample_inverse_cdf(log_p: Tensor<2>, uniform: Tensor<2>) -> Tensor<2, Int> {
    let [r, n] = log_p.dims();
    let cdf = log_p.exp().cumsum(1); // [R, N]
    let total = cdf.clone().slice_dim(1, n - 1..n); // [R, 1]
    let threshold = (uniform * total).expand([r, n]); // [R, N]
    cdf.lower(threshold)
        .int()
        .sum_dim(1)
        .clamp_max((n - 1) as i64) // [R, 1]
}
