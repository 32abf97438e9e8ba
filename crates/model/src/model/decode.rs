//! What a decode is asked for and what it returns; shared by every model.

use std::sync::atomic::{AtomicUsize, Ordering};

use burn::tensor::{Device, Int, Tensor};

use crate::model::problem::{max_decode_steps, DeviceBatch};
use crate::model::state::{CvrpState, LoadArithmetic};
use crate::ops::sampling;
use crate::runtime::device::{in_rounds, runs_through_cubecl};

/// Decode steps this process has taken, every decode and chunk together, for a progress
/// display that reads it from another thread while a long decode runs. Decodes that run
/// step by step count (the CPU backends'), and flex's whole multi-start decode counts as
/// they would; a decode in one launch on CubeCL counts none.
static STEPS_TAKEN: AtomicUsize = AtomicUsize::new(0);

/// [`STEPS_TAKEN`] now: read it before and during a decode.
pub fn decode_steps_taken() -> usize {
    STEPS_TAKEN.load(Ordering::Relaxed) + crate::ops::decoder_step::decode_on_flex_steps()
}

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
    /// With `multi_start`, the first this many customers only (rollout s starts at
    /// customer s + 1), where fewer than all n; `None` starts from every customer. Read
    /// as at least one and at most n.
    pub starts: Option<usize>,
    /// Check for "every instance finished" every this many steps (each check is one device
    /// read). Larger values save syncs at the cost of up to `check_every - 1` wasted
    /// steps. CubeCL devices ignore it: they always run 2n steps (`FinishChecks::Never`).
    pub check_every: usize,
    /// Whether the decode sums its choices' log-probabilities (a decode whose tours are
    /// scored afterwards does not: its log-likelihood is zeros).
    pub(crate) log_likelihood: bool,
}

impl DecodeOptions {
    pub const DEFAULT_CHECK_EVERY: usize = 4;

    pub fn greedy() -> Self {
        Self {
            selection: Selection::Greedy,
            multi_start: false,
            starts: None,
            check_every: Self::DEFAULT_CHECK_EVERY,
            log_likelihood: true,
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

    /// A multi-start decode from the first `starts` customers (`None`: every customer).
    pub fn with_starts(mut self, starts: Option<usize>) -> Self {
        self.starts = starts;
        self
    }

    pub fn with_check_every(mut self, check_every: usize) -> Self {
        self.check_every = check_every.max(1);
        self
    }

    /// The same decode without its log-likelihood (zeros), for a decode whose tours are
    /// all that is read (a baseline's, a validation's, an evaluation's): one operation a
    /// step fewer, and on CubeCL devices one launch a step fewer.
    pub fn without_log_likelihood(mut self) -> Self {
        self.log_likelihood = false;
        self
    }

    /// Decodes per instance: for a multi-start decode over n customers n, or its
    /// `starts` where fewer; else 1.
    pub fn rows_per_instance(&self, n: usize) -> usize {
        match (self.multi_start, self.starts) {
            (false, _) => 1,
            // Zero starts would decode nothing and leave the baseline's mean undefined.
            (true, Some(starts)) => starts.max(1).min(n),
            (true, None) => n,
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
/// # Host syncs and op streams
/// The loop never reads the device, except for one boolean "all finished?" read at the
/// steps [`FinishChecks`] names; it is also bounded by [`max_decode_steps`] = 2n, which no
/// decode can exceed. Rows that finish early stay at the depot with log-probability 0, so
/// the batch decodes in lockstep. On CubeCL devices every step issues the same operations
/// (see [`Record`]) and the decode always runs 2n steps with no read, so the fused plans
/// and kernels compiled for the first batch serve all the others.
///
/// With `follow`, each row takes the node its tour names at each step instead of choosing
/// one (the depot past the tour's end): the decode scores given tours.
///
/// # Shapes
/// - `next_log_probs`: state of R rows → `[R, N]`, −∞ at masked nodes
/// - `follow`: `[R, T']` node indices
/// - output `actions`: `[R, T]`, `log_likelihood`: `[R]`, R = B × rows per instance
pub(crate) fn rollout(
    problem: &DeviceBatch,
    options: &DecodeOptions,
    arithmetic: LoadArithmetic,
    follow: Option<&Tensor<2, Int>>,
    mut next_log_probs: impl FnMut(&CvrpState) -> Tensor<2>,
) -> DecodeOutput {
    let [b, n_nodes, _] = problem.coords.dims();
    let n = n_nodes - 1;
    let starts = options.rows_per_instance(n);
    let rows = b * starts;
    let device = problem.coords.device();
    // CubeCL's fusion caches plans (and compiles kernels) per relative op stream: a decode
    // there must issue the same stream for every batch.
    let stable = runs_through_cubecl(&device);
    let (mut state, forced) = start_state(problem, options, arithmetic);

    let max_steps = max_decode_steps(n);
    let mut record = Record::new(rows, max_steps, &device);
    let first_step = usize::from(forced.is_some());
    if let Some(forced) = forced {
        record.push_action(forced);
    }

    let checks = match stable {
        true => FinishChecks::Never,
        false => FinishChecks::Every {
            from: problem.min_steps.max(1),
            every: options.check_every.max(1),
        },
    };
    let noise = sampling_noise(problem, options); // [R, T]
    for step in first_step..max_steps {
        if checks.due(step) && state.finished().all().into_scalar::<bool>() {
            break;
        }
        let log_p = next_log_probs(&state); // [R, N]

        // On CubeCL devices, where the decode chooses, the state's kernel chooses and steps
        // at once, reading the step's column of the noise itself.
        let chosen = match follow {
            None => state.choose_and_step(log_p.clone(), noise.clone().map(|t| (t, step))),
            Some(_) => None,
        };
        let action = match (chosen, follow, &noise) {
            (Some(action), _, _) => action,
            (None, Some(tours), _) => step_to(&mut state, tour_column(tours, step, rows)),
            (None, None, None) => step_to(&mut state, log_p.clone().argmax(1)),
            (None, None, Some(noise)) => {
                let uniform = noise.clone().slice_dim(1, step..step + 1); // [R, 1]
                let log_p = log_p.clone().without_autodiff();
                step_to(&mut state, sampling::sample(log_p, uniform))
            }
        }; // [R, 1]
        if options.log_likelihood {
            record.push_log_prob(log_p.gather(1, action.clone())); // [R, 1]
        }
        record.push_action(action);
        STEPS_TAKEN.fetch_add(1, Ordering::Relaxed);
    }
    record.finish(starts)
}

/// The state a decode of `problem` starts from, one row per instance and start, and where
/// the decode is multi-start, the `[R, 1]` first step it has already taken: POMO's row
/// (instance i, start s) begins with customer s + 1. That move has no probability of its
/// own, so it adds nothing to the log-likelihood.
fn start_state(
    problem: &DeviceBatch,
    options: &DecodeOptions,
    arithmetic: LoadArithmetic,
) -> (CvrpState, Option<Tensor<2, Int>>) {
    let [b, n_nodes, _] = problem.coords.dims();
    let n = n_nodes - 1;
    let starts = options.rows_per_instance(n);
    let mut state = CvrpState::with_arithmetic(
        repeat_rows(problem.demands.clone(), starts),
        repeat_rows(problem.capacity.clone(), starts),
        arithmetic,
    );
    if !options.multi_start {
        return (state, None);
    }
    let forced = Tensor::<1, Int>::arange(1..starts as i64 + 1, &problem.coords.device())
        .reshape([1, starts])
        .expand([b, starts])
        .reshape([b * starts, 1]); // [R, 1]
    state.step(forced.clone());
    (state, Some(forced))
}

/// The uniforms a sampled decode inverts its CDFs at, `[R, T]` (none for a greedy one),
/// outside autodiff as the choice: it carries no gradient, and on an autodiff device each
/// operation of the CDF would be recorded.
pub(crate) fn sampling_noise(problem: &DeviceBatch, options: &DecodeOptions) -> Option<Tensor<2>> {
    match options.selection {
        Selection::Greedy => None,
        Selection::Sample { .. } => Some(
            problem
                .noise
                .clone()
                .expect("a sampled decode needs DeviceBatch noise")
                .without_autodiff(),
        ),
    }
}

/// `state` moved to `action` (`[R, 1]`), which is returned.
fn step_to(state: &mut CvrpState, action: Tensor<2, Int>) -> Tensor<2, Int> {
    state.step(action.clone());
    action
}

/// Column `step` of `tours` (`[R, T']`), or the depot where the tours have ended.
///
/// # Shapes
/// - output: `[R, 1]`
fn tour_column(tours: &Tensor<2, Int>, step: usize, rows: usize) -> Tensor<2, Int> {
    let [_, len] = tours.dims();
    match step < len {
        true => tours.clone().slice_dim(1, step..step + 1),
        false => Tensor::zeros([rows, 1], &tours.device()),
    }
}

/// Bytes of node keys, values and logit keys (3·N·d floats an instance, d = 128 assumed)
/// that a CPU decode keeps for the instances it decodes at once. A greedy step reads them
/// whole, and a batch whose keys outgrow the last-level cache streams them from memory at
/// every step (CVRP100: 155 kB an instance, 80 MB for 512); the encoder's attention scores
/// (H·N² floats an instance) shrink with the chunk too. Measured on 512 CVRP100 instances
/// (greedy, 2 cores, 32 MiB L3): whole batch 2.96 s, chunks of 48 2.42 s, of 128 2.41 s.
const CHUNK_KEY_BYTES: usize = 8 << 20;

/// The most instances of `nodes` nodes (depot included) a decode on `device` takes at once:
/// chunks that fit in cache on the CPU; the whole batch on CubeCL devices, where a launch
/// costs far more than a cache miss and every batch must issue the same op stream.
pub fn decode_chunk(device: &Device, nodes: usize) -> usize {
    match runs_through_cubecl(device) {
        true => usize::MAX,
        false => (CHUNK_KEY_BYTES / (3 * nodes.max(1) * 128 * 4)).max(1),
    }
}

/// Decodes instances `range` of `problem` in chunks of at most `chunk` instances, split as
/// evenly as possible: each chunk's `[rows, steps]` actions, in order, still on the device.
/// On flex as many chunks run at once as rayon has threads (each on its own thread: the
/// decode's small state updates run one op at a time, and one chunk alone kept two cores
/// ~70% busy), then the next as many. A chunk decodes exactly as it would inside the whole
/// batch (greedy rows read only their own instance; a sample reads its own rows of the
/// noise; an inference model's batch norm uses its running statistics), so neither the
/// chunk size nor the threads change a tour.
pub fn decode_in_chunks(
    model: &(impl Policy + Sync),
    problem: &DeviceBatch,
    range: std::ops::Range<usize>,
    options: &DecodeOptions,
    chunk: usize,
) -> Vec<Tensor<2, Int>> {
    // As many chunks as `chunk` asks for, as even as possible (the larger first), so that
    // no round ends with one thread on a short chunk and the other idle.
    let count = range.len().div_ceil(chunk.max(1)).max(1);
    let (base, extra) = (range.len() / count, range.len() % count);
    let parts: Vec<std::ops::Range<usize>> = (0..count)
        .scan(range.start, |start, k| {
            let len = base + usize::from(k < extra);
            *start += len;
            Some(*start - len..*start)
        })
        .collect();
    let decode =
        |part: &std::ops::Range<usize>| model.decode(&problem.shard(part.clone()), options).actions;
    in_rounds(&parts, decode)
}

/// The steps before which a decode reads "all finished?" from the device.
#[derive(Debug, Clone, Copy, PartialEq)]
enum FinishChecks {
    /// Every `every` steps from the batch's host-side lower bound `from` (CPU backends:
    /// a read is cheap, an idle step is not).
    Every { from: usize, every: usize },
    /// Never: every decode runs 2n steps, so every batch replays the plans compiled for
    /// the first (CubeCL). Measured on the CPU runtime: checks at a few fixed steps still
    /// let a later batch stop at a length not seen before and explore its tail.
    Never,
}

impl FinishChecks {
    fn due(self, step: usize) -> bool {
        match self {
            FinishChecks::Every { from, every } => {
                step >= from && (step - from).is_multiple_of(every)
            }
            FinishChecks::Never => false,
        }
    }
}

/// Where a decode's actions and chosen log-probabilities go: the actions in a list,
/// concatenated once at the end ([`cat_columns`]: one fused kernel on CubeCL devices, where
/// a `[R, 2n]` record written in place was a launch a step); the log-probabilities as a
/// running `[R, 1]` sum, added in step order. A row's log-likelihood is then the same bits
/// however long the rest of its batch decodes (the depot steps after a row finishes add
/// exact zeros), where a sum over the record's columns would group its terms in SIMD
/// lanes by the record's length. On CubeCL the add is fused with the step's gather: the
/// same operations at every step however long the decode.
struct Record {
    actions: Vec<Tensor<2, Int>>,
    log_likelihood: Tensor<2>,
}

impl Record {
    fn new(rows: usize, max_steps: usize, device: &Device) -> Self {
        Self {
            actions: Vec::with_capacity(max_steps),
            log_likelihood: Tensor::zeros([rows, 1], device),
        }
    }

    /// `action`: `[R, 1]`, the node chosen at the next step.
    fn push_action(&mut self, action: Tensor<2, Int>) {
        self.actions.push(action);
    }

    /// `log_p`: `[R, 1]`, the chosen node's log-probability.
    fn push_log_prob(&mut self, log_p: Tensor<2>) {
        self.log_likelihood = self.log_likelihood.clone() + log_p;
    }

    fn finish(self, rows_per_instance: usize) -> DecodeOutput {
        DecodeOutput {
            actions: cat_columns(self.actions),                      // [R, T]
            log_likelihood: self.log_likelihood.squeeze_dim::<1>(1), // [R]
            rows_per_instance,
        }
    }
}

/// Tensors cut into at most this many for each `cat` (see [`cat_columns`]).
const CAT_GROUP: usize = 64;

/// `Tensor::cat` along dim 1, [`CAT_GROUP`] tensors at a time, then the groups: CubeCL's
/// fuser makes a `cat` one kernel that binds every input, and a kernel's bindings are
/// bounded (1,024 on CUDA), so a CVRP100 decode's 200 steps are four kernels and a fifth.
pub(crate) fn cat_columns<K: burn::tensor::kind::Basic>(
    tensors: Vec<Tensor<2, K>>,
) -> Tensor<2, K> {
    if tensors.len() <= CAT_GROUP {
        return Tensor::cat(tensors, 1);
    }
    let groups = tensors
        .chunks(CAT_GROUP)
        .map(|group| Tensor::cat(group.to_vec(), 1))
        .collect();
    Tensor::cat(groups, 1)
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::backend::Backend;
    use burn::tensor::TensorData;

    #[test]
    fn rows_per_instance_counts_starts_between_one_and_n() {
        let multi = DecodeOptions::greedy().with_multi_start(true);
        let rows = |starts, n| multi.with_starts(starts).rows_per_instance(n);
        assert_eq!(
            [
                rows(None, 7),
                rows(Some(3), 7),
                rows(Some(9), 7),
                rows(Some(0), 7)
            ],
            [7, 3, 7, 1]
        );
        let single = DecodeOptions::sample(1.0).with_starts(Some(3));
        assert_eq!(single.rows_per_instance(7), 1);
    }

    #[test]
    fn checks_fall_on_the_expected_steps() {
        // A decode runs at most 2n steps: 0..2n.
        let due = |checks: FinishChecks| (0..40).filter(|&s| checks.due(s)).collect::<Vec<_>>();
        assert!(due(FinishChecks::Never).is_empty());
        assert_eq!(
            due(FinishChecks::Every { from: 23, every: 4 }),
            [23, 27, 31, 35, 39]
        );
    }

    crate::runtime::testing::test_with_64_bit_offsets!(
        cube_state_kernel_chooses_as_the_op_by_op_forms
    );

    /// On CubeCL's CPU runtime the state kernel chooses as the op-by-op forms do (Burn's
    /// `argmax`, the inverse CDF CubeCL devices used before it), at every step of walks
    /// through random policies over 32 rows, greedy and sampled; then both states give
    /// the same next mask.
    #[test]
    fn cube_state_kernel_chooses_as_the_op_by_op_forms() {
        use burn::tensor::activation::log_softmax;
        use burn::tensor::Distribution;
        let Some(device) = crate::runtime::testing::device_of(Backend::Cpu) else {
            return;
        };
        let _alone = crate::runtime::testing::one_cube_test_at_a_time();
        let (rows, n) = (32, 9);
        let demands: Vec<f32> = (0..rows * n)
            .map(|i| {
                if i % n == 0 {
                    0.0
                } else {
                    (1 + (i * 7) % 9) as f32
                }
            })
            .collect();
        let capacities: Vec<f32> = (0..rows).map(|r| (8 + (r * 5) % 17) as f32).collect();
        let demands = Tensor::<2>::from_data(TensorData::new(demands, [rows, n]), &device);
        let capacity = Tensor::<2>::from_data(TensorData::new(capacities, [rows, 1]), &device);
        let read = |t: Tensor<2, Int>| t.into_data().iter::<i64>().collect::<Vec<_>>();
        let read_mask =
            |t: Tensor<2, burn::tensor::Bool>| t.into_data().iter::<bool>().collect::<Vec<_>>();
        for sample in [false, true] {
            let arithmetic = LoadArithmetic::Exact;
            let mut reference =
                CvrpState::in_form(demands.clone(), capacity.clone(), arithmetic, false);
            let mut kernel =
                CvrpState::in_form(demands.clone(), capacity.clone(), arithmetic, true);
            for step in 0..2 * n {
                let mask = reference.mask();
                let logits =
                    Tensor::<2>::random([rows, n], Distribution::Normal(0.0, 2.0), &device);
                let log_p = log_softmax(logits.mask_fill(mask, f32::NEG_INFINITY), 1);
                // The whole decode's noise, of which the kernel reads column `step`.
                let noise = sample.then(|| {
                    Tensor::<2>::random([rows, 2 * n], Distribution::Uniform(0.0, 1.0), &device)
                });
                let expected = match &noise {
                    Some(u) => {
                        let uniform = u.clone().slice_dim(1, step..step + 1);
                        crate::ops::sampling::op_by_op(log_p.clone(), uniform)
                    }
                    None => log_p.clone().argmax(1),
                };
                let chosen = kernel
                    .choose_and_step(log_p, noise.map(|u| (u, step)))
                    .expect("CubeCL devices choose in the state kernel");
                let expected = read(expected);
                assert_eq!(read(chosen), expected, "sample {sample}, step {step}");
                let expected =
                    Tensor::<2, Int>::from_data(TensorData::new(expected, [rows, 1]), &device);
                reference.step(expected);
                let remaining = |s: &CvrpState| s.remaining_capacity_fraction().into_data();
                assert_eq!(remaining(&kernel), remaining(&reference), "step {step}");
                assert_eq!(read_mask(kernel.mask()), read_mask(reference.mask()));
            }
        }
    }

    /// A decode step by step adds each of its steps to the process's count (other tests'
    /// decodes may add theirs meanwhile): at least the decode's actions beyond its first.
    #[test]
    fn a_decode_counts_its_steps() {
        use routeburn_data::{Generator, InstanceRng};
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let model = crate::model::small_model(&device);
        let batch = Generator::uniform(8).sample_batch(&mut InstanceRng::new(2), 3);
        let problem = DeviceBatch::upload(&batch, None, &device);
        let before = decode_steps_taken();
        let decoded = model.decode(&problem, &DecodeOptions::greedy());
        let [_, steps] = decoded.actions.dims();
        assert!(steps >= 8);
        assert!(decode_steps_taken() - before >= steps);
    }

    /// The record keeps the actions in order and each row's log-probabilities added in
    /// step order; the depot steps a finished row takes after its tour (log-probability 0)
    /// change no bit of it, whatever the values' rounding.
    #[test]
    fn the_record_adds_log_probabilities_in_step_order() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let (rows, tour_steps, padded_steps) = (3, 11, 20);
        let mut record = Record::new(rows, padded_steps, &device);
        let mut expected_ll = [0.0f32; 3];
        let mut expected_actions = vec![0i64; rows * padded_steps];
        for step in 0..padded_steps {
            let on_tour = step < tour_steps;
            let nodes: Vec<i64> = (0..rows as i64)
                .map(|r| {
                    if on_tour {
                        1 + (r + step as i64) % 3
                    } else {
                        0
                    }
                })
                .collect();
            // Thirds and sevenths round at every add, so the order of the adds shows.
            let log_p: Vec<f32> = (0..rows)
                .map(|r| match on_tour {
                    true => -((r + 2 * step + 1) as f32) / 3.0 - 1.0 / 7.0,
                    false => 0.0,
                })
                .collect();
            for (r, (sum, lp)) in expected_ll.iter_mut().zip(&log_p).enumerate() {
                *sum += lp;
                expected_actions[r * padded_steps + step] = nodes[r];
            }
            let action = Tensor::<2, Int>::from_data(TensorData::new(nodes, [rows, 1]), &device);
            record.push_log_prob(Tensor::from_data(
                TensorData::new(log_p, [rows, 1]),
                &device,
            ));
            record.push_action(action);
        }
        let decoded = record.finish(1);
        let actions = decoded.actions.into_data().convert::<i64>();
        assert_eq!(actions.try_to_vec::<i64>().unwrap(), expected_actions);
        let ll = decoded
            .log_likelihood
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&ll), bits(&expected_ll));
    }

    /// Past [`CAT_GROUP`] columns (a CVRP100 decode's 200 steps), the grouped cat keeps
    /// every column in order.
    #[test]
    fn grouped_cat_keeps_the_columns_in_order() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let columns: Vec<Tensor<2>> = (0..150)
            .map(|i| {
                Tensor::from_data(
                    TensorData::new(vec![i as f32, -(i as f32)], [2, 1]),
                    &device,
                )
            })
            .collect();
        let whole = crate::test_support::read(cat_columns(columns));
        let expected: Vec<f32> = (0..150)
            .map(|i| i as f32)
            .chain((0..150).map(|i| -(i as f32)))
            .collect();
        assert_eq!(whole, expected);
    }
}
