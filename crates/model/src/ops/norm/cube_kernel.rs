//! Normalisation over groups of rows as CubeCL kernels (CUDA, and CubeCL's CPU runtime):
//! the forward pass of `normalization`'s `NormBackend` for `CubeBackend`, and its backward.
//!
//! One cube per (group, feature): its units walk the group's rows, each keeping partial
//! sums, which unit 0 then adds in unit order (no atomics, the same numbers on every run).
//! Burn's batch norm on these devices is ~8 launches forward and ~12 backward, around two
//! copies of the swapped input; here it is one each way.
//!
//! Sums run in f32 whatever the tensors' float type (flex's in f64): each unit's partial
//! covers rows/units rows, so the error grows with that, not with the rows.

use burn::backend::cubecl::dtype_to_storage_type;
use burn::tensor::Shape;
// The `cube` macro's expansion names the `cubecl` crate: Burn's re-export of it.
use burn_cubecl::cubecl;
use burn_cubecl::cubecl::prelude::*;
use burn_cubecl::cubecl::CubeCount;
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use crate::runtime::cube_launch::address_type;
use crate::runtime::cube_launch::cube_dim;

/// Units per cube (a feature of one group) on a GPU at most, and the shared partial sums'
/// size.
const UNITS: usize = 256;

/// Units for groups of `group_rows` rows: a unit a row up to [`UNITS`], in whole warps
/// (POMO's instance norm has groups of N + 1 rows).
fn units_for(group_rows: usize) -> u32 {
    group_rows.next_multiple_of(32).clamp(32, UNITS) as u32
}

/// `group_rows` clamped to the rows, as flex's: the groups' count and size.
pub(crate) fn group_sizes(rows: usize, group_rows: usize) -> (usize, usize) {
    let group_rows = group_rows.clamp(1, rows.max(1));
    assert_eq!(
        rows % group_rows,
        0,
        "{rows} rows in groups of {group_rows}"
    );
    (rows / group_rows, group_rows)
}

fn empty(like: &CubeTensor, shape: Shape) -> CubeTensor {
    empty_device_contiguous_dtype(like.client.clone(), like.device.clone(), shape, like.dtype)
}

/// The rows of `x + skip` normalised in groups of `group_rows`, and each group's mean and
/// (biased) variance per feature.
///
/// # Shapes
/// - `x`, `skip`: `[R, d]`, `gamma`, `beta`: `[d]` → `[R, d]`, `[G, d]`, `[G, d]`
pub(crate) fn forward(
    [x, skip, gamma, beta]: [CubeTensor; 4],
    epsilon: f32,
    group_rows: usize,
) -> [CubeTensor; 3] {
    let [x, skip, gamma, beta] = [x, skip, gamma, beta].map(into_contiguous);
    let [rows, d] = x.meta.shape().dims::<2>();
    let (groups, group_rows) = group_sizes(rows, group_rows);
    let out = empty(&x, x.meta.shape().clone());
    let [mean, variance] = [0, 1].map(|_| empty(&x, Shape::new([groups, d])));
    let client = x.client.clone();
    norm_rows_kernel::launch(
        &client,
        CubeCount::Static((groups * d) as u32, 1, 1),
        cube_dim(&client, units_for(group_rows)),
        address_type([&x, &skip, &gamma, &beta, &out, &mean, &variance]),
        x.clone().into_tensor_arg(),
        skip.into_tensor_arg(),
        gamma.into_tensor_arg(),
        beta.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        mean.clone().into_tensor_arg(),
        variance.clone().into_tensor_arg(),
        epsilon,
        group_rows as u32,
        d as u32,
        UNITS,
        dtype_to_storage_type(x.dtype),
    );
    [out, mean, variance]
}

/// The gradient of the input `x + skip`, and each group's share of gamma's and beta's.
///
/// # Shapes
/// - `x`, `skip`, `grad_out`: `[R, d]`, `gamma`: `[d]`, `mean`, `variance`: `[G, d]` →
///   `[R, d]`, `[G, d]`, `[G, d]`
pub(crate) fn backward(
    [x, skip, gamma, mean, variance, grad_out]: [CubeTensor; 6],
    epsilon: f32,
    group_rows: usize,
) -> [CubeTensor; 3] {
    let [x, skip, gamma, mean, variance, grad_out] =
        [x, skip, gamma, mean, variance, grad_out].map(into_contiguous);
    let [rows, d] = x.meta.shape().dims::<2>();
    let (groups, group_rows) = group_sizes(rows, group_rows);
    let x_grad = empty(&x, x.meta.shape().clone());
    let [gamma_grad, beta_grad] = [0, 1].map(|_| empty(&x, Shape::new([groups, d])));
    let client = x.client.clone();
    norm_rows_backward_kernel::launch(
        &client,
        CubeCount::Static((groups * d) as u32, 1, 1),
        cube_dim(&client, units_for(group_rows)),
        address_type([
            &x,
            &skip,
            &gamma,
            &mean,
            &variance,
            &grad_out,
            &x_grad,
            &gamma_grad,
            &beta_grad,
        ]),
        x.clone().into_tensor_arg(),
        skip.into_tensor_arg(),
        gamma.into_tensor_arg(),
        mean.into_tensor_arg(),
        variance.into_tensor_arg(),
        grad_out.into_tensor_arg(),
        x_grad.clone().into_tensor_arg(),
        gamma_grad.clone().into_tensor_arg(),
        beta_grad.clone().into_tensor_arg(),
        epsilon,
        group_rows as u32,
        d as u32,
        UNITS,
        dtype_to_storage_type(x.dtype),
    );
    [x_grad, gamma_grad, beta_grad]
}

/// The cube's group and feature, and where its column starts.
#[derive(CubeType, Clone)]
struct ColumnAt {
    /// `group · d + feature`: the statistics' index.
    stat: usize,
    /// The group's first row's entry of the feature.
    first: usize,
    rows: usize,
    d: usize,
}

#[cube]
fn column_at(group_rows: u32, features: u32) -> ColumnAt {
    let d = features as usize;
    let (group, feature) = (CUBE_POS_X as usize / d, CUBE_POS_X as usize % d);
    ColumnAt {
        stat: CUBE_POS_X as usize,
        first: group * group_rows as usize * d + feature,
        rows: group_rows as usize,
        d,
    }
}

/// The sum of every unit's `partial`, in unit order, for every unit to read.
#[cube]
fn cube_sum(partials: &mut Shared<[f32]>, partial: f32) -> f32 {
    let unit = UNIT_POS_X as usize;
    partials[unit] = partial;
    sync_cube();
    if unit == 0 {
        let mut total = f32::new(0.0);
        for u in 0..CUBE_DIM_X as usize {
            total += partials[u];
        }
        partials[CUBE_DIM_X as usize] = total;
    }
    sync_cube();
    let total = partials[CUBE_DIM_X as usize];
    // Before anyone writes the next partials.
    sync_cube();
    total
}

/// The skip connection's sum at `i`, in the tensors' float type as a separate addition
/// would have made it.
#[cube]
fn sum_at<F: Float>(x: &Tensor<F>, skip: &Tensor<F>, i: usize) -> f32 {
    f32::cast_from(x[i] + skip[i])
}

#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn norm_rows_kernel<F: Float>(
    x: &Tensor<F>,
    skip: &Tensor<F>,
    gamma: &Tensor<F>,
    beta: &Tensor<F>,
    out: &mut Tensor<F>,
    mean: &mut Tensor<F>,
    variance: &mut Tensor<F>,
    epsilon: f32,
    group_rows: u32,
    features: u32,
    #[comptime] units: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = column_at(group_rows, features);
    let (unit, step) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let mut partials = Shared::new_slice(units + 1);
    let count = f32::cast_from(at.rows);

    let mut partial = f32::new(0.0);
    let mut r = unit;
    while r < at.rows {
        partial += sum_at(x, skip, at.first + r * at.d);
        r += step;
    }
    let m = cube_sum(&mut partials, partial) / count;

    let mut partial = f32::new(0.0);
    let mut r = unit;
    while r < at.rows {
        let c = sum_at(x, skip, at.first + r * at.d) - m;
        partial += c * c;
        r += step;
    }
    let v = cube_sum(&mut partials, partial) / count;

    let feature = at.stat % at.d;
    let scale = f32::cast_from(gamma[feature]) / (v + epsilon).sqrt();
    let shift = f32::cast_from(beta[feature]);
    let mut r = unit;
    while r < at.rows {
        let i = at.first + r * at.d;
        out[i] = F::cast_from((sum_at(x, skip, i) - m) * scale + shift);
        r += step;
    }
    if unit == 0 {
        mean[at.stat] = F::cast_from(m);
        variance[at.stat] = F::cast_from(v);
    }
}

/// Per feature, with s = 1/√(var + ε) and x̂ = (x − mean)·s: ∂β = Σ ∂y, ∂γ = Σ ∂y·x̂, and
/// ∂x = γ·s·(∂y − ∂β/R − x̂·∂γ/R) over the group's R rows.
#[cube(launch, address_type = "dynamic")]
#[allow(clippy::too_many_arguments)]
fn norm_rows_backward_kernel<F: Float>(
    x: &Tensor<F>,
    skip: &Tensor<F>,
    gamma: &Tensor<F>,
    mean: &Tensor<F>,
    variance: &Tensor<F>,
    grad_out: &Tensor<F>,
    x_grad: &mut Tensor<F>,
    gamma_grad: &mut Tensor<F>,
    beta_grad: &mut Tensor<F>,
    epsilon: f32,
    group_rows: u32,
    features: u32,
    #[comptime] units: usize,
    #[define(F)] _dtype: ElemType,
) {
    let at = column_at(group_rows, features);
    let (unit, step) = (UNIT_POS_X as usize, CUBE_DIM_X as usize);
    let mut partials = Shared::new_slice(units + 1);
    let count = f32::cast_from(at.rows);
    let m = f32::cast_from(mean[at.stat]);
    let s = 1.0 / (f32::cast_from(variance[at.stat]) + epsilon).sqrt();

    let mut grad_sum = f32::new(0.0);
    let mut projected = f32::new(0.0);
    let mut r = unit;
    while r < at.rows {
        let i = at.first + r * at.d;
        let g = f32::cast_from(grad_out[i]);
        grad_sum += g;
        projected += g * ((sum_at(x, skip, i) - m) * s);
        r += step;
    }
    let beta_total = cube_sum(&mut partials, grad_sum);
    let gamma_total = cube_sum(&mut partials, projected);

    let k = f32::cast_from(gamma[at.stat % at.d]) * s;
    let (mean_grad, projection) = (beta_total / count, gamma_total / count * s);
    let mut r = unit;
    while r < at.rows {
        let i = at.first + r * at.d;
        let g = f32::cast_from(grad_out[i]);
        let centred = sum_at(x, skip, i) - m;
        x_grad[i] = F::cast_from(k * (g - mean_grad - centred * projection));
        r += step;
    }
    if unit == 0 {
        gamma_grad[at.stat] = F::cast_from(gamma_total);
        beta_grad[at.stat] = F::cast_from(beta_total);
    }
}
