//! A decode step's choice, [`CvrpState::step`](crate::CvrpState::step) and the next step's
//! mask as one CubeCL kernel (CUDA, and CubeCL's CPU runtime): `choose_and_step` for a
//! decode that chooses (greedy or sampled), `state_step` for one that is told its nodes.
//! Composed from Burn's operations the step and mask are eight kernels a decode step on
//! CubeCL devices (a scalar comparison, a gather, four fused chains, a reduction, the depot
//! row), and the choice one (argmax) to five (the inverse CDF: a cumulative sum, slices, a
//! comparison and a count), since comparisons, gathers, slices and sums each end a fused
//! chain there (benches/README, Sessions 33 and 34); at a small model's sizes a kernel
//! costs what its launch costs.
//!
//! One unit per row walks the row's nodes. The arithmetic is the op-by-op forms', in the
//! tensors' own float type and order: the first largest log-probability, or the count of
//! running sums of probabilities (in node order) below `uniform · total`; `load = used +
//! demand[action]` (0 at the depot), `demand + load > capacity + tolerance`. So the choices
//! and masks are the same as theirs (the cube tests in `state` and `decode` walk both).

use burn::backend::backend_extension;
use burn::backend::cubecl::dtype_to_storage_type;
use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn::tensor::{DType, Shape};
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::cubecl::{CubeCount, CubeDim};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeBackend;

/// Rows per cube on a GPU.
const UNITS: u32 = 64;

/// The state's step as a backend operation.
#[backend_extension(Cube, Fusion)]
pub trait StateStepBackend: burn::backend::Backend {
    /// Moves each row's vehicle to `action` (`[R, 1]`) and returns the new load `[R, 1]`,
    /// the new served flags `[R, N]` (0/1, the depot's column included), the next mask
    /// `[R, N]` (true = closed), whose bool type is `bool_like`'s, and the remaining
    /// capacity as a fraction of the capacity, `[R, 1]`.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    #[fusion(meta = step_metadata)]
    fn state_step(
        action: IntTensor<Self>,
        demands: FloatTensor<Self>,
        capacity: FloatTensor<Self>,
        used: FloatTensor<Self>,
        served: FloatTensor<Self>,
        bool_like: BoolTensor<Self>,
        tolerance: f32,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        BoolTensor<Self>,
        FloatTensor<Self>,
    );

    /// Chooses each row's next node from `log_p` (`[R, N]`): the most likely, or with
    /// `sample` the inverse of the CDF at the uniform in column `column` of `noise`
    /// (`[R, T]`; read only with `sample`), then [`StateStepBackend::state_step`] to it.
    /// Returns the `[R, 1]` choice, of `int_like`'s int type, with the step's outputs.
    /// The column is a scalar, not a slice: a column's offset is not aligned for a view,
    /// so slicing it would copy it, a launch a step.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    #[fusion(meta = choice_metadata)]
    fn choose_and_step(
        log_p: FloatTensor<Self>,
        noise: FloatTensor<Self>,
        demands: FloatTensor<Self>,
        capacity: FloatTensor<Self>,
        used: FloatTensor<Self>,
        served: FloatTensor<Self>,
        int_like: IntTensor<Self>,
        bool_like: BoolTensor<Self>,
        tolerance: f32,
        sample: bool,
        column: u32,
    ) -> (
        IntTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        BoolTensor<Self>,
        FloatTensor<Self>,
    );
}

#[allow(clippy::too_many_arguments)]
fn step_metadata(
    _action: &burn::backend::fusion::custom::TensorSpec,
    _demands: &burn::backend::fusion::custom::TensorSpec,
    _capacity: &burn::backend::fusion::custom::TensorSpec,
    used: &burn::backend::fusion::custom::TensorSpec,
    served: &burn::backend::fusion::custom::TensorSpec,
    bool_like: &burn::backend::fusion::custom::TensorSpec,
    _tolerance: &f32,
) -> (
    burn::backend::fusion::custom::TensorSpec,
    burn::backend::fusion::custom::TensorSpec,
    burn::backend::fusion::custom::TensorSpec,
    burn::backend::fusion::custom::TensorSpec,
) {
    use burn::backend::fusion::custom::TensorSpec;
    (
        TensorSpec::new(used.shape.clone(), used.dtype),
        TensorSpec::new(served.shape.clone(), served.dtype),
        TensorSpec::new(served.shape.clone(), bool_like.dtype),
        TensorSpec::new(used.shape.clone(), used.dtype),
    )
}

#[allow(clippy::too_many_arguments)]
fn choice_metadata(
    _log_p: &burn::backend::fusion::custom::TensorSpec,
    _noise: &burn::backend::fusion::custom::TensorSpec,
    _demands: &burn::backend::fusion::custom::TensorSpec,
    _capacity: &burn::backend::fusion::custom::TensorSpec,
    used: &burn::backend::fusion::custom::TensorSpec,
    served: &burn::backend::fusion::custom::TensorSpec,
    int_like: &burn::backend::fusion::custom::TensorSpec,
    bool_like: &burn::backend::fusion::custom::TensorSpec,
    _tolerance: &f32,
    _sample: &bool,
    _column: &u32,
) -> (
    burn::backend::fusion::custom::TensorSpec,
    burn::backend::fusion::custom::TensorSpec,
    burn::backend::fusion::custom::TensorSpec,
    burn::backend::fusion::custom::TensorSpec,
    burn::backend::fusion::custom::TensorSpec,
) {
    use burn::backend::fusion::custom::TensorSpec;
    (
        TensorSpec::new(used.shape.clone(), int_like.dtype),
        TensorSpec::new(used.shape.clone(), used.dtype),
        TensorSpec::new(served.shape.clone(), served.dtype),
        TensorSpec::new(served.shape.clone(), bool_like.dtype),
        TensorSpec::new(used.shape.clone(), used.dtype),
    )
}

impl StateStepBackend for CubeBackend {
    fn state_step(
        action: IntTensor<Self>,
        demands: FloatTensor<Self>,
        capacity: FloatTensor<Self>,
        used: FloatTensor<Self>,
        served: FloatTensor<Self>,
        bool_like: BoolTensor<Self>,
        tolerance: f32,
    ) -> (
        FloatTensor<Self>,
        FloatTensor<Self>,
        BoolTensor<Self>,
        FloatTensor<Self>,
    ) {
        let [action, demands, capacity, used, served] =
            [action, demands, capacity, used, served].map(into_contiguous);
        let out = StepOutputs::for_rows_of(&served, action.dtype, bool_like.dtype);
        state_step_kernel::launch(
            &out.client,
            out.count.clone(),
            out.dim,
            out.address_type([&action, &demands, &capacity, &used, &served]),
            action.into_tensor_arg(),
            demands.into_tensor_arg(),
            capacity.into_tensor_arg(),
            used.into_tensor_arg(),
            served.into_tensor_arg(),
            out.used.clone().into_tensor_arg(),
            out.served.clone().into_tensor_arg(),
            out.mask.clone().into_tensor_arg(),
            out.remaining.clone().into_tensor_arg(),
            tolerance,
            out.rows,
            out.nodes,
            out.dtypes,
        );
        (out.used, out.served, out.mask, out.remaining)
    }

    fn choose_and_step(
        log_p: FloatTensor<Self>,
        noise: FloatTensor<Self>,
        demands: FloatTensor<Self>,
        capacity: FloatTensor<Self>,
        used: FloatTensor<Self>,
        served: FloatTensor<Self>,
        int_like: IntTensor<Self>,
        bool_like: BoolTensor<Self>,
        tolerance: f32,
        sample: bool,
        column: u32,
    ) -> (
        IntTensor<Self>,
        FloatTensor<Self>,
        FloatTensor<Self>,
        BoolTensor<Self>,
        FloatTensor<Self>,
    ) {
        let [log_p, noise, demands, capacity, used, served] =
            [log_p, noise, demands, capacity, used, served].map(into_contiguous);
        let noise_width = noise.meta.shape()[1] as u32;
        let out = StepOutputs::for_rows_of(&served, int_like.dtype, bool_like.dtype);
        let action = empty_beside(&served, [out.rows as usize, 1], int_like.dtype);
        choose_and_step_kernel::launch(
            &out.client,
            out.count.clone(),
            out.dim,
            out.address_type([&log_p, &noise, &demands, &capacity, &used, &served, &action]),
            log_p.into_tensor_arg(),
            noise.into_tensor_arg(),
            demands.into_tensor_arg(),
            capacity.into_tensor_arg(),
            used.into_tensor_arg(),
            served.into_tensor_arg(),
            action.clone().into_tensor_arg(),
            out.used.clone().into_tensor_arg(),
            out.served.clone().into_tensor_arg(),
            out.mask.clone().into_tensor_arg(),
            out.remaining.clone().into_tensor_arg(),
            tolerance,
            out.rows,
            out.nodes,
            u32::from(sample),
            noise_width,
            column,
            out.dtypes,
        );
        (action, out.used, out.served, out.mask, out.remaining)
    }
}

/// A step's outputs for the rows of `served` (`[R, N]`), on its device: the new load
/// `[R, 1]`, served flags and mask `[R, N]`, the remaining capacity fraction `[R, 1]`; and
/// the launch: one unit per row.
struct StepOutputs {
    client: cubecl::client::Client,
    used: CubeTensor,
    served: CubeTensor,
    mask: CubeTensor,
    remaining: CubeTensor,
    count: CubeCount,
    dim: CubeDim,
    rows: u32,
    nodes: u32,
    /// The float, int and bool storage types, in the kernels' `#[define]` order.
    dtypes: [ElemType; 3],
}

impl StepOutputs {
    fn for_rows_of(served: &CubeTensor, int: DType, boolean: DType) -> Self {
        let [rows, nodes] = served.meta.shape().dims::<2>();
        let float = served.dtype;
        let dim = crate::runtime::cube_launch::cube_dim(&served.client, UNITS);
        Self {
            client: served.client.clone(),
            used: empty_beside(served, [rows, 1], float),
            served: empty_beside(served, [rows, nodes], float),
            mask: empty_beside(served, [rows, nodes], boolean),
            remaining: empty_beside(served, [rows, 1], float),
            count: CubeCount::Static((rows as u32).div_ceil(dim.x).max(1), 1, 1),
            dim,
            rows: rows as u32,
            nodes: nodes as u32,
            dtypes: [float, int, boolean].map(dtype_to_storage_type),
        }
    }

    /// The address type of a launch with `inputs` and these outputs.
    fn address_type<const K: usize>(&self, inputs: [&CubeTensor; K]) -> AddressType {
        let outputs = [&self.used, &self.served, &self.mask, &self.remaining];
        crate::runtime::cube_launch::address_type(inputs.into_iter().chain(outputs))
    }
}

/// A new contiguous tensor on `tensor`'s device.
fn empty_beside(tensor: &CubeTensor, shape: [usize; 2], dtype: DType) -> CubeTensor {
    let (client, device) = (tensor.client.clone(), tensor.device.clone());
    empty_device_contiguous_dtype(client, device, Shape::new(shape), dtype)
}

/// What a row's step reads beside its state: the rows' demands `[R, N]` and capacities
/// `[R, 1]`, and the tolerance of the capacity test (as `crate::ops::state_step::Loads`).
#[derive(CubeType)]
pub(crate) struct Loads<'a, F: Float> {
    pub demands: &'a Tensor<F>,
    pub capacity: &'a Tensor<F>,
    pub tolerance: f32,
}

/// One set of a state's tensors, as a step writes them: the load `[R, 1]`, the served
/// flags and mask `[R, N]`, and the remaining capacity fraction `[R, 1]`. A decode keeps
/// two, the current and the next.
#[derive(CubeType)]
pub(crate) struct StateSet<'a, F: Float, M: Int> {
    pub used: &'a mut Tensor<F>,
    pub served: &'a mut Tensor<F>,
    pub mask: &'a mut Tensor<M>,
    pub remaining: &'a mut Tensor<F>,
}

#[cube]
impl<'a, F: Float> Loads<'a, F> {
    pub fn new(demands: &'a Tensor<F>, capacity: &'a Tensor<F>, tolerance: f32) -> Self {
        Loads::<'a, F> {
            demands,
            capacity,
            tolerance,
        }
    }
}

#[cube]
impl<'a, F: Float, M: Int> StateSet<'a, F, M> {
    pub fn new(
        used: &'a mut Tensor<F>,
        served: &'a mut Tensor<F>,
        mask: &'a mut Tensor<M>,
        remaining: &'a mut Tensor<F>,
    ) -> Self {
        StateSet::<'a, F, M> {
            used,
            served,
            mask,
            remaining,
        }
    }
}

/// Every tensor contiguous, row-major: row `r` of an `[R, N]` tensor starts at `r · N`.
#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn state_step_kernel<F: Float, I: Int, M: Int>(
    action: &Tensor<I>,
    demands: &Tensor<F>,
    capacity: &Tensor<F>,
    used: &Tensor<F>,
    served: &Tensor<F>,
    used_out: &mut Tensor<F>,
    served_out: &mut Tensor<F>,
    mask_out: &mut Tensor<M>,
    remaining_out: &mut Tensor<F>,
    tolerance: f32,
    row_count: u32,
    node_count: u32,
    #[define(F, I, M)] _dtypes: [ElemType; 3],
) {
    let row = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    if row < row_count as usize {
        let loads = Loads::new(demands, capacity, tolerance);
        let mut out = StateSet::new(used_out, served_out, mask_out, remaining_out);
        let to = usize::cast_from(action[row]);
        step_row(to, row, node_count as usize, &loads, used, served, &mut out);
    }
}

/// The choice, as the op-by-op forms make it: the first of the largest log-probabilities
/// (Burn's `argmax`), or the number of nodes whose running sum of probabilities, summed in
/// node order, is below `uniform · total` (at most the last node), the uniform at
/// `noise[row · noise_width + column]`; then the row's step to the chosen node
/// ([`step_row`]).
#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn choose_and_step_kernel<F: Float, I: Int, M: Int>(
    log_p: &Tensor<F>,
    noise: &Tensor<F>,
    demands: &Tensor<F>,
    capacity: &Tensor<F>,
    used: &Tensor<F>,
    served: &Tensor<F>,
    action_out: &mut Tensor<I>,
    used_out: &mut Tensor<F>,
    served_out: &mut Tensor<F>,
    mask_out: &mut Tensor<M>,
    remaining_out: &mut Tensor<F>,
    tolerance: f32,
    row_count: u32,
    node_count: u32,
    sample: u32,
    noise_width: u32,
    column: u32,
    #[define(F, I, M)] _dtypes: [ElemType; 3],
) {
    let row = (CUBE_POS_X * CUBE_DIM_X + UNIT_POS_X) as usize;
    if row < row_count as usize {
        let nodes = node_count as usize;
        let loads = Loads::new(demands, capacity, tolerance);
        let mut out = StateSet::new(used_out, served_out, mask_out, remaining_out);
        let uniform = noise[row * noise_width as usize + column as usize];
        let to = choose_row(log_p, row * nodes, nodes, sample, uniform);
        action_out[row] = I::cast_from(to);
        step_row(to, row, nodes, &loads, used, served, &mut out);
    }
}

/// The node a row chooses from its `nodes` log-probabilities at `log_p[first..]`, as
/// [`choose_and_step_kernel`] says; `uniform` is read only with `sample`.
#[cube]
fn choose_row<F: Float>(
    log_p: &Tensor<F>,
    first: usize,
    nodes: usize,
    sample: u32,
    uniform: F,
) -> usize {
    let mut to = 0usize;
    if sample == 1u32 {
        let mut total = F::new(0.0);
        for node in 0..nodes {
            total += F::exp(log_p[first + node]);
        }
        let threshold = uniform * total;
        let mut cdf = F::new(0.0);
        let mut below = 0usize;
        for node in 0..nodes {
            cdf += F::exp(log_p[first + node]);
            if cdf < threshold {
                below += 1;
            }
        }
        to = below;
        if to > nodes - 1 {
            to = nodes - 1;
        }
    } else {
        let mut best = log_p[first];
        for node in 1..nodes {
            if log_p[first + node] > best {
                best = log_p[first + node];
                to = node;
            }
        }
    }
    to
}

/// One row's step to node `to`: its new load, served flags and remaining capacity
/// fraction (`(capacity − load) / capacity`, as `CvrpState::remaining_capacity_fraction`),
/// and the next mask, into `out`; `used` and `served` are the row's state before it.
#[cube]
fn step_row<F: Float, M: Int>(
    to: usize,
    row: usize,
    nodes: usize,
    loads: &Loads<F>,
    used: &Tensor<F>,
    served: &Tensor<F>,
    out: &mut StateSet<F, M>,
) {
    let first = row * nodes;
    let load = load_after(to, row, nodes, loads.demands, used);
    write_load(row, load, loads.capacity, out);
    let limit = loads.capacity[row] + F::cast_from(loads.tolerance);
    let mut open = 0u32;
    for node in 0..nodes {
        open += step_node(node, to, first, load, limit, loads.demands, served, out);
    }
    write_depot_flag(to, first, open > 0u32, out);
}

/// Row `row`'s load after its step to `to`: `used + demand[to]`, 0 at the depot.
#[cube]
fn load_after<F: Float>(
    to: usize,
    row: usize,
    nodes: usize,
    demands: &Tensor<F>,
    used: &Tensor<F>,
) -> F {
    let mut load = used[row] + demands[row * nodes + to];
    if to == 0 {
        load = F::new(0.0);
    }
    load
}

/// The row's new load and its remaining capacity fraction.
#[cube]
fn write_load<F: Float, M: Int>(
    row: usize,
    load: F,
    capacity: &Tensor<F>,
    out: &mut StateSet<F, M>,
) {
    out.used[row] = load;
    out.remaining[row] = (capacity[row] - load) / capacity[row];
}

/// Node `node`'s served flag after the row's step to `to`, and for a customer its mask
/// entry: closed when served or when its demand would take the load past `limit`. Returns
/// 1 for a customer left open, else 0. The row's nodes start at `first`.
#[cube]
#[allow(clippy::too_many_arguments)]
fn step_node<F: Float, M: Int>(
    node: usize,
    to: usize,
    first: usize,
    load: F,
    limit: F,
    demands: &Tensor<F>,
    served: &Tensor<F>,
    out: &mut StateSet<F, M>,
) -> u32 {
    let mut was_served = served[first + node];
    if node == to {
        was_served = F::new(1.0);
    }
    out.served[first + node] = was_served;
    let mut open = 0u32;
    if node > 0 {
        let closed = was_served > F::new(0.5) || demands[first + node] + load > limit;
        let mut flag = 0u32;
        if closed {
            flag = 1u32;
        } else {
            open = 1u32;
        }
        out.mask[first + node] = M::cast_from(flag);
    }
    open
}

/// The depot's mask entry: shut when the row stands at the depot with a customer left
/// open (`any_open`), so that it does not wait there.
#[cube]
fn write_depot_flag<F: Float, M: Int>(
    to: usize,
    first: usize,
    any_open: bool,
    out: &mut StateSet<F, M>,
) {
    let mut depot_flag = 0u32;
    if to == 0 && any_open {
        depot_flag = 1u32;
    }
    out.mask[first] = M::cast_from(depot_flag);
}

/// The choice [`choose_and_step_kernel`] makes, for a cube's row by all its units, from
/// the row's `nodes` log-probabilities in shared memory (`log_p`, as f32: exact for every
/// float type, −∞ at closed nodes), with `scratch` (at least `room` floats, and `nodes`) to
/// work in. Returns it, and leaves it in `chosen[0]` with `chosen[1]` cleared, as
/// [`step_in_cube`] asks of its flags. The choices are the serial one's: the argmax's
/// parts each keep the first of their largest and are joined taking the lower node among
/// equals, and the sampled choice's sums run in node order, by the first unit, over
/// exponentials the units make in the tensors' float type. On a GPU one unit's loop over
/// the row's nodes in the device's memory was hundreds of dependent reads while the
/// cube's other units waited; here the units share the nodes and read shared memory.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn choose_in_cube<F: Float>(
    log_p: &Shared<[f32]>,
    scratch: &mut Shared<[f32]>,
    noise: &Tensor<F>,
    row: usize,
    nodes: usize,
    sample: u32,
    noise_width: usize,
    column: usize,
    chosen: &mut Shared<[f32]>,
    #[comptime] room: usize,
) -> usize {
    if sample == 1u32 {
        sampled_in_cube(
            log_p,
            scratch,
            noise,
            row,
            nodes,
            noise_width,
            column,
            chosen,
        );
    } else {
        argmax_in_cube(log_p, scratch, nodes, room, chosen);
    }
    sync_cube();
    usize::cast_from(chosen[0])
}

/// [`step_row`] to `to` for a cube's row by all its units, `to` written to `node_out`:
/// `flags[1]`, which must read 0 when the units get here (cleared before a barrier), then
/// says whether a customer is left open. Ends with the depot's mask entry written by the
/// first unit after a barrier.
#[cube]
#[allow(clippy::too_many_arguments)]
pub(crate) fn step_in_cube<F: Float, I: Int, M: Int>(
    to: usize,
    row: usize,
    nodes: usize,
    loads: &Loads<F>,
    used: &Tensor<F>,
    served: &Tensor<F>,
    node_out: &mut Tensor<I>,
    out: &mut StateSet<F, M>,
    flags: &mut Shared<[f32]>,
) {
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let first = row * nodes;
    let load = load_after(to, row, nodes, loads.demands, used);
    if unit == 0 {
        node_out[row] = I::cast_from(to);
        write_load(row, load, loads.capacity, out);
    }
    let limit = loads.capacity[row] + F::cast_from(loads.tolerance);
    let mut node = unit;
    while node < nodes {
        let open = step_node(node, to, first, load, limit, loads.demands, served, out);
        if open > 0u32 {
            // Every unit that writes writes 1.
            flags[1] = f32::new(1.0);
        }
        node += units;
    }
    sync_cube();
    if unit == 0 {
        write_depot_flag(to, first, flags[1] > f32::new(0.5), out);
    }
}

/// The first of the largest of `nodes` values, into `chosen[0]`, with `chosen[1]` cleared
/// (both written by the first unit after a barrier; read them after the next). Each of up
/// to `room / 2` units keeps the first of the largest among its nodes (every `parts`-th),
/// and the first unit joins them, taking the lower node among equals.
#[cube]
fn argmax_in_cube(
    values: &Shared<[f32]>,
    scratch: &mut Shared<[f32]>,
    nodes: usize,
    #[comptime] room: usize,
    chosen: &mut Shared<[f32]>,
) {
    let unit = UNIT_POS_X as usize;
    let parts = (CUBE_DIM_X as usize).min(room / 2);
    if unit < parts {
        let mut best = f32::new(0.0);
        let mut best_node = nodes;
        let mut node = unit;
        while node < nodes {
            if best_node == nodes || values[node] > best {
                best = values[node];
                best_node = node;
            }
            node += parts;
        }
        scratch[2 * unit] = best;
        scratch[2 * unit + 1] = f32::cast_from(best_node);
    }
    sync_cube();
    if unit == 0 {
        let mut best = scratch[0];
        let mut best_node = usize::cast_from(scratch[1]);
        for part in 1..parts {
            let node = usize::cast_from(scratch[2 * part + 1]);
            let value = scratch[2 * part];
            if node < nodes && (value > best || (value == best && node < best_node)) {
                best = value;
                best_node = node;
            }
        }
        chosen[0] = f32::cast_from(best_node);
        chosen[1] = f32::new(0.0);
    }
}

/// The sampled choice (`choose_row`'s) into `chosen[0]`, with `chosen[1]` cleared: the
/// units make each node's probability, `exp(log_p)` in the tensors' float type, and the
/// first unit sums them in node order.
#[cube]
#[allow(clippy::too_many_arguments)]
fn sampled_in_cube<F: Float>(
    log_p: &Shared<[f32]>,
    scratch: &mut Shared<[f32]>,
    noise: &Tensor<F>,
    row: usize,
    nodes: usize,
    noise_width: usize,
    column: usize,
    chosen: &mut Shared<[f32]>,
) {
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let mut node = unit;
    while node < nodes {
        scratch[node] = f32::cast_from(F::exp(F::cast_from(log_p[node])));
        node += units;
    }
    sync_cube();
    if unit == 0 {
        let mut total = F::new(0.0);
        for node in 0..nodes {
            total += F::cast_from(scratch[node]);
        }
        let threshold = noise[row * noise_width + column] * total;
        let mut cdf = F::new(0.0);
        let mut below = 0usize;
        for node in 0..nodes {
            cdf += F::cast_from(scratch[node]);
            if cdf < threshold {
                below += 1;
            }
        }
        if below > nodes - 1 {
            below = nodes - 1;
        }
        chosen[0] = f32::cast_from(below);
        chosen[1] = f32::new(0.0);
    }
}
