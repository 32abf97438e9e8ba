//! A whole decode without gradients as one CubeCL kernel: every step's decoder step, the
//! row's choice and the state's step to it, in a loop inside the kernel.
//!
//! One cube per row, as [`super::cube_kernel`]'s step: a row's steps read only the row's
//! own state and its instance's keys, so the cube can take them one after another with
//! barriers between, and no step needs another cube's work. A decode of 2n steps was 2n
//! launches (~30 µs of host time each on an H200, measured in session 34): here it is one.
//!
//! Each step is the same code as the one-step kernel's ([`query_from_context`],
//! [`step_row`], `crate::state_kernel::choose_in_cube` and `step_in_cube`), so the tours and
//! log-likelihoods are the step-by-step decode's bit for bit. The state lives in two sets
//! of row buffers: a step reads the current set and writes the next, which is then copied
//! back (a row's `N + 4` values, against the step's `H·N·d` products).

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
// The `cube` macro's expansion names the `cubecl` crate: Burn's re-export of it.
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::cubecl::CubeCount;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use super::cube_kernel::{query_from_context, step_row, StepContext, StepInputs, StepShape, UNITS};
use super::DecodeSpan;
use crate::cube_launch::{address_type, cube_dim};
use crate::state_kernel::{choose_in_cube, step_in_cube, Loads, StateSet};

/// What a decode's state steps read (`demands` `[R, N]`, `capacity` `[R, 1]`, the
/// tolerance; as `crate::state::Loads`), the noise `[R, T]` a sampled decode reads column
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
    let contiguous = [
        fixed_context,
        last_node_context,
        capacity_context,
        by_feature,
        start.demands,
        start.capacity,
        start.noise,
    ]
    .map(into_contiguous);
    let [fixed_context, last_node_context, capacity_context, by_feature, demands, capacity, noise] =
        contiguous;
    let [b, nodes, d] = last_node_context.meta.shape().dims::<3>();
    let rows = demands.meta.shape().dims::<2>()[0];
    let shape = StepShape::new(heads, d, nodes, &by_feature, false);
    let (float, int, boolean) = (
        last_node_context.dtype,
        start.int_like.dtype,
        start.bool_like.dtype,
    );
    let empty = |shape: Shape, dtype| {
        let (client, device) = (demands.client.clone(), demands.device.clone());
        empty_device_contiguous_dtype(client, device, shape, dtype)
    };
    // Working tensors: the step's query `[B, S, d]` and log-probabilities, and the state's
    // current and next sets.
    let query = empty(Shape::new([b, rows / b, d]), float);
    let log_p = empty(Shape::new([rows, nodes]), float);
    let state = |dtype_of_row: [burn::tensor::DType; 5]| {
        let [node, load, flags, mask, fraction] = dtype_of_row;
        [
            empty(Shape::new([rows, 1]), node),
            empty(Shape::new([rows, 1]), load),
            empty(Shape::new([rows, nodes]), flags),
            empty(Shape::new([rows, nodes]), mask),
            empty(Shape::new([rows, 1]), fraction),
        ]
    };
    let [now_node, now_used, now_served, now_mask, now_remaining] =
        state([int, float, float, boolean, float]);
    let [next_node, next_used, next_served, next_mask, next_remaining] =
        state([int, float, float, boolean, float]);
    let [actions, log_likelihood, seen_mask, seen_remaining, seen_rows] =
        output_shapes(&span, rows, nodes);
    let actions = empty(actions, int);
    let log_likelihood = empty(log_likelihood, float);
    let seen_mask = empty(seen_mask, boolean);
    let seen_remaining = empty(seen_remaining, float);
    let seen_rows = empty(seen_rows, int);
    let noise_width = noise.meta.shape()[1] as u32;
    let client = demands.client.clone();
    decode_kernel::launch(
        &client,
        CubeCount::Static(rows as u32, 1, 1),
        cube_dim(&client, UNITS),
        address_type([
            &fixed_context,
            &last_node_context,
            &capacity_context,
            &by_feature,
            &noise,
            &demands,
            &capacity,
            &query,
            &log_p,
            &now_node,
            &now_used,
            &now_served,
            &now_mask,
            &now_remaining,
            &next_node,
            &next_used,
            &next_served,
            &next_mask,
            &next_remaining,
            &actions,
            &log_likelihood,
            &seen_mask,
            &seen_remaining,
            &seen_rows,
        ]),
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
        actions.clone().into_tensor_arg(),
        log_likelihood.clone().into_tensor_arg(),
        seen_mask.clone().into_tensor_arg(),
        seen_remaining.clone().into_tensor_arg(),
        seen_rows.clone().into_tensor_arg(),
        tanh_clipping / temperature,
        start.tolerance,
        (rows / b) as u32,
        nodes as u32,
        u32::from(start.sample),
        noise_width,
        span.first as u32,
        span.steps as u32,
        u32::from(span.log_likelihood),
        u32::from(span.record_seen),
        shape,
        [float, int, boolean].map(dtype_to_storage_type),
    );
    [
        actions,
        log_likelihood,
        seen_mask,
        seen_remaining,
        seen_rows,
    ]
}

/// Row `CUBE_POS_X`'s whole decode: the start state made in the current set (each vehicle
/// stepped to the depot from an empty route, then with `first` = 1 to customer s + 1,
/// rollout s of its instance: POMO's forced first step), then at each step the query from
/// the context ([`query_from_context`]), the step ([`step_row`]), the choice
/// (`choose_in_cube`, noise column `first + t`), the state's step into the next set
/// and the next set copied back ([`step_and_copy_back`]), with the action (and the chosen
/// log-probability, where asked) recorded.
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
    scale: f32,
    tolerance: f32,
    starts: u32,
    node_count: u32,
    sample: u32,
    noise_width: u32,
    first: u32,
    steps: u32,
    keep_log_likelihood: u32,
    record_seen: u32,
    #[comptime] shape: StepShape,
    #[define(F, I, M)] _dtypes: [ElemType; 3],
) {
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let row = CUBE_POS_X as usize;
    let nodes = node_count as usize;
    let (first, steps) = (first as usize, steps as usize);
    let width = first + steps;
    let loads = Loads::new(demands, capacity, tolerance);
    let mut now = StateSet::new(now_used, now_served, now_mask, now_remaining);
    let mut next = StateSet::new(next_used, next_served, next_mask, next_remaining);
    let mut flags = Shared::new_slice(2usize);
    // Every vehicle at the depot with an empty route, stepped to the depot: the state
    // kernel's first step.
    let mut node = unit;
    while node < nodes {
        now.served[row * nodes + node] = F::new(0.0);
        node += units;
    }
    if unit == 0 {
        now.used[row] = F::new(0.0);
        log_likelihood[row] = F::new(0.0);
    }
    // POMO's row (instance i, start s) begins with customer s + 1.
    let start = row % starts as usize + 1;
    for k in 0..first + 1 {
        let to = k * start;
        if unit == 0 {
            flags[1] = f32::new(0.0);
        }
        sync_cube();
        step_and_copy_back(
            to, row, nodes, &loads, now_node, &mut now, next_node, &mut next, &mut flags,
        );
    }
    if unit == 0 && first == 1 {
        actions[row * width] = I::cast_from(start);
    }
    sync_cube();

    let StepShape {
        heads,
        head_dim,
        padded_nodes,
    } = shape;
    let context = StepContext::new(fixed_context, last_node_context, capacity_context);
    let mut attention = Shared::new_slice(heads * padded_nodes);
    let mut logits = Shared::new_slice(padded_nodes);
    for t in 0..steps {
        if record_seen == 1u32 {
            let mut node = unit;
            while node < nodes {
                seen_mask[(row * steps + t) * nodes + node] = now.mask[row * nodes + node];
                node += units;
            }
            if unit == 0 {
                seen_remaining[row * steps + t] = now.remaining[row];
                let instance = row / starts as usize;
                let node = usize::cast_from(now_node[row]);
                seen_rows[row * steps + t] = I::cast_from(instance * nodes + node);
            }
        }
        query_from_context(
            &context,
            &*now.remaining,
            &*now_node,
            query,
            heads * head_dim,
        );
        let inputs = StepInputs::new(&*query, by_feature, &*now.mask);
        step_row(&inputs, log_p, &mut attention, &mut logits, scale, shape);
        sync_cube();
        let to = choose_in_cube(
            &logits,
            &mut attention,
            noise,
            row,
            nodes,
            sample,
            noise_width as usize,
            first + t,
            &mut flags,
            heads * padded_nodes,
        );
        step_and_copy_back(
            to, row, nodes, &loads, now_node, &mut now, next_node, &mut next, &mut flags,
        );
        if unit == 0 {
            let to = next_node[row];
            actions[row * width + first + t] = to;
            if keep_log_likelihood == 1u32 {
                // In the float type and step order of the step-by-step decode's running sum.
                log_likelihood[row] += log_p[row * nodes + usize::cast_from(to)];
            }
        }
        sync_cube();
    }
}

/// The row's step to `to` from the current set into the next ([`step_in_cube`], with its
/// `flags`), and after a barrier the next set copied back into the current one
/// ([`copy_state`]).
#[cube]
#[allow(clippy::too_many_arguments)]
fn step_and_copy_back<F: Float, I: Int, M: Int>(
    to: usize,
    row: usize,
    nodes: usize,
    loads: &Loads<F>,
    now_node: &mut Tensor<I>,
    now: &mut StateSet<F, M>,
    next_node: &mut Tensor<I>,
    next: &mut StateSet<F, M>,
    flags: &mut Shared<[f32]>,
) {
    step_in_cube(
        to,
        row,
        nodes,
        loads,
        &*now.used,
        &*now.served,
        next_node,
        next,
        flags,
    );
    sync_cube();
    copy_state(&*next_node, &*next, now_node, now, row, nodes);
}

/// Row `row`'s state in the `from` set (and `from_node`) copied into the `to` set (and
/// `to_node`): its served flags and mask (`[R, N]`) by the cube's units, its node, load and
/// remaining capacity fraction (`[R, 1]`) by the first unit.
#[cube]
fn copy_state<F: Float, I: Int, M: Int>(
    from_node: &Tensor<I>,
    from: &StateSet<F, M>,
    to_node: &mut Tensor<I>,
    to: &mut StateSet<F, M>,
    row: usize,
    nodes: usize,
) {
    let mut node = UNIT_POS_X as usize;
    while node < nodes {
        to.served[row * nodes + node] = from.served[row * nodes + node];
        to.mask[row * nodes + node] = from.mask[row * nodes + node];
        node += CUBE_DIM_X as usize;
    }
    if UNIT_POS_X == 0 {
        to_node[row] = from_node[row];
        to.used[row] = from.used[row];
        to.remaining[row] = from.remaining[row];
    }
}
