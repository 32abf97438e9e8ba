//! A multi-start decode on flex as one operation, instance by instance: every step of an
//! instance's rows (the step from the compatibility tables, the choice, the state's step
//! and its next mask) runs before the next instance's, and with gradients the backward
//! pass runs each instance's steps last first.
//!
//! Step by step, each of a CVRP100 decode's ~130 steps swept the whole batch: 64
//! instances' tables, values and logit keys (~0.5 MB each) came back from L3 or memory at
//! every step, and the state, the mask, the choice and autodiff's bookkeeping were a dozen
//! operations on `[R, N]` tensors a step. Here an instance's inputs stay in its core's L2
//! across its steps, and the state is a few values a row.
//!
//! The same numbers as the step-by-step decode, bit for bit: the same kernels on the same
//! rows (rows are independent in the forward pass), the mask, the state's step and the
//! choices in the same float operations (`crate::ops::mask`, `CvrpState::step`, flex's
//! argmax and [`inverse_cdf_picks`]), the log-likelihood summed in step order, and in the
//! backward pass each instance's gradients added to the decode's sums in the order
//! autodiff ran the steps (`flex_kernel::backward_instance_step`). A decode stops where
//! the step-by-step one would: at the first of its "all finished?" checks after the batch
//! has finished; an instance that finished before then waits at the depot (its steps
//! choose the depot with log-probability 0, and add exact zeros to the gradients).

use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;

use super::flex_kernel::{self, CompatTables, Dims, Inputs, InstanceWork, Saved, Scale};
use crate::ops::mask::{node_masks, MaskIn};
use crate::ops::row_kernels::{padded, unwritten};
use crate::ops::sampling::inverse_cdf_picks;

/// Steps these decodes have taken, for the progress display (`decode_steps_taken`): a
/// decode's steps as the step-by-step decode counts them, one for each of its units'
/// steps divided by its units, so that the count grows with the work done, however the
/// units share the threads.
static STEPS_TAKEN: AtomicUsize = AtomicUsize::new(0);

/// One decode's count of its units' steps, and how many units it has.
struct UnitSteps {
    taken: AtomicUsize,
    units: usize,
}

impl UnitSteps {
    /// One more unit's step: one more of [`STEPS_TAKEN`] at every `units`-th.
    fn add_one(&self) {
        let taken = self.taken.fetch_add(1, Ordering::Relaxed) + 1;
        if taken.is_multiple_of(self.units) {
            STEPS_TAKEN.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// [`STEPS_TAKEN`] now.
pub(crate) fn steps_taken() -> usize {
    STEPS_TAKEN.load(Ordering::Relaxed)
}

/// What a decode reads, for the whole batch of B instances × S rows. The tables in their
/// layouts (`[B, N, d]` the keys, values and logit keys, `[B, 3d, Np]` by feature,
/// `[B, (N + 1)·H, Np]` the compatibility tables); the loads `[R, N]` and `[R]` as
/// `crate::ops::state_step::Loads` has them; the noise `[R, width]` of a sampled decode.
pub(crate) struct Batch<'a> {
    pub dims: Dims,
    pub glimpse_keys: &'a [f32],
    pub glimpse_values: &'a [f32],
    pub logit_keys: &'a [f32],
    pub by_feature: &'a [f32],
    pub tables: &'a [f32],
    pub demands: &'a [f32],
    pub capacity: &'a [f32],
    pub tolerance: f32,
    pub noise: Option<(&'a [f32], usize)>,
}

/// How a decode runs: its scale, at most `max_steps` steps, the "all finished?" checks at
/// steps `from, from + every, …`, and whether it sums the log-likelihood.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Plan {
    pub scale: Scale,
    pub max_steps: usize,
    pub checks: (usize, usize),
    pub log_likelihood: bool,
}

/// One instance's slices of the batch's tables.
struct InstanceTables<'a> {
    glimpse_keys: &'a [f32],
    glimpse_values: &'a [f32],
    logit_keys: &'a [f32],
    by_feature: &'a [f32],
    table: &'a [f32],
}

impl<'a> Batch<'a> {
    fn instance(&self, i: usize) -> InstanceTables<'a> {
        let Dims {
            nodes: n, heads: h, ..
        } = self.dims;
        let (nd, np) = (n * self.dims.heads * self.dims.head_dim, padded(n));
        let (by_feature, table) = (3 * (nd / n) * np, (n + 1) * h * np);
        InstanceTables {
            glimpse_keys: &self.glimpse_keys[i * nd..][..nd],
            glimpse_values: &self.glimpse_values[i * nd..][..nd],
            logit_keys: &self.logit_keys[i * nd..][..nd],
            by_feature: &self.by_feature[i * by_feature..][..by_feature],
            table: &self.tables[i * table..][..table],
        }
    }
}

impl<'a> InstanceTables<'a> {
    /// A step's inputs for rows at `last_node` with `remaining` and `mask`.
    fn inputs<'s>(&self, mask: &'s [u8], last_node: &'s [usize], remaining: &'s [f32]) -> Inputs<'s>
    where
        'a: 's,
    {
        Inputs {
            query: &[],
            glimpse_keys: self.glimpse_keys,
            glimpse_values: self.glimpse_values,
            logit_keys: self.logit_keys,
            by_feature: self.by_feature,
            mask,
            compat: Some(CompatTables {
                tables: self.table,
                last_node,
                remaining,
            }),
        }
    }
}

/// Some consecutive rows of one instance and their state: the node each stands at, its
/// route's load and the customers it has served, stepped as `crate::model::state::CvrpState`
/// steps.
struct Rows<'a> {
    demands: &'a [f32],
    capacity: &'a [f32],
    tolerance: f32,
    nodes: usize,
    last_node: Vec<usize>,
    used: Vec<f32>,
    /// `[rows, N]` 1 where served (the depot's column too, which nothing reads).
    visited: Vec<u8>,
    /// How many customers each row has served.
    served: Vec<usize>,
}

impl<'a> Rows<'a> {
    /// At the depot with empty routes.
    fn new(demands: &'a [f32], capacity: &'a [f32], tolerance: f32, nodes: usize) -> Self {
        let rows = capacity.len();
        Self {
            demands,
            capacity,
            tolerance,
            nodes,
            last_node: vec![0; rows],
            used: vec![0.0; rows],
            visited: vec![0; rows * nodes],
            served: vec![0; rows],
        }
    }

    /// Each row to its node in `actions`: a depot visit starts a new route.
    fn step(&mut self, actions: &[usize]) {
        let n = self.nodes;
        for (r, &a) in actions.iter().enumerate() {
            let load = self.used[r] + self.demands[r * n + a];
            self.used[r] = if a == 0 { 0.0 } else { load };
            self.served[r] += usize::from(a != 0 && self.visited[r * n + a] == 0);
            self.visited[r * n + a] = 1;
            self.last_node[r] = a;
        }
    }

    /// Whether every row has served every customer.
    fn finished(&self) -> bool {
        self.served.iter().all(|&served| served + 1 == self.nodes)
    }

    /// The next step's mask (`[rows, N]`, 1 where a node may not be chosen), by the mask
    /// operation's own rows ([`node_masks`]), and each row's remaining capacity fraction.
    fn mask(&self, mask: &mut [u8], remaining: &mut [f32]) {
        let at_depot: Vec<bool> = self.last_node.iter().map(|&node| node == 0).collect();
        let x = MaskIn {
            nodes: self.nodes,
            demands: self.demands,
            visited: &self.visited,
            used: &self.used,
            capacity: self.capacity,
            tolerance: self.tolerance,
            at_depot: &at_depot,
        };
        node_masks(&x, mask);
        let rows = remaining.iter_mut().zip(self.capacity).zip(&self.used);
        for ((remaining, &capacity), &used) in rows {
            *remaining = (capacity - used) / capacity;
        }
    }
}

/// What a step kept for the backward pass: the rows' mask, nodes and remaining capacity
/// fractions it met, and the forward pass's saved values (its log-probabilities are not
/// among them: the backward pass remakes them from [`Saved::log_sum`]).
struct KeptStep {
    mask: Vec<u8>,
    last_node: Vec<usize>,
    remaining: Vec<f32>,
    saved: Saved,
}

/// One unit's decode: its rows' choices step after step (`[steps, rows]`, the first POMO's
/// forced step), their log-likelihoods, the step before which all had finished
/// (`max_steps` where they had not), and with gradients what each chosen step kept.
pub(crate) struct UnitRun {
    first_row: usize,
    rows: usize,
    actions: Vec<usize>,
    log_likelihood: Vec<f32>,
    finished_at: usize,
    kept: Vec<KeptStep>,
}

/// Rows `rows` of instance `i` (its starts: row s begins at customer s + 1), to the end of
/// their tours. With `keep`, each step keeps what the backward pass needs (`keep` says
/// whether the attention weights are among it); each step counts in `steps`.
fn run_unit(
    batch: &Batch,
    plan: &Plan,
    (i, rows): (usize, std::ops::Range<usize>),
    (keep, steps): (Option<bool>, &UnitSteps),
) -> UnitRun {
    let Dims {
        starts: s,
        nodes: n,
        ..
    } = batch.dims;
    let (first_row, len) = (i * s + rows.start, rows.len());
    let dims = Dims {
        instances: 1,
        starts: len,
        ..batch.dims
    };
    let mut state = Rows::new(
        &batch.demands[first_row * n..][..len * n],
        &batch.capacity[first_row..][..len],
        batch.tolerance,
        n,
    );
    let mut run = UnitRun {
        first_row,
        rows: len,
        actions: rows.map(|s| s + 1).collect(),
        log_likelihood: vec![0.0; len],
        finished_at: plan.max_steps,
        kept: Vec::new(),
    };
    state.step(&run.actions);
    let tables = batch.instance(i);
    let mut picks = vec![0; len];
    for t in 1..plan.max_steps {
        if state.finished() {
            run.finished_at = t;
            break;
        }
        let (mut mask, mut remaining) = (vec![0u8; len * n], vec![0.0f32; len]);
        state.mask(&mut mask, &mut remaining);
        let x = tables.inputs(&mask, &state.last_node, &remaining);
        let (log_probs, saved) = flex_kernel::forward_alone(dims, plan.scale, &x, keep);
        choose(&log_probs, n, batch.noise, (t, first_row), &mut picks);
        if plan.log_likelihood {
            let chosen = log_probs.chunks_exact(n).zip(&picks);
            for (ll, (row, &pick)) in run.log_likelihood.iter_mut().zip(chosen) {
                *ll += row[pick];
            }
        }
        run.actions.extend_from_slice(&picks);
        if let Some(saved) = saved {
            let last_node = state.last_node.clone();
            run.kept.push(KeptStep {
                mask,
                last_node,
                remaining,
                saved,
            });
        }
        state.step(&picks);
        steps.add_one();
    }
    run
}

/// Each row's choice from its log-probabilities `[rows, N]` at step `t` (the unit's rows
/// from the batch's `first_row`): the most likely node (the first of equal ones, as flex's
/// argmax), or with the noise `[R, width]`, the inverse of the row's CDF at its uniform in
/// column `t`.
fn choose(
    log_probs: &[f32],
    n: usize,
    noise: Option<(&[f32], usize)>,
    (t, first_row): (usize, usize),
    picks: &mut [usize],
) {
    match noise {
        None => {
            for (pick, row) in picks.iter_mut().zip(log_probs.chunks_exact(n)) {
                let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
                *pick = row
                    .iter()
                    .position(|&v| v.is_nan() || v == max)
                    .unwrap_or(0);
            }
        }
        Some((noise, width)) => {
            let uniforms: Vec<f32> = (0..picks.len())
                .map(|r| noise[(first_row + r) * width + t])
                .collect();
            let mut chosen = vec![0i64; picks.len()];
            inverse_cdf_picks(log_probs, &uniforms, n, &mut chosen);
            for (pick, &c) in picks.iter_mut().zip(&chosen) {
                *pick = c as usize;
            }
        }
    }
}

/// The steps a decode takes in all, POMO's forced first included: the first check at or
/// after `finished` (the step before which every row had finished), at most `max_steps`.
fn decode_length(finished: usize, plan: &Plan) -> usize {
    let (from, every) = plan.checks;
    if finished >= plan.max_steps {
        return plan.max_steps;
    }
    let at = finished.max(from);
    (from + (at - from).div_ceil(every) * every).min(plan.max_steps)
}

/// A whole decode: each unit's run (in row order) and the decode's length.
pub(crate) struct DecodeRun {
    pub(crate) units: Vec<UnitRun>,
    pub(crate) length: usize,
}

/// The decode of every row of `batch`. With `keep` (a decode with gradients) one unit per
/// instance, each keeping what its backward pass needs; without, an instance's rows are
/// split where there are too few instances to keep every thread busy (one large
/// instance's starts): rows are independent.
pub(crate) fn decode(batch: &Batch, plan: &Plan, keep: bool) -> DecodeRun {
    let Dims {
        instances: b,
        starts: s,
        ..
    } = batch.dims;
    let per_instance = match keep {
        true => 1,
        false => (4 * rayon::current_num_threads()).div_ceil(b.max(1)),
    };
    let rows = s.div_ceil(per_instance).next_multiple_of(8).max(1);
    let units: Vec<(usize, std::ops::Range<usize>)> = (0..b)
        .flat_map(|i| (0..s).step_by(rows).map(move |r| (i, r..(r + rows).min(s))))
        .collect();
    let keep = keep.then(|| flex_kernel::keeps_attention(batch.dims));
    let steps = UnitSteps {
        taken: AtomicUsize::new(0),
        units: units.len().max(1),
    };
    let units: Vec<UnitRun> = (units.into_par_iter())
        .map(|unit| run_unit(batch, plan, unit, (keep, &steps)))
        .collect();
    let finished = units.iter().map(|u| u.finished_at).max().unwrap_or(1);
    DecodeRun {
        length: decode_length(finished, plan),
        units,
    }
}

impl DecodeRun {
    /// The actions `[R, length]` (0, the depot, after a unit's own end) and the
    /// log-likelihoods `[R]`.
    pub(crate) fn outputs(&self, rows: usize) -> (Vec<i64>, Vec<f32>) {
        let t_end = self.length;
        let mut actions = vec![0i64; rows * t_end];
        let mut log_likelihood = vec![0.0f32; rows];
        for unit in &self.units {
            let taken = unit.actions.len() / unit.rows;
            for (t, step) in unit.actions.chunks_exact(unit.rows).enumerate().take(taken) {
                for (r, &a) in step.iter().enumerate() {
                    actions[(unit.first_row + r) * t_end + t] = a as i64;
                }
            }
            log_likelihood[unit.first_row..][..unit.rows].copy_from_slice(&unit.log_likelihood);
        }
        (actions, log_likelihood)
    }

    /// The gradients `[dv, dl, dt]` of the glimpse values and logit keys (`[B, N, d]`) and
    /// the compatibility tables (`[B, (N + 1)·H, Np]`) from the log-likelihoods' `[R]`: for
    /// each instance (a unit, as a decode with gradients has them), its steps last first,
    /// as autodiff ran the step-by-step decode's, each step's output gradient the row's
    /// at the node it chose (`0 + g`, as the gather's backward scatters it into zeros).
    pub(crate) fn backward(&self, batch: &Batch, scale: Scale, grad: &[f32]) -> [Vec<f32>; 3] {
        debug_assert_eq!(self.units.len(), batch.dims.instances, "a unit an instance");
        let Dims {
            instances: b,
            starts: s,
            nodes: n,
            heads: h,
            ..
        } = batch.dims;
        let (nd, table) = (batch.glimpse_values.len() / b, (n + 1) * h * padded(n));
        // Each is written by an instance's last step; a decode of one step has none.
        let [mut dv, mut dl, mut dt] = [nd, nd, table].map(|len| match self.length > 1 {
            true => unwritten(b * len),
            false => vec![0.0; b * len],
        });
        let dims = Dims {
            instances: 1,
            ..batch.dims
        };
        // A finished row's mask: the depot alone open.
        let finished: Vec<u8> = (0..s * n).map(|k| u8::from(k % n != 0)).collect();
        let nowhere = (vec![0usize; s], vec![0.0f32; s]);
        let unread = Saved {
            attention: None,
            glimpse: Vec::new(),
            tanh: Vec::new(),
            log_sum: Vec::new(),
            piece_rows: s,
        };
        let per_instance = (dv.par_chunks_mut(nd).zip(dl.par_chunks_mut(nd)))
            .zip(dt.par_chunks_mut(table))
            .zip(&self.units);
        per_instance.enumerate().for_each_init(
            || (InstanceWork::default(), vec![0.0f32; s * n]),
            |(work, grad_out), (i, (((dv, dl), dt), unit))| {
                let tables = batch.instance(i);
                let grad = &grad[i * s..][..s];
                for t in (1..self.length).rev() {
                    let adding = t + 1 != self.length;
                    let sums = [&mut dv[..], &mut dl[..], &mut dt[..]];
                    let Some(step) = unit.kept.get(t - 1) else {
                        let x = tables.inputs(&finished, &nowhere.0, &nowhere.1);
                        let step = (&x, &unread, &grad_out[..]);
                        flex_kernel::backward_instance_step(dims, scale, step, sums, adding, work);
                        continue;
                    };
                    let chosen = &unit.actions[t * s..][..s];
                    for (r, (&c, &g)) in chosen.iter().zip(grad).enumerate() {
                        grad_out[r * n + c] = 0.0 + g;
                    }
                    let x = tables.inputs(&step.mask, &step.last_node, &step.remaining);
                    let step_in = (&x, &step.saved, &grad_out[..]);
                    flex_kernel::backward_instance_step(dims, scale, step_in, sums, adding, work);
                    for (r, &c) in chosen.iter().enumerate() {
                        grad_out[r * n + c] = 0.0;
                    }
                }
            },
        );
        [dv, dl, dt]
    }
}
