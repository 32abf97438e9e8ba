//! The attention decoder's step as CubeCL kernels (CUDA, and CubeCL's CPU runtime): the
//! forward pass of [`super::DecoderStepBackend`] for `CubeBackend`, and its backward.
//!
//! One cube per row, [`UNITS`] units sharing the row's work through shared memory: the
//! glimpse scores by (head, node), each head's softmax, the glimpse by feature, the logits
//! by node, the log-softmax. Composed from Burn's ops the same step is ~30 kernels (and a
//! fusion plan each) per decode step; here it is one launch with one compiled kernel per
//! padded node count.
//!
//! It reads the keys by feature (`[B, 3d, Np]`, the layout the model makes once per decode
//! for flex): the units of a cube walk the nodes, so adjacent units read adjacent
//! addresses. Whatever the tensors' float type, products, sums, softmaxes and tanh run in
//! f32 (a bf16 model's step accumulates as its matmuls do), sums in node or feature order as
//! flex's; the exponentials and tanh are the device's, so values agree with the op-by-op
//! form to float rounding. Only the backward's sum over an instance's rows is stored in
//! the gradient's own type between rows.
//!
//! The backward kernel recomputes each row's forward pass rather than keeping its
//! attention weights: one cube per instance walks the instance's rows, so the gradients of
//! the instance's keys are summed without atomics, in row order.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
// The `cube` macro's expansion names the `cubecl` crate: Burn's re-export of it.
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::cubecl::CubeCount;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use crate::runtime::cube_launch::{address_type, cube_dim};

/// Units per cube (one row) on a GPU: a multiple of the warp, and past CVRP50's 51 nodes
/// two passes over the nodes at most up to CVRP100.
pub(super) const UNITS: u32 = 64;

/// Units per cube (one instance) of the backward pass on a GPU: its rows run one after
/// another, so the parallelism is within a row, mostly the instance's `3·N·d` gradient
/// entries.
const BACKWARD_UNITS: u32 = 256;

/// Units that share a head's softmax max (at most the head's size, so that the parts fit
/// in the glimpse's `d` floats).
const SOFTMAX_LANES: usize = 8;

/// Static shared memory a CUDA block gets (48 KiB), in f32s.
const SHARED_FLOATS: usize = 12 * 1024;

/// Whether a step of `nodes` nodes (depot included), `heads` heads and `d` features fits the
/// kernels' shared memory: the forward's `H·Np + Np + d + 5` floats (the whole decode's
/// kernel, `super::cube_decode`, with its start's two flags), and with `training` the
/// backward's `2H·Np + Np + 2d + H + 1` (Np = `nodes` rounded up to 8). At H = 8 and
/// d = 128 that is up to 1,344 nodes for inference and 704 for training.
pub(crate) fn fits(nodes: usize, heads: usize, d: usize, training: bool) -> bool {
    let padded_nodes = nodes.div_ceil(8) * 8;
    let forward = heads * padded_nodes + padded_nodes + d + 5;
    let backward = 2 * heads * padded_nodes + padded_nodes + 2 * d + heads + 1;
    forward.max(if training { backward } else { 0 }) <= SHARED_FLOATS
}

/// The sizes a step's kernels are compiled for: heads, features a head, and the node count
/// rounded up to 8, which sizes their shared memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) struct StepShape {
    pub heads: usize,
    pub head_dim: usize,
    pub padded_nodes: usize,
}

impl StepShape {
    /// A step of `heads` heads, `d` features and `nodes` nodes over the keys by feature
    /// `[B, 3d, Np]`, its forward or (`training`) its backward. The callers ask
    /// `fused_on` first, so a step that does not fit the shared memory never gets here.
    pub fn new(
        heads: usize,
        d: usize,
        nodes: usize,
        by_feature: &CubeTensor,
        training: bool,
    ) -> Self {
        assert!(
            fits(nodes, heads, d, training) && d.is_multiple_of(heads),
            "the CubeCL decoder step's shared memory does not hold {nodes} nodes"
        );
        let padded_nodes = by_feature.meta.shape().dims::<3>()[2];
        StepShape {
            heads,
            head_dim: d / heads,
            padded_nodes,
        }
    }
}

/// The step's forward pass on a CubeCL device.
///
/// # Shapes
/// - `query`: `[B, S, d]`, `by_feature`: `[B, 3d, Np]`, `mask`: `[B × S, N]`
/// - output: `[B × S, N]` log-probabilities, −∞ at masked nodes
pub(crate) fn forward(
    query: CubeTensor,
    by_feature: CubeTensor,
    mask: CubeTensor,
    (heads, nodes): (usize, usize),
    (tanh_clipping, temperature): (f32, f32),
) -> CubeTensor {
    let query = into_contiguous(query);
    let by_feature = into_contiguous(by_feature);
    let mask = into_contiguous(mask);
    let [b, s, d] = query.meta.shape().dims::<3>();
    let shape = StepShape::new(heads, d, nodes, &by_feature, false);
    let rows = b * s;
    let (float, boolean) = (query.dtype, mask.dtype);
    let output = empty_device_contiguous_dtype(
        query.client.clone(),
        query.device.clone(),
        Shape::new([rows, nodes]),
        float,
    );
    decoder_step_kernel::launch(
        &query.client,
        CubeCount::Static(rows as u32, 1, 1),
        cube_dim(&query.client, UNITS),
        address_type([&query, &by_feature, &mask, &output]),
        query.clone().into_tensor_arg(),
        by_feature.into_tensor_arg(),
        mask.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        tanh_clipping / temperature,
        shape,
        [dtype_to_storage_type(float), dtype_to_storage_type(boolean)],
    );
    output
}

/// The step's forward pass from each row's context (no autodiff): see
/// [`decoder_step_from_context_kernel`]. The query is made inside the kernel, so the
/// context's select, product and sums are no launches of their own.
///
/// # Shapes
/// - `fixed_context`: `[B, 1, d]`, `last_node_context`: `[B, N, d]`, `capacity_context`:
///   `[1, 1, d]`, `last_node` and `remaining`: `[B × S, 1]`, `by_feature`: `[B, 3d, Np]`,
///   `mask`: `[B × S, N]`
/// - output: `[B × S, N]` log-probabilities, −∞ at masked nodes
pub(crate) fn forward_from_context(
    [fixed_context, last_node_context, capacity_context, remaining]: [CubeTensor; 4],
    last_node: CubeTensor,
    by_feature: CubeTensor,
    mask: CubeTensor,
    heads: usize,
    (tanh_clipping, temperature): (f32, f32),
) -> CubeTensor {
    let [fixed_context, last_node_context, capacity_context, remaining, by_feature] = [
        fixed_context,
        last_node_context,
        capacity_context,
        remaining,
        by_feature,
    ]
    .map(into_contiguous);
    let (last_node, mask) = (into_contiguous(last_node), into_contiguous(mask));
    let [b, nodes, d] = last_node_context.meta.shape().dims::<3>();
    let rows = mask.meta.shape().dims::<2>()[0];
    let shape = StepShape::new(heads, d, nodes, &by_feature, false);
    let (float, int, boolean) = (last_node_context.dtype, last_node.dtype, mask.dtype);
    let empty = |shape: Shape| {
        let (client, device) = (mask.client.clone(), mask.device.clone());
        empty_device_contiguous_dtype(client, device, shape, float)
    };
    let query = empty(Shape::new([b, rows / b, d]));
    let output = empty(Shape::new([rows, nodes]));
    let client = mask.client.clone();
    decoder_step_from_context_kernel::launch(
        &client,
        CubeCount::Static(rows as u32, 1, 1),
        cube_dim(&client, UNITS),
        address_type([
            &fixed_context,
            &last_node_context,
            &capacity_context,
            &last_node,
            &remaining,
            &query,
            &by_feature,
            &mask,
            &output,
        ]),
        fixed_context.into_tensor_arg(),
        last_node_context.into_tensor_arg(),
        capacity_context.into_tensor_arg(),
        last_node.into_tensor_arg(),
        remaining.into_tensor_arg(),
        query.into_tensor_arg(),
        by_feature.into_tensor_arg(),
        mask.into_tensor_arg(),
        output.clone().into_tensor_arg(),
        tanh_clipping / temperature,
        shape,
        [float, int, boolean].map(dtype_to_storage_type),
    );
    output
}

/// What a row's step reads: the queries `[B, S, d]`, the keys by feature `[B, 3d, Np]`
/// (glimpse keys, logit keys, values) and the rows' mask `[B × S, N]`.
#[derive(CubeType)]
pub(super) struct StepInputs<'a, F: Float, M: Int> {
    pub query: &'a Tensor<F>,
    pub by_feature: &'a Tensor<F>,
    pub mask: &'a Tensor<M>,
}

#[cube]
impl<'a, F: Float, M: Int> StepInputs<'a, F, M> {
    pub fn new(query: &'a Tensor<F>, by_feature: &'a Tensor<F>, mask: &'a Tensor<M>) -> Self {
        StepInputs::<'a, F, M> {
            query,
            by_feature,
            mask,
        }
    }
}

/// What a row's query is made from: the fixed context `[B, 1, d]`, the nodes' context
/// rows `[B, N, d]` and the capacity's context `[1, 1, d]`.
#[derive(CubeType)]
pub(super) struct StepContext<'a, F: Float> {
    pub fixed_context: &'a Tensor<F>,
    pub last_node_context: &'a Tensor<F>,
    pub capacity_context: &'a Tensor<F>,
}

#[cube]
impl<'a, F: Float> StepContext<'a, F> {
    pub fn new(
        fixed_context: &'a Tensor<F>,
        last_node_context: &'a Tensor<F>,
        capacity_context: &'a Tensor<F>,
    ) -> Self {
        StepContext::<'a, F> {
            fixed_context,
            last_node_context,
            capacity_context,
        }
    }
}

/// Where a row's query, its instance's keys by feature and the row's mask sit (element
/// offsets and strides), and the instance's node count.
#[derive(CubeType, Clone)]
struct RowAt {
    row: usize,
    query: usize,
    query_feature: usize,
    keys: usize,
    key_feature: usize,
    key_node: usize,
    mask: usize,
    mask_node: usize,
    nodes: usize,
}

/// Where row `row` (instance `row / S`, start `row % S`) reads its inputs.
#[cube]
fn row_at<F: Float, M: Int>(inputs: &StepInputs<F, M>, row: usize) -> RowAt {
    let starts = inputs.query.shape(1);
    let (instance, start) = (row / starts, row % starts);
    RowAt {
        row,
        query: instance * inputs.query.stride(0) + start * inputs.query.stride(1),
        query_feature: inputs.query.stride(2),
        keys: instance * inputs.by_feature.stride(0),
        key_feature: inputs.by_feature.stride(1),
        key_node: inputs.by_feature.stride(2),
        mask: row * inputs.mask.stride(0),
        mask_node: inputs.mask.stride(1),
        nodes: inputs.mask.shape(1),
    }
}

#[cube]
fn is_open<M: Int>(mask: &Tensor<M>, at: &RowAt, node: usize) -> bool {
    u32::cast_from(mask[at.mask + node * at.mask_node]) == 0u32
}

/// `Σ_node weights[from + node] · by_feature[row, node]`: a product with one feature row of
/// the keys by feature (glimpse keys at rows 0..d, logit keys d..2d, values 2d..3d).
#[cube]
fn over_nodes<F: Float>(
    weights: &Shared<[f32]>,
    from: usize,
    by_feature: &Tensor<F>,
    row: usize,
    at: &RowAt,
) -> f32 {
    let keys = at.keys + row * at.key_feature;
    let mut sum = f32::new(0.0);
    for node in 0..at.nodes {
        sum += weights[from + node] * f32::cast_from(by_feature[keys + node * at.key_node]);
    }
    sum
}

/// `Σ_j vector[from + j] · by_feature[row + j, node]` for j < `count`: a product with one
/// node's key, over `count` features from feature row `row`.
#[cube]
fn over_features<F: Float>(
    vector: &Shared<[f32]>,
    from: usize,
    by_feature: &Tensor<F>,
    row: usize,
    node: usize,
    at: &RowAt,
    #[comptime] count: usize,
) -> f32 {
    let keys = at.keys + row * at.key_feature + node * at.key_node;
    let mut sum = f32::new(0.0);
    for j in 0..count {
        sum += vector[from + j] * f32::cast_from(by_feature[keys + j * at.key_feature]);
    }
    sum
}

/// The row's attention, by (head, node): the query's scores against the glimpse keys, then
/// each head's softmax over the open nodes (0 at masked ones); then the glimpse, by
/// feature. Ends at a barrier, so every unit may read both.
#[cube]
fn attend<F: Float, M: Int>(
    inputs: &StepInputs<F, M>,
    at: &RowAt,
    attention: &mut Shared<[f32]>,
    glimpse: &mut Shared<[f32]>,
    #[comptime] shape: StepShape,
) {
    let StepShape {
        heads,
        head_dim,
        padded_nodes,
    } = shape;
    let d = heads * head_dim;
    let nodes = at.nodes;
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let mut i = unit;
    while i < heads * nodes {
        let head = i / nodes;
        let node = i % nodes;
        let mut score = f32::new(0.0);
        for j in 0..head_dim {
            let f = head * head_dim + j;
            let key = inputs.by_feature[at.keys + f * at.key_feature + node * at.key_node];
            let query = inputs.query[at.query + f * at.query_feature];
            score += f32::cast_from(query) * f32::cast_from(key);
        }
        attention[head * padded_nodes + node] = score;
        i += units;
    }
    sync_cube();
    softmax_by_head(inputs.mask, at, attention, glimpse, shape);
    let mut f = unit;
    while f < d {
        glimpse[f] = over_nodes(
            &*attention,
            (f / head_dim) * padded_nodes,
            inputs.by_feature,
            2 * d + f,
            at,
        );
        f += units;
    }
    sync_cube();
}

/// Each head's softmax over its open nodes, in place in `attention` (0 at masked nodes):
/// the max in parts (exact in any order), a part a (head, lane), reading shared memory;
/// the exponentials by (head, node); the sum by a unit a head in node order, as flex's.
/// `scratch` (at least `d` floats) holds the parts and then each head's max and sum (at
/// `head · lanes`). Ends at a barrier.
#[cube]
fn softmax_by_head<M: Int>(
    mask: &Tensor<M>,
    at: &RowAt,
    attention: &mut Shared<[f32]>,
    scratch: &mut Shared<[f32]>,
    #[comptime] shape: StepShape,
) {
    let StepShape {
        heads,
        head_dim,
        padded_nodes,
    } = shape;
    let nodes = at.nodes;
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let lanes = comptime!(if head_dim < SOFTMAX_LANES {
        head_dim
    } else {
        SOFTMAX_LANES
    });
    let mut slot = unit;
    while slot < heads * lanes {
        let from = (slot / lanes) * padded_nodes;
        let mut part = f32::new(-3.0e38);
        let mut node = slot % lanes;
        while node < nodes {
            if is_open(mask, at, node) {
                part = part.max(attention[from + node]);
            }
            node += lanes;
        }
        scratch[slot] = part;
        slot += units;
    }
    sync_cube();
    let mut max_head = unit;
    while max_head < heads {
        let mut max = scratch[max_head * lanes];
        for lane in 1..lanes {
            max = max.max(scratch[max_head * lanes + lane]);
        }
        scratch[max_head * lanes] = max;
        max_head += units;
    }
    sync_cube();
    let mut at_score = unit;
    while at_score < heads * nodes {
        let score_head = at_score / nodes;
        let score_node = at_score % nodes;
        let weight_at = score_head * padded_nodes + score_node;
        let mut w = f32::new(0.0);
        if is_open(mask, at, score_node) {
            w = (attention[weight_at] - scratch[score_head * lanes]).exp();
        }
        attention[weight_at] = w;
        at_score += units;
    }
    sync_cube();
    let mut sum_head = unit;
    while sum_head < heads {
        let mut sum = f32::new(0.0);
        for node in 0..nodes {
            sum += attention[sum_head * padded_nodes + node];
        }
        scratch[sum_head * lanes] = sum;
        sum_head += units;
    }
    sync_cube();
    let mut at_weight = unit;
    while at_weight < heads * nodes {
        let weight_head = at_weight / nodes;
        let weight_at = weight_head * padded_nodes + at_weight % nodes;
        attention[weight_at] /= scratch[weight_head * lanes];
        at_weight += units;
    }
    sync_cube();
}

#[cube(launch, address_type = "dynamic")]
fn decoder_step_kernel<F: Float, M: Int>(
    query: &Tensor<F>,
    by_feature: &Tensor<F>,
    mask: &Tensor<M>,
    output: &mut Tensor<F>,
    scale: f32,
    #[comptime] shape: StepShape,
    #[define(F, M)] _dtypes: [ElemType; 2],
) {
    let mut attention = Shared::new_slice(comptime!(shape.heads * shape.padded_nodes));
    let mut logits = Shared::new_slice(comptime!(shape.padded_nodes));
    let inputs = StepInputs::new(query, by_feature, mask);
    step_row(&inputs, output, &mut attention, &mut logits, scale, shape);
}

/// [`decoder_step_kernel`] with each row's query made first, from its context
/// ([`query_from_context`]), and written to `query` `[B, S, d]`, which the rest of the
/// cube then reads.
#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn decoder_step_from_context_kernel<F: Float, I: Int, M: Int>(
    fixed_context: &Tensor<F>,
    last_node_context: &Tensor<F>,
    capacity_context: &Tensor<F>,
    last_node: &Tensor<I>,
    remaining: &Tensor<F>,
    query: &mut Tensor<F>,
    by_feature: &Tensor<F>,
    mask: &Tensor<M>,
    output: &mut Tensor<F>,
    scale: f32,
    #[comptime] shape: StepShape,
    #[define(F, I, M)] _dtypes: [ElemType; 3],
) {
    let context = StepContext::new(fixed_context, last_node_context, capacity_context);
    let d = comptime!(shape.heads * shape.head_dim);
    query_from_context(&context, remaining, last_node, query, d);
    let mut attention = Shared::new_slice(comptime!(shape.heads * shape.padded_nodes));
    let mut logits = Shared::new_slice(comptime!(shape.padded_nodes));
    let inputs = StepInputs::new(&*query, by_feature, mask);
    step_row(&inputs, output, &mut attention, &mut logits, scale, shape);
}

/// The cube's row's query, written to `query` `[B, S, d]`: the fixed context + (the row
/// of the last node's context of the node the row stands at (`last_node` `[B × S, 1]`) +
/// its remaining capacity fraction (`remaining` `[B × S, 1]`) · the capacity's context),
/// in the tensors' float type and in the order `AttentionModel::step_log_probs` adds
/// them. Ends at a barrier, so the cube's units may all read it.
#[cube]
pub(super) fn query_from_context<F: Float, I: Int>(
    context: &StepContext<F>,
    remaining: &Tensor<F>,
    last_node: &Tensor<I>,
    query: &mut Tensor<F>,
    #[comptime] d: usize,
) {
    let row = CUBE_POS_X as usize;
    let instance = row / query.shape(1);
    let node = usize::cast_from(last_node[row]);
    let node_row = (instance * context.last_node_context.shape(1) + node) * d;
    let mut f = UNIT_POS_X as usize;
    while f < d {
        let step =
            context.last_node_context[node_row + f] + remaining[row] * context.capacity_context[f];
        query[row * d + f] = context.fixed_context[instance * d + f] + step;
        f += CUBE_DIM_X as usize;
    }
    sync_cube();
}

/// One row's step (the cube's): its attention, logits (clipped: `tanh · scale`, the
/// clipping over the temperature) and log-softmax into `output` `[B × S, N]`, and into
/// `logits` as f32 (−∞ at masked nodes), where the row's choice reads them. Works in
/// `attention` (`heads · padded_nodes` floats); ends with both written, before a barrier.
#[cube]
pub(super) fn step_row<F: Float, M: Int>(
    inputs: &StepInputs<F, M>,
    output: &mut Tensor<F>,
    attention: &mut Shared<[f32]>,
    logits: &mut Shared<[f32]>,
    scale: f32,
    #[comptime] shape: StepShape,
) {
    let d = comptime!(shape.heads * shape.head_dim);
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let at = row_at(inputs, CUBE_POS_X as usize);
    let mut glimpse = Shared::new_slice(d);
    attend(inputs, &at, attention, &mut glimpse, shape);

    // Single-head logits against the logit keys, clipped.
    let mut node = unit;
    while node < at.nodes {
        let raw = over_features(&glimpse, 0, inputs.by_feature, d, node, &at, d);
        logits[node] = raw.tanh() * scale;
        node += units;
    }
    sync_cube();
    let room = comptime!(shape.heads * shape.padded_nodes);
    log_softmax(inputs.mask, &at, output, attention, logits, room);
}

/// The row's log-softmax of `logits` over its open nodes, into `output` and back into
/// `logits` (−∞ at masked nodes). The max in parts (exact in any order), then the sum of
/// exponentials in node order, as flex's, from shared memory: `scratch` (`room` floats)
/// holds the parts and then the exponentials.
#[cube]
fn log_softmax<F: Float, M: Int>(
    mask: &Tensor<M>,
    at: &RowAt,
    output: &mut Tensor<F>,
    scratch: &mut Shared<[f32]>,
    logits: &mut Shared<[f32]>,
    #[comptime] room: usize,
) {
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let nodes = at.nodes;
    let mut log_sum = Shared::new_slice(1usize);
    let parts = units.min(room);
    if unit < parts {
        let mut max = f32::new(-3.0e38);
        let mut node = unit;
        while node < nodes {
            if is_open(mask, at, node) {
                max = max.max(logits[node]);
            }
            node += parts;
        }
        scratch[unit] = max;
    }
    sync_cube();
    if unit == 0 {
        let mut max = scratch[0];
        for part in 1..parts {
            max = max.max(scratch[part]);
        }
        log_sum[0] = max;
    }
    sync_cube();
    let max = log_sum[0];
    let mut node = unit;
    while node < nodes {
        let mut e = f32::new(0.0);
        if is_open(mask, at, node) {
            e = (logits[node] - max).exp();
        }
        scratch[node] = e;
        node += units;
    }
    sync_cube();
    if unit == 0 {
        let mut sum = f32::new(0.0);
        for node in 0..nodes {
            sum += scratch[node];
        }
        log_sum[0] = max + sum.ln();
    }
    sync_cube();

    let (out, out_node) = (at.row * output.stride(0), output.stride(1));
    let mut node = unit;
    while node < nodes {
        let mut log_p = F::new(f32::NEG_INFINITY);
        if is_open(mask, at, node) {
            log_p = F::cast_from(logits[node] - log_sum[0]);
        }
        output[out + node * out_node] = log_p;
        logits[node] = f32::cast_from(log_p);
        node += units;
    }
}

/// Rows a cube of the backward takes at least before an instance's rows are shared among
/// several cubes.
const ROWS_PER_CUBE: usize = 64;

/// Cubes the backward shares instances' rows among at most: a few waves of a GPU's
/// ~130 multiprocessors.
const MAX_BACKWARD_CUBES: usize = 1024;

/// How many cubes share each of `instances` instances' `rows` rows, and the run of rows a
/// cube takes (the last run may be shorter, none is empty): 1 cube where they fit one (a
/// training decode of one start an instance), more for a scored POMO decode's S·K rows
/// (n = 100: 64 instances of ~20,000 rows would be 64 cubes walking 20,000 rows each).
fn row_chunks(instances: usize, rows: usize) -> (usize, usize) {
    let room = (MAX_BACKWARD_CUBES / instances.max(1)).max(1);
    let wanted = rows.div_ceil(ROWS_PER_CUBE).clamp(1, room);
    // The runs' length, then as many runs as that length needs: none is empty.
    let per_cube = rows.div_ceil(wanted).max(1);
    (rows.div_ceil(per_cube).max(1), per_cube)
}

/// Gradients of the step's query `[B, S, d]` and of its glimpse keys, glimpse values and
/// logit keys, node-major `[B, N, d]`, from the gradient of its log-probabilities.
///
/// An instance's rows are shared among [`row_chunks`] cubes, each taking a run of them one
/// after another (each row recomputes its forward pass in shared memory); each entry of
/// the key, value and logit-key gradients is owned by one unit of a cube, which adds its
/// rows' terms in row order. With several cubes an instance, each writes its partial sums
/// (`[B, C, N, d]`), which are then summed over its C cubes in order. No atomics, so the
/// sums are the same on every run.
///
/// # Shapes
/// - `query`: `[B, S, d]`, `by_feature`: `[B, 3d, Np]`, `mask`, `log_probs` and
///   `grad_out`: `[B × S, N]`
pub(crate) fn backward(
    [query, by_feature, mask, log_probs, grad_out]: [CubeTensor; 5],
    (heads, nodes): (usize, usize),
    (tanh_clipping, temperature): (f32, f32),
) -> [CubeTensor; 4] {
    let [query, by_feature, mask, log_probs, grad_out] =
        [query, by_feature, mask, log_probs, grad_out].map(into_contiguous);
    let [b, s, d] = query.meta.shape().dims::<3>();
    let shape = StepShape::new(heads, d, nodes, &by_feature, true);
    let (float, boolean) = (query.dtype, mask.dtype);
    let empty = |shape: Shape| {
        empty_device_contiguous_dtype(query.client.clone(), query.device.clone(), shape, float)
    };
    let (chunks, rows_per_cube) = row_chunks(b, s);
    let grads = [
        empty(Shape::new([b, s, d])),
        empty(Shape::new([b, chunks, nodes, d])),
        empty(Shape::new([b, chunks, nodes, d])),
        empty(Shape::new([b, chunks, nodes, d])),
    ];
    let [d_query, d_keys, d_values, d_logit_keys] = grads.clone();
    let client = query.client.clone();
    decoder_step_backward_kernel::launch(
        &client,
        CubeCount::Static((b * chunks) as u32, 1, 1),
        cube_dim(&client, BACKWARD_UNITS),
        address_type(
            [&query, &by_feature, &mask, &log_probs, &grad_out]
                .into_iter()
                .chain(&grads),
        ),
        query.into_tensor_arg(),
        by_feature.into_tensor_arg(),
        mask.into_tensor_arg(),
        log_probs.into_tensor_arg(),
        grad_out.into_tensor_arg(),
        d_query.into_tensor_arg(),
        d_keys.into_tensor_arg(),
        d_values.into_tensor_arg(),
        d_logit_keys.into_tensor_arg(),
        tanh_clipping / temperature,
        chunks as u32,
        rows_per_cube as u32,
        shape,
        [dtype_to_storage_type(float), dtype_to_storage_type(boolean)],
    );
    let [d_query, node_major @ ..] = grads;
    let summed = node_major.map(|partial| {
        use burn::backend::ops::FloatTensorOps;
        use burn_cubecl::CubeBackend;
        let total = match chunks {
            1 => partial,
            _ => CubeBackend::float_sum_dim(partial, 1),
        };
        CubeBackend::float_reshape(total, Shape::new([b, nodes, d]))
    });
    let [d_keys, d_values, d_logit_keys] = summed;
    [d_query, d_keys, d_values, d_logit_keys]
}

/// What the backward reads beside the step's inputs, and the gradients it writes: the
/// forward's log-probabilities and their gradient (`[B × S, N]`), the clipping's slope
/// C/T; the query's gradient `[B, S, d]` and the cube's node-major partial sums of the
/// keys', values' and logit keys' gradients (`[B, C, N, d]`).
#[derive(CubeType)]
struct BackwardTensors<'a, F: Float> {
    log_probs: &'a Tensor<F>,
    grad_out: &'a Tensor<F>,
    slope: f32,
    d_query: &'a mut Tensor<F>,
    d_keys: &'a mut Tensor<F>,
    d_values: &'a mut Tensor<F>,
    d_logit_keys: &'a mut Tensor<F>,
}

#[cube]
impl<'a, F: Float> BackwardTensors<'a, F> {
    fn new(
        log_probs: &'a Tensor<F>,
        grad_out: &'a Tensor<F>,
        slope: f32,
        d_query: &'a mut Tensor<F>,
        d_keys: &'a mut Tensor<F>,
        d_values: &'a mut Tensor<F>,
        d_logit_keys: &'a mut Tensor<F>,
    ) -> Self {
        BackwardTensors::<'a, F> {
            log_probs,
            grad_out,
            slope,
            d_query,
            d_keys,
            d_values,
            d_logit_keys,
        }
    }
}

/// A backward row's working memory: the attention weights and the scores' gradients by
/// (head, node), the glimpse and its gradient by feature, the raw logits' gradient by
/// node; per-head dots, then Σg at `heads`.
#[derive(CubeType)]
struct BackwardScratch {
    attention: Shared<[f32]>,
    d_scores: Shared<[f32]>,
    glimpse: Shared<[f32]>,
    d_glimpse: Shared<[f32]>,
    d_raw: Shared<[f32]>,
    sums: Shared<[f32]>,
}

#[cube]
impl BackwardScratch {
    fn new(#[comptime] shape: StepShape) -> Self {
        let StepShape {
            heads,
            head_dim,
            padded_nodes,
        } = shape;
        BackwardScratch {
            attention: Shared::new_slice(heads * padded_nodes),
            d_scores: Shared::new_slice(heads * padded_nodes),
            glimpse: Shared::new_slice(heads * head_dim),
            d_glimpse: Shared::new_slice(heads * head_dim),
            d_raw: Shared::new_slice(padded_nodes),
            sums: Shared::new_slice(heads + 1),
        }
    }
}

/// Where a row's terms go in the cube's node-major partial sums, and whether the row is
/// the cube's first (whose terms are written, not added).
#[derive(CubeType)]
struct PartialSum {
    at: usize,
    first: bool,
}

/// `grad[sum.at + i] = term` for the cube's first row, `+= term` after (the sum in f32,
/// stored in the gradient's type).
#[cube]
fn add_term<F: Float>(grad: &mut Tensor<F>, sum: &PartialSum, i: usize, term: f32) {
    let index = sum.at + i;
    if sum.first {
        grad[index] = F::cast_from(term);
    } else {
        grad[index] = F::cast_from(f32::cast_from(grad[index]) + term);
    }
}

#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn decoder_step_backward_kernel<F: Float, M: Int>(
    query: &Tensor<F>,
    by_feature: &Tensor<F>,
    mask: &Tensor<M>,
    log_probs: &Tensor<F>,
    grad_out: &Tensor<F>,
    d_query: &mut Tensor<F>,
    d_keys: &mut Tensor<F>,
    d_values: &mut Tensor<F>,
    d_logit_keys: &mut Tensor<F>,
    slope: f32,
    chunks: u32,
    rows_per_cube: u32,
    #[comptime] shape: StepShape,
    #[define(F, M)] _dtypes: [ElemType; 2],
) {
    let inputs = StepInputs::new(query, by_feature, mask);
    let mut tensors = BackwardTensors::new(
        log_probs,
        grad_out,
        slope,
        d_query,
        d_keys,
        d_values,
        d_logit_keys,
    );
    let mut scratch = BackwardScratch::new(shape);
    let (starts, nodes) = (query.shape(1), mask.shape(1));
    let (instance, chunk) = (
        CUBE_POS_X as usize / chunks as usize,
        CUBE_POS_X as usize % chunks as usize,
    );
    // The cube's node-major partial gradients, `[B, C, N, d]` contiguous.
    let node_major = CUBE_POS_X as usize * nodes * comptime!(shape.heads * shape.head_dim);
    // The cube's run of the instance's rows (`row_chunks`: none is empty).
    let first_start = chunk * rows_per_cube as usize;
    let end = (first_start + rows_per_cube as usize).min(starts);
    for start in first_start..end {
        let at = row_at(&inputs, instance * starts + start);
        let sum = PartialSum {
            at: node_major,
            first: start == first_start,
        };
        attend_beside_upstream(&inputs, &at, &tensors, &mut scratch, shape);
        logits_backward(&inputs, &at, &mut tensors, &sum, &mut scratch, shape);
        glimpse_backward(&inputs, &at, &mut tensors, &sum, &mut scratch, shape);
        scores_backward(&inputs, &at, &mut tensors, &sum, &mut scratch, shape);
    }
}

/// The row's forward attention and glimpse recomputed ([`attend`]), its upstream gradient
/// in `d_raw` (read after `attend`'s barriers) and log_softmax's Σg over every entry in
/// `sums[heads]`, in node order, as the composed form takes it: one unit's sum of shared
/// values, not of the device's memory. Ends at a barrier.
#[cube]
fn attend_beside_upstream<F: Float, M: Int>(
    inputs: &StepInputs<F, M>,
    at: &RowAt,
    tensors: &BackwardTensors<F>,
    scratch: &mut BackwardScratch,
    #[comptime] shape: StepShape,
) {
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let nodes = at.nodes;
    let mut node = unit;
    while node < nodes {
        scratch.d_raw[node] = f32::cast_from(tensors.grad_out[at.row * nodes + node]);
        node += units;
    }
    attend(
        inputs,
        at,
        &mut scratch.attention,
        &mut scratch.glimpse,
        shape,
    );
    if unit == 0 {
        let mut total = f32::new(0.0);
        for node in 0..nodes {
            total += scratch.d_raw[node];
        }
        scratch.sums[comptime!(shape.heads)] = total;
    }
    sync_cube();
}

/// Through log_softmax and the tanh clipping to the raw logits (dz = g − p·Σg, then
/// d_raw = dz · C/T · (1 − tanh²)), then through raw = glimpse · logit_keys[node] to the
/// glimpse and the logit keys. Ends at a barrier.
#[cube]
fn logits_backward<F: Float, M: Int>(
    inputs: &StepInputs<F, M>,
    at: &RowAt,
    tensors: &mut BackwardTensors<F>,
    sum: &PartialSum,
    scratch: &mut BackwardScratch,
    #[comptime] shape: StepShape,
) {
    let d = comptime!(shape.heads * shape.head_dim);
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let nodes = at.nodes;
    let mut node = unit;
    while node < nodes {
        let t = over_features(&scratch.glimpse, 0, inputs.by_feature, d, node, at, d).tanh();
        let mut grad = f32::new(0.0);
        if is_open(inputs.mask, at, node) {
            let p = f32::cast_from(tensors.log_probs[at.row * nodes + node]).exp();
            let dz = scratch.d_raw[node] - p * scratch.sums[comptime!(shape.heads)];
            grad = dz * tensors.slope * (1.0 - t * t);
        }
        scratch.d_raw[node] = grad;
        node += units;
    }
    sync_cube();

    let mut f = unit;
    while f < d {
        scratch.d_glimpse[f] = over_nodes(&scratch.d_raw, 0, inputs.by_feature, d + f, at);
        f += units;
    }
    let (d_raw, glimpse) = (&scratch.d_raw, &scratch.glimpse);
    add_outer(tensors.d_logit_keys, sum, d_raw, glimpse, nodes, d, shape);
    sync_cube();
}

/// Through glimpse = Σ_node attention · values to the attention weights and the values,
/// then through each head's softmax to its scores: d_score = a · (d_a − Σ a·d_a). Ends at
/// a barrier.
#[cube]
fn glimpse_backward<F: Float, M: Int>(
    inputs: &StepInputs<F, M>,
    at: &RowAt,
    tensors: &mut BackwardTensors<F>,
    sum: &PartialSum,
    scratch: &mut BackwardScratch,
    #[comptime] shape: StepShape,
) {
    let StepShape {
        heads,
        head_dim,
        padded_nodes,
    } = shape;
    let d = heads * head_dim;
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let nodes = at.nodes;
    let mut i = unit;
    while i < heads * nodes {
        let (head, node) = (i / nodes, i % nodes);
        let from = head * head_dim;
        let values = 2 * d + from;
        scratch.d_scores[head * padded_nodes + node] = over_features(
            &scratch.d_glimpse,
            from,
            inputs.by_feature,
            values,
            node,
            at,
            head_dim,
        );
        i += units;
    }
    let (attention, d_glimpse) = (&scratch.attention, &scratch.d_glimpse);
    add_outer(
        tensors.d_values,
        sum,
        attention,
        d_glimpse,
        nodes,
        head_dim,
        shape,
    );
    sync_cube();

    let mut head = unit;
    while head < heads {
        let from = head * padded_nodes;
        let mut dot = f32::new(0.0);
        for node in 0..nodes {
            dot += scratch.attention[from + node] * scratch.d_scores[from + node];
        }
        scratch.sums[head] = dot;
        head += units;
    }
    sync_cube();
    let mut i = unit;
    while i < heads * nodes {
        let head = i / nodes;
        let at_score = head * padded_nodes + i % nodes;
        let d_score = scratch.d_scores[at_score] - scratch.sums[head];
        scratch.d_scores[at_score] = scratch.attention[at_score] * d_score;
        i += units;
    }
    sync_cube();
}

/// Through score = query_head · keys[node, head] to the query and the glimpse keys. The
/// glimpse's memory, free by now, holds the row's query as f32. Ends at a barrier.
#[cube]
fn scores_backward<F: Float, M: Int>(
    inputs: &StepInputs<F, M>,
    at: &RowAt,
    tensors: &mut BackwardTensors<F>,
    sum: &PartialSum,
    scratch: &mut BackwardScratch,
    #[comptime] shape: StepShape,
) {
    let StepShape {
        heads,
        head_dim,
        padded_nodes,
    } = shape;
    let d = heads * head_dim;
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let mut f = unit;
    while f < d {
        let from = (f / head_dim) * padded_nodes;
        let d_query = over_nodes(&scratch.d_scores, from, inputs.by_feature, f, at);
        tensors.d_query[at.row * d + f] = F::cast_from(d_query);
        scratch.glimpse[f] = f32::cast_from(inputs.query[at.query + f * at.query_feature]);
        f += units;
    }
    sync_cube();
    let (d_scores, query) = (&scratch.d_scores, &scratch.glimpse);
    add_outer(
        tensors.d_keys,
        sum,
        d_scores,
        query,
        at.nodes,
        head_dim,
        shape,
    );
    sync_cube();
}

/// `grad[node, f] (+)= weights[(f / group) · Np + node] · features[f]` for the row's `nodes`
/// nodes and d features, into the cube's partial sums ([`add_term`]): the outer product
/// of a weight by node, one per `group` features (a head's, or with `group` = d the
/// row's one), and a vector by feature.
#[cube]
fn add_outer<F: Float>(
    grad: &mut Tensor<F>,
    sum: &PartialSum,
    weights: &Shared<[f32]>,
    features: &Shared<[f32]>,
    nodes: usize,
    #[comptime] group: usize,
    #[comptime] shape: StepShape,
) {
    let d = comptime!(shape.heads * shape.head_dim);
    let mut i = UNIT_POS_X as usize;
    while i < nodes * d {
        let (node, f) = (i / d, i % d);
        let term = weights[(f / group) * comptime!(shape.padded_nodes) + node] * features[f];
        add_term(grad, sum, i, term);
        i += CUBE_DIM_X as usize;
    }
}

#[cfg(test)]
mod tests {
    use super::{fits, row_chunks};

    /// By hand: tiny_1's scored decode (512 instances of ~20 rows) in one cube each; POMO
    /// at n = 20 (64 × ~800 rows) in 13, at n = 100 (64 × ~20,000) in 1,024 / 64 = 16; the
    /// cube test's multi-start case (5 × 153) in 3. Every cube's run of rows is non-empty.
    #[test]
    fn backward_rows_are_shared_among_cubes() {
        for ((instances, rows), chunks) in [
            ((512, 20), 1),
            ((64, 800), 13),
            ((64, 20_000), 16),
            ((5, 153), 3),
            ((3, 0), 1),
            ((2_000, 5_000), 1),
        ] {
            assert_eq!(
                row_chunks(instances, rows).0,
                chunks,
                "{instances} × {rows}"
            );
        }
        // One instance of 100,000 rows: 1,024 runs of 98 would leave the last three empty;
        // 1,021 runs of 98 cover them.
        assert_eq!(row_chunks(1, 100_000), (1_021, 98));
        for instances in [1, 7, 64, 512] {
            for rows in (1..3_000).chain([20_000, 65_537, 100_000, 1_000_000]) {
                let (chunks, per_cube) = row_chunks(instances, rows);
                assert!(
                    chunks * per_cube >= rows,
                    "{instances} × {rows}: rows left out"
                );
                assert!(
                    (chunks - 1) * per_cube < rows,
                    "{instances} × {rows}: an empty run"
                );
                assert!(chunks <= 1_024 / instances.max(1) || chunks == 1);
            }
        }
    }

    /// By hand, at 8 heads and d = 128 (12,288 floats): the forward needs 9·Np + 131 floats,
    /// so Np = 1,344 (12,227) fits and 1,352 (12,299) does not; training needs
    /// 17·Np + 265, so Np = 704 (12,233) fits and 712 (12,369) does not.
    #[test]
    fn shared_memory_bounds_the_nodes() {
        assert!(fits(1344, 8, 128, false));
        assert!(!fits(1345, 8, 128, false));
        assert!(fits(704, 8, 128, true));
        assert!(!fits(705, 8, 128, true));
        // CVRP100 (101 nodes) at the shipped models' size, and a wider model.
        assert!(fits(101, 8, 128, true));
        assert!(fits(101, 16, 256, true));
    }
}
