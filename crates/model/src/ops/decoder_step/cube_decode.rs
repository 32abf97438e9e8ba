//! A whole decode without gradients as one CubeCL kernel: every step's decoder step, the
//! row's choice and the state's step to it, in a loop inside the kernel.
//!
//! One cube per row, as [`super::cube_kernel`]'s step: a row's steps read only the row's
//! own state and its instance's keys, so the cube can take them one after another with
//! barriers between, and no step needs another cube's work. A decode of 2n steps was 2n
//! launches (~30 µs of host time each on an H200, measured in session 34): here it is one.
//!
//! Each step is the same code as the one-step kernel's ([`query_from_context`],
//! [`step_row`], `crate::ops::state_step::cube_kernel::choose_in_cube` and `step_in_cube`), so the tours and
//! log-likelihoods are the step-by-step decode's bit for bit. The state lives in two sets
//! of row buffers: a step reads the current set and writes the next, which is then copied
//! back (a row's `N + 4` values, against the step's `H·N·d` products).

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::{DType, Shape};
// The `cube` macro's expansion names the `cubecl` crate: Burn's re-export of it.
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::cubecl::CubeCount;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use super::cube_kernel::{query_from_context, step_row, StepContext, StepInputs, StepShape, UNITS};
use super::DecodeSpan;
use crate::ops::state_step::cube_kernel::{choose_in_cube, step_in_cube, Loads, StateSet};
use crate::runtime::cube_launch::{address_type, cube_dim};

/// What a decode's state steps read (`demands` `[R, N]`, `capacity` `[R, 1]`, the
/// tolerance; as `crate::ops::state_step::Loads`), the noise `[R, T]` a sampled decode reads column
/// by column, and tensors of the int and bool types the actions and masks take.
pub(crate) struct DecodeStart {
    pub demands: CubeTensor,
    pub capacity: CubeTensor,
    pub tolerance: f32,
    pub noise: CubeTensor,
    pub sample: bool,
    pub int_like: CubeTensor,
    pub bool_like: CubeTensor,
}

/// The shapes of [`decode`]'s five outputs for `rows` rows of `nodes` nodes: the actions
/// `[R, first + steps]`, the log-likelihood `[R]`, and what each step met, the masks
/// `[R, K, N]`, remaining capacity fractions `[R, K]` and context rows `[R, K]` (K =
/// `steps`, or 1 × 1 stand-ins where not recorded).
pub(crate) fn output_shapes(span: &DecodeSpan, rows: usize, nodes: usize) -> [Shape; 5] {
    let (seen_rows, seen_steps, seen_nodes) = match span.record_seen {
        true => (rows, span.steps, nodes),
        false => (1, 1, 1),
    };
    [
        Shape::new([rows, span.first + span.steps]),
        Shape::new([rows]),
        Shape::new([seen_rows, seen_steps, seen_nodes]),
        Shape::new([seen_rows, seen_steps]),
        Shape::new([seen_rows, seen_steps]),
    ]
}

/// The decode: `[actions, log_likelihood, seen_mask, seen_remaining, seen_rows]` as
/// [`output_shapes`] (the actions and rows in `last_node`'s int type, the masks in `mask`'s
/// bool type); the log-likelihood is zeros unless the span asks for it. A step's context
/// row is where its context is read in the instances' node rows `[B × N, d]`: i · N + the
/// node the row stands at.
///
/// # Shapes
/// - `fixed_context`: `[B, 1, d]`, `last_node_context`: `[B, N, d]`, `capacity_context`:
///   `[1, 1, d]`, `by_feature`: `[B, 3d, Np]`; the start as [`DecodeStart`]
pub(crate) fn decode(
    [fixed_context, last_node_context, capacity_context]: [CubeTensor; 3],
    by_feature: CubeTensor,
    start: DecodeStart,
    span: DecodeSpan,
    heads: usize,
    (tanh_clipping, temperature): (f32, f32),
) -> [CubeTensor; 5] {
    let inputs = [
        fixed_context,
        last_node_context,
        capacity_context,
        by_feature,
        start.noise,
        start.demands,
        start.capacity,
    ]
    .map(into_contiguous);
    let [_, last_node_context, _, by_feature, _, demands, _] = &inputs;
    let [b, nodes, d] = last_node_context.meta.shape().dims::<3>();
    let shape = StepShape::new(heads, d, nodes, by_feature, false);
    let float = last_node_context.dtype;
    let dtypes = [float, start.int_like.dtype, start.bool_like.dtype];
    let work = WorkingTensors::new(demands, dtypes, b, d, &span);
    let scalars = DecodeScalarsLaunch::new(
        tanh_clipping / temperature,
        start.tolerance,
        u32::from(start.sample),
        span.first as u32,
        span.steps as u32,
        u32::from(span.log_likelihood),
        u32::from(span.record_seen),
    );
    work.launch(inputs, scalars, shape, dtypes)
}

/// What [`decode`] allocates beside its inputs: the step's query `[B, S, d]` and
/// log-probabilities `[R, N]`; the state's current and next sets, each the node a row
/// stands at, its load, served flags, mask and remaining capacity fraction (`[R, 1]`,
/// `[R, 1]`, `[R, N]`, `[R, N]`, `[R, 1]`); and the five outputs as [`output_shapes`].
struct WorkingTensors {
    query: CubeTensor,
    log_p: CubeTensor,
    now: [CubeTensor; 5],
    next: [CubeTensor; 5],
    outputs: [CubeTensor; 5],
}

impl WorkingTensors {
    /// For `demands`' rows `[R, N]` (R = B · S), in the float, int and bool `dtypes`, on
    /// `demands`' device.
    fn new(
        demands: &CubeTensor,
        dtypes: [DType; 3],
        b: usize,
        d: usize,
        span: &DecodeSpan,
    ) -> Self {
        let [rows, nodes] = demands.meta.shape().dims::<2>();
        let [float, int, boolean] = dtypes;
        let empty = |shape: Shape, dtype| {
            let (client, device) = (demands.client.clone(), demands.device.clone());
            empty_device_contiguous_dtype(client, device, shape, dtype)
        };
        let state = || {
            [
                empty(Shape::new([rows, 1]), int),
                empty(Shape::new([rows, 1]), float),
                empty(Shape::new([rows, nodes]), float),
                empty(Shape::new([rows, nodes]), boolean),
                empty(Shape::new([rows, 1]), float),
            ]
        };
        let [actions, log_likelihood, seen_mask, seen_remaining, seen_rows] =
            output_shapes(span, rows, nodes);
        Self {
            query: empty(Shape::new([b, rows / b, d]), float),
            log_p: empty(Shape::new([rows, nodes]), float),
            now: state(),
            next: state(),
            outputs: [
                empty(actions, int),
                empty(log_likelihood, float),
                empty(seen_mask, boolean),
                empty(seen_remaining, float),
                empty(seen_rows, int),
            ],
        }
    }

    /// [`decode_kernel`] on `inputs` (the contexts, keys by feature, noise, demands and
    /// capacity, as [`decode`] lists them) with these tensors; the outputs.
    fn launch(
        self,
        inputs: [CubeTensor; 7],
        scalars: DecodeScalarsLaunch,
        shape: StepShape,
        dtypes: [DType; 3],
    ) -> [CubeTensor; 5] {
        let client = inputs[0].client.clone();
        let rows = self.log_p.meta.shape()[0];
        let address = address_type(inputs.iter().chain(self.all()));
        let [fixed_context, last_node_context, capacity_context, by_feature, noise, demands, capacity] =
            inputs;
        let WorkingTensors {
            query,
            log_p,
            now: [now_node, now_used, now_served, now_mask, now_remaining],
            next: [next_node, next_used, next_served, next_mask, next_remaining],
            outputs,
        } = self;
        let [actions, log_likelihood, seen_mask, seen_remaining, seen_rows] = outputs.clone();
        decode_kernel::launch(
            &client,
            CubeCount::Static(rows as u32, 1, 1),
            cube_dim(&client, UNITS),
            address,
            fixed_context.into_tensor_arg(),
            last_node_context.into_tensor_arg(),
            capacity_context.into_tensor_arg(),
            by_feature.into_tensor_arg(),
            noise.into_tensor_arg(),
            demands.into_tensor_arg(),
            capacity.into_tensor_arg(),
            query.into_tensor_arg(),
            log_p.into_tensor_arg(),
            now_node.into_tensor_arg(),
            now_used.into_tensor_arg(),
            now_served.into_tensor_arg(),
            now_mask.into_tensor_arg(),
            now_remaining.into_tensor_arg(),
            next_node.into_tensor_arg(),
            next_used.into_tensor_arg(),
            next_served.into_tensor_arg(),
            next_mask.into_tensor_arg(),
            next_remaining.into_tensor_arg(),
            actions.into_tensor_arg(),
            log_likelihood.into_tensor_arg(),
            seen_mask.into_tensor_arg(),
            seen_remaining.into_tensor_arg(),
            seen_rows.into_tensor_arg(),
            scalars,
            shape,
            dtypes.map(dtype_to_storage_type),
        );
        outputs
    }

    fn all(&self) -> impl Iterator<Item = &CubeTensor> {
        [&self.query, &self.log_p]
            .into_iter()
            .chain(&self.now)
            .chain(&self.next)
            .chain(&self.outputs)
    }
}

/// What a decode's launch passes as values: C / T (the tanh clipping over the
/// temperature), the capacity test's tolerance, whether rows sample (1) or take the most
/// likely node (0), POMO's forced first step (`first`, 0 or 1) and the steps after it, and
/// whether the log-likelihood is summed and what each step met is recorded (1 or 0).
#[derive(CubeLaunch, CubeType)]
struct DecodeScalars {
    scale: f32,
    tolerance: f32,
    sample: u32,
    first: u32,
    steps: u32,
    keep_log_likelihood: u32,
    record_seen: u32,
}

/// A row's state as the decode keeps it: the node it stands at (`[R, 1]`) and the rest
/// (a [`StateSet`]), in the current set a step reads and the next set it writes.
#[derive(CubeType)]
struct DecodeState<'a, F: Float, I: Int, M: Int> {
    now_node: &'a mut Tensor<I>,
    now: StateSet<'a, F, M>,
    next_node: &'a mut Tensor<I>,
    next: StateSet<'a, F, M>,
}

/// What the decode gives back, as [`output_shapes`]: the actions, the log-likelihood and,
/// where recorded, each step's mask, remaining capacity fraction and context row.
#[derive(CubeType)]
struct DecodeRecord<'a, F: Float, I: Int, M: Int> {
    actions: &'a mut Tensor<I>,
    log_likelihood: &'a mut Tensor<F>,
    seen_mask: &'a mut Tensor<M>,
    seen_remaining: &'a mut Tensor<F>,
    seen_rows: &'a mut Tensor<I>,
}

/// Row `CUBE_POS_X`'s whole decode: the start state ([`start_row`]), then its steps
/// ([`decode_steps`]).
#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn decode_kernel<F: Float, I: Int, M: Int>(
    fixed_context: &Tensor<F>,
    last_node_context: &Tensor<F>,
    capacity_context: &Tensor<F>,
    by_feature: &Tensor<F>,
    noise: &Tensor<F>,
    demands: &Tensor<F>,
    capacity: &Tensor<F>,
    query: &mut Tensor<F>,
    log_p: &mut Tensor<F>,
    now_node: &mut Tensor<I>,
    now_used: &mut Tensor<F>,
    now_served: &mut Tensor<F>,
    now_mask: &mut Tensor<M>,
    now_remaining: &mut Tensor<F>,
    next_node: &mut Tensor<I>,
    next_used: &mut Tensor<F>,
    next_served: &mut Tensor<F>,
    next_mask: &mut Tensor<M>,
    next_remaining: &mut Tensor<F>,
    actions: &mut Tensor<I>,
    log_likelihood: &mut Tensor<F>,
    seen_mask: &mut Tensor<M>,
    seen_remaining: &mut Tensor<F>,
    seen_rows: &mut Tensor<I>,
    scalars: &DecodeScalars,
    #[comptime] shape: StepShape,
    #[define(F, I, M)] _dtypes: [ElemType; 3],
) {
    let row = CUBE_POS_X as usize;
    let (starts, first) = (query.shape(1), scalars.first as usize);
    let loads = Loads::new(demands, capacity, scalars.tolerance);
    let mut state = DecodeState::new(
        now_node,
        StateSet::new(now_used, now_served, now_mask, now_remaining),
        next_node,
        StateSet::new(next_used, next_served, next_mask, next_remaining),
    );
    let mut record = DecodeRecord::new(
        actions,
        log_likelihood,
        seen_mask,
        seen_remaining,
        seen_rows,
    );
    let mut flags = Shared::new_slice(2usize);
    start_row(
        row,
        starts,
        first,
        &loads,
        &mut state,
        &mut record,
        &mut flags,
    );
    let context = StepContext::new(fixed_context, last_node_context, capacity_context);
    let mut attention = Shared::new_slice(shape.heads * shape.padded_nodes);
    let mut logits = Shared::new_slice(shape.padded_nodes);
    let inputs = StepTensors::new(&context, by_feature, noise, &loads);
    let scratch = DecodeScratch::new(&mut attention, &mut logits, &mut flags);
    decode_steps(
        row,
        &inputs,
        query,
        log_p,
        &mut state,
        &mut record,
        scratch,
        scalars,
        shape,
    );
}

/// What every step of a row's decode reads: the context its query is made from, the keys
/// by feature, the sampling noise and the loads.
#[derive(CubeType)]
struct StepTensors<'a, F: Float> {
    context: &'a StepContext<'a, F>,
    by_feature: &'a Tensor<F>,
    noise: &'a Tensor<F>,
    loads: &'a Loads<'a, F>,
}

/// A row's shared memory: the heads' attention `[H · Np]`, the logits `[Np]` and the
/// choice's two flags.
#[derive(CubeType)]
struct DecodeScratch<'a> {
    attention: &'a mut Shared<[f32]>,
    logits: &'a mut Shared<[f32]>,
    flags: &'a mut Shared<[f32]>,
}

/// Row `row`'s steps `first..first + steps` from its start: at each, what it meets
/// recorded (where asked, [`record_seen`]), the query from the context
/// ([`query_from_context`]), the step ([`step_row`]), the choice (`choose_in_cube`, noise
/// column `first + t`), the state's step into the next set and the next set copied back
/// ([`step_and_copy_back`]), with the action (and the chosen log-probability, where asked)
/// recorded.
#[cube]
#[allow(clippy::too_many_arguments)]
fn decode_steps<F: Float, I: Int, M: Int>(
    row: usize,
    inputs: &StepTensors<F>,
    query: &mut Tensor<F>,
    log_p: &mut Tensor<F>,
    state: &mut DecodeState<F, I, M>,
    record: &mut DecodeRecord<F, I, M>,
    scratch: DecodeScratch,
    scalars: &DecodeScalars,
    #[comptime] shape: StepShape,
) {
    let (starts, nodes) = (query.shape(1), inputs.loads.demands.shape(1));
    let (first, steps) = (scalars.first as usize, scalars.steps as usize);
    let noise = inputs.noise;
    let StepShape {
        heads,
        head_dim,
        padded_nodes,
    } = shape;
    for t in 0..steps {
        if scalars.record_seen == 1u32 {
            record_seen(row, t, steps, starts, &*state, record);
        }
        let remaining = &*state.now.remaining;
        query_from_context(
            inputs.context,
            remaining,
            &*state.now_node,
            query,
            heads * head_dim,
        );
        let step_inputs = StepInputs::new(&*query, inputs.by_feature, &*state.now.mask);
        step_row(
            &step_inputs,
            log_p,
            scratch.attention,
            scratch.logits,
            scalars.scale,
            shape,
        );
        sync_cube();
        let to = choose_in_cube(
            &*scratch.logits,
            scratch.attention,
            noise,
            row,
            nodes,
            scalars.sample,
            noise.shape(1),
            first + t,
            scratch.flags,
            heads * padded_nodes,
        );
        step_and_copy_back(to, row, nodes, inputs.loads, state, scratch.flags);
        if UNIT_POS_X == 0 {
            let to = state.next_node[row];
            record.actions[row * (first + steps) + first + t] = to;
            if scalars.keep_log_likelihood == 1u32 {
                // In the float type and step order of the step-by-step decode's running sum.
                record.log_likelihood[row] += log_p[row * nodes + usize::cast_from(to)];
            }
        }
        sync_cube();
    }
}

#[cube]
impl<'a, F: Float> StepTensors<'a, F> {
    pub fn new(
        context: &'a StepContext<'a, F>,
        by_feature: &'a Tensor<F>,
        noise: &'a Tensor<F>,
        loads: &'a Loads<'a, F>,
    ) -> Self {
        StepTensors::<'a, F> {
            context,
            by_feature,
            noise,
            loads,
        }
    }
}

#[cube]
impl<'a> DecodeScratch<'a> {
    pub fn new(
        attention: &'a mut Shared<[f32]>,
        logits: &'a mut Shared<[f32]>,
        flags: &'a mut Shared<[f32]>,
    ) -> Self {
        DecodeScratch::<'a> {
            attention,
            logits,
            flags,
        }
    }
}

/// Row `row`'s start in the current set: every vehicle at the depot with an empty route,
/// stepped to the depot (the state kernel's first step), then with `first` = 1 to
/// customer s + 1, rollout s of its instance (POMO's forced first step, recorded as the
/// row's first action); the log-likelihood zero.
#[cube]
fn start_row<F: Float, I: Int, M: Int>(
    row: usize,
    starts: usize,
    first: usize,
    loads: &Loads<F>,
    state: &mut DecodeState<F, I, M>,
    record: &mut DecodeRecord<F, I, M>,
    flags: &mut Shared<[f32]>,
) {
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let nodes = loads.demands.shape(1);
    let mut node = unit;
    while node < nodes {
        state.now.served[row * nodes + node] = F::new(0.0);
        node += units;
    }
    if unit == 0 {
        state.now.used[row] = F::new(0.0);
        record.log_likelihood[row] = F::new(0.0);
    }
    // POMO's row (instance i, start s) begins with customer s + 1.
    let start = row % starts + 1;
    for k in 0..first + 1 {
        if unit == 0 {
            flags[1] = f32::new(0.0);
        }
        sync_cube();
        step_and_copy_back(k * start, row, nodes, loads, state, flags);
    }
    if unit == 0 && first == 1 {
        let width = record.actions.shape(1);
        record.actions[row * width] = I::cast_from(start);
    }
    sync_cube();
}

/// What row `row` meets at step `t` of `steps`: its mask, remaining capacity fraction
/// and context row (instance i · N + the node it stands at).
#[cube]
fn record_seen<F: Float, I: Int, M: Int>(
    row: usize,
    t: usize,
    steps: usize,
    starts: usize,
    state: &DecodeState<F, I, M>,
    record: &mut DecodeRecord<F, I, M>,
) {
    let nodes = state.now.mask.shape(1);
    let mut node = UNIT_POS_X as usize;
    while node < nodes {
        record.seen_mask[(row * steps + t) * nodes + node] = state.now.mask[row * nodes + node];
        node += CUBE_DIM_X as usize;
    }
    if UNIT_POS_X == 0 {
        record.seen_remaining[row * steps + t] = state.now.remaining[row];
        let node = usize::cast_from(state.now_node[row]);
        record.seen_rows[row * steps + t] = I::cast_from((row / starts) * nodes + node);
    }
}

/// The row's step to `to` from the current set into the next ([`step_in_cube`], with its
/// `flags`), and after a barrier the next set copied back into the current one
/// ([`copy_back`]).
#[cube]
fn step_and_copy_back<F: Float, I: Int, M: Int>(
    to: usize,
    row: usize,
    nodes: usize,
    loads: &Loads<F>,
    state: &mut DecodeState<F, I, M>,
    flags: &mut Shared<[f32]>,
) {
    step_in_cube(
        to,
        row,
        nodes,
        loads,
        &*state.now.used,
        &*state.now.served,
        state.next_node,
        &mut state.next,
        flags,
    );
    sync_cube();
    copy_back(state, row, nodes);
}

/// Row `row`'s next set copied into its current one: its served flags and mask (`[R, N]`)
/// by the cube's units, its node, load and remaining capacity fraction (`[R, 1]`) by the
/// first unit.
#[cube]
fn copy_back<F: Float, I: Int, M: Int>(state: &mut DecodeState<F, I, M>, row: usize, nodes: usize) {
    let mut node = UNIT_POS_X as usize;
    while node < nodes {
        state.now.served[row * nodes + node] = state.next.served[row * nodes + node];
        state.now.mask[row * nodes + node] = state.next.mask[row * nodes + node];
        node += CUBE_DIM_X as usize;
    }
    if UNIT_POS_X == 0 {
        state.now_node[row] = state.next_node[row];
        state.now.used[row] = state.next.used[row];
        state.now.remaining[row] = state.next.remaining[row];
    }
}

#[cube]
impl<'a, F: Float, I: Int, M: Int> DecodeState<'a, F, I, M> {
    pub fn new(
        now_node: &'a mut Tensor<I>,
        now: StateSet<'a, F, M>,
        next_node: &'a mut Tensor<I>,
        next: StateSet<'a, F, M>,
    ) -> Self {
        DecodeState::<'a, F, I, M> {
            now_node,
            now,
            next_node,
            next,
        }
    }
}

#[cube]
impl<'a, F: Float, I: Int, M: Int> DecodeRecord<'a, F, I, M> {
    pub fn new(
        actions: &'a mut Tensor<I>,
        log_likelihood: &'a mut Tensor<F>,
        seen_mask: &'a mut Tensor<M>,
        seen_remaining: &'a mut Tensor<F>,
        seen_rows: &'a mut Tensor<I>,
    ) -> Self {
        DecodeRecord::<'a, F, I, M> {
            actions,
            log_likelihood,
            seen_mask,
            seen_remaining,
            seen_rows,
        }
    }
}
