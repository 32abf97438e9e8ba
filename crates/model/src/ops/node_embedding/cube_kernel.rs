use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
// The `cube` macro's expansion names the `cubecl` crate: Burn's re-export of it.
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::cubecl::{calculate_cube_count_elemwise, CubeCount};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use crate::runtime::cube_launch::address_type;
use crate::runtime::cube_launch::cube_dim;

/// Units per cube of the forward pass: one output entry each.
const UNITS: u32 = 256;

/// Units per cube (one feature) of the backward pass on a GPU at most, and the shared
/// partial sums' count a unit.
const BACKWARD_UNITS: usize = 256;

/// The gradients' seven sums a feature: the depot's x, y and 1, the customers' x, y,
/// demand fraction and 1.
const SUMS: usize = 7;

fn empty(like: &CubeTensor, shape: Shape) -> CubeTensor {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, like.dtype)
}

/// # Shapes
/// - `coords`: `[B, N, 2]`, `demands`: `[B, N]`, `capacity`: `[B, 1]`, weights `[2, d]`
///   and `[3, d]`, biases `[d]` → `[B × N, d]`
pub(super) fn forward(inputs: [CubeTensor; 7]) -> CubeTensor {
    let [coords, demands, capacity, depot_weight, depot_bias, customer_weight, customer_bias] =
        inputs.map(into_contiguous);
    let [b, n, _] = coords.meta.shape().dims::<3>();
    let [_, d] = depot_weight.meta.shape().dims::<2>();
    let out = empty(&depot_weight, Shape::new([b * n, d]));
    let elements = b * n * d;
    let client = out.client.clone();
    let cubes = cube_dim(&client, UNITS);
    let addresses = address_type([
        &coords,
        &demands,
        &capacity,
        &depot_weight,
        &depot_bias,
        &customer_weight,
        &customer_bias,
        &out,
    ]);
    embed_kernel::launch(
        &client,
        calculate_cube_count_elemwise(&client, elements, cubes),
        cubes,
        addresses,
        coords.into_tensor_arg(),
        demands.into_tensor_arg(),
        capacity.into_tensor_arg(),
        depot_weight.into_tensor_arg(),
        depot_bias.into_tensor_arg(),
        customer_weight.into_tensor_arg(),
        customer_bias.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        elements,
        n as u32,
        d as u32,
        dtype_to_storage_type(out.dtype),
    );
    out
}

/// The depot's weight `[2, d]` and bias `[d]`, and the customers' weight `[3, d]` and
/// bias `[d]` gradients.
///
/// # Shapes
/// - `coords`: `[B, N, 2]`, `demands`: `[B, N]`, `capacity`: `[B, 1]`, `grad_out`:
///   `[B × N, d]`
pub(super) fn backward(inputs: [CubeTensor; 4], d: usize) -> [CubeTensor; 4] {
    let [coords, demands, capacity, grad_out] = inputs.map(into_contiguous);
    let [b, n, _] = coords.meta.shape().dims::<3>();
    let depot_weight = empty(&grad_out, Shape::new([2, d]));
    let depot_bias = empty(&grad_out, Shape::new([d]));
    let customer_weight = empty(&grad_out, Shape::new([3, d]));
    let customer_bias = empty(&grad_out, Shape::new([d]));
    let client = grad_out.client.clone();
    let units = (b * n).next_multiple_of(32).clamp(32, BACKWARD_UNITS) as u32;
    embed_grads_kernel::launch(
        &client,
        CubeCount::Static(d as u32, 1, 1),
        cube_dim(&client, units),
        address_type([
            &coords,
            &demands,
            &capacity,
            &grad_out,
            &depot_weight,
            &depot_bias,
            &customer_weight,
            &customer_bias,
        ]),
        coords.into_tensor_arg(),
        demands.into_tensor_arg(),
        capacity.into_tensor_arg(),
        grad_out.clone().into_tensor_arg(),
        depot_weight.clone().into_tensor_arg(),
        depot_bias.clone().into_tensor_arg(),
        customer_weight.clone().into_tensor_arg(),
        customer_bias.clone().into_tensor_arg(),
        (b * n) as u32,
        n as u32,
        d as u32,
        BACKWARD_UNITS,
        dtype_to_storage_type(grad_out.dtype),
    );
    [depot_weight, depot_bias, customer_weight, customer_bias]
}

/// Output entry (row, feature j) of the rows, row = instance · N + node: the depot's
/// `x·w₀ⱼ + y·w₁ⱼ + bⱼ`, a customer's `x·w₀ⱼ + y·w₁ⱼ + f·w₂ⱼ + bⱼ`.
#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn embed_kernel<F: Float>(
    coords: &Tensor<F>,
    demands: &Tensor<F>,
    capacity: &Tensor<F>,
    depot_weight: &Tensor<F>,
    depot_bias: &Tensor<F>,
    customer_weight: &Tensor<F>,
    customer_bias: &Tensor<F>,
    out: &mut Tensor<F>,
    elements: usize,
    nodes: u32,
    features: u32,
    #[define(F)] _dtype: ElemType,
) {
    let at = ABSOLUTE_POS;
    if at < elements {
        let d = features as usize;
        let (row, j) = (at / d, at % d);
        let x = f32::cast_from(coords[2 * row]);
        let y = f32::cast_from(coords[2 * row + 1]);
        // In f32 whatever the tensors' type, as a matmul accumulates; each term fused
        // into the sum, in feature order, as a CPU's matmul does.
        if row % nodes as usize == 0 {
            let (w0, w1) = (depot_weight[j], depot_weight[d + j]);
            let value = fma(y, f32::cast_from(w1), x * f32::cast_from(w0));
            out[at] = F::cast_from(value + f32::cast_from(depot_bias[j]));
        } else {
            let (w0, w1) = (customer_weight[j], customer_weight[d + j]);
            let value = fma(y, f32::cast_from(w1), x * f32::cast_from(w0));
            // The fraction in the tensors' type, as their division makes it.
            let fraction = f32::cast_from(demands[row] / capacity[row / nodes as usize]);
            let value = fma(fraction, f32::cast_from(customer_weight[2 * d + j]), value);
            out[at] = F::cast_from(value + f32::cast_from(customer_bias[j]));
        }
    }
}

/// Feature `CUBE_POS_X`'s gradients: each unit sums every `CUBE_DIM_X`-th row's
/// products with the rows' gradient, and unit 0 adds the units' sums in unit order (the
/// same numbers on every run).
#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn embed_grads_kernel<F: Float>(
    coords: &Tensor<F>,
    demands: &Tensor<F>,
    capacity: &Tensor<F>,
    grad_out: &Tensor<F>,
    depot_weight: &mut Tensor<F>,
    depot_bias: &mut Tensor<F>,
    customer_weight: &mut Tensor<F>,
    customer_bias: &mut Tensor<F>,
    rows: u32,
    nodes: u32,
    features: u32,
    #[comptime] max_units: usize,
    #[define(F)] _dtype: ElemType,
) {
    let (unit, units) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let (j, d) = (CUBE_POS_X as usize, features as usize);
    let mut partial = Shared::new_slice(SUMS * max_units);
    // The depot's x, y and 1 and the customers' x, y, fraction and 1, times the gradient.
    let (mut depot_x, mut depot_y, mut depot_one) = (f32::new(0.0), f32::new(0.0), f32::new(0.0));
    let (mut customer_x, mut customer_y) = (f32::new(0.0), f32::new(0.0));
    let (mut customer_fraction, mut customer_one) = (f32::new(0.0), f32::new(0.0));
    let mut row = unit;
    while row < rows as usize {
        let g = f32::cast_from(grad_out[row * d + j]);
        let x = f32::cast_from(coords[2 * row]);
        let y = f32::cast_from(coords[2 * row + 1]);
        if row % nodes as usize == 0 {
            depot_x += x * g;
            depot_y += y * g;
            depot_one += g;
        } else {
            customer_x += x * g;
            customer_y += y * g;
            let fraction = demands[row] / capacity[row / nodes as usize];
            customer_fraction += f32::cast_from(fraction) * g;
            customer_one += g;
        }
        row += units;
    }
    partial[unit] = depot_x;
    partial[max_units + unit] = depot_y;
    partial[2 * max_units + unit] = depot_one;
    partial[3 * max_units + unit] = customer_x;
    partial[4 * max_units + unit] = customer_y;
    partial[5 * max_units + unit] = customer_fraction;
    partial[6 * max_units + unit] = customer_one;
    sync_cube();
    if unit == 0 {
        depot_weight[j] = F::cast_from(total(&partial, 0, units, max_units));
        depot_weight[d + j] = F::cast_from(total(&partial, 1, units, max_units));
        depot_bias[j] = F::cast_from(total(&partial, 2, units, max_units));
        customer_weight[j] = F::cast_from(total(&partial, 3, units, max_units));
        customer_weight[d + j] = F::cast_from(total(&partial, 4, units, max_units));
        customer_weight[2 * d + j] = F::cast_from(total(&partial, 5, units, max_units));
        customer_bias[j] = F::cast_from(total(&partial, 6, units, max_units));
    }
}

/// Sum `k`'s units' partial sums, in unit order.
#[cube]
fn total(partial: &Shared<[f32]>, k: usize, units: usize, #[comptime] max_units: usize) -> f32 {
    let mut total = f32::new(0.0);
    for u in 0..units {
        total += partial[k * max_units + u];
    }
    total
}
