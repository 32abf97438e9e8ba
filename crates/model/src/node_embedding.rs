//! The encoder's node embedding on CubeCL devices as one operation each way: the depot's
//! `Linear(2, d)` on its [x, y] and each customer's `Linear(3, d)` on its [x, y, demand
//! fraction], written as the rows `[B × N, d]` the layers read.
//!
//! In Burn's operations that was eleven launches forward (the demand fraction's division,
//! three slices, a `cat` of the customers' features, two products, two bias additions fused
//! with nothing, the depot's and customers' `cat`) and five or six backward (the weights'
//! products with their transposed copies, the biases' sums). Here it is one kernel forward,
//! a unit an output entry, and one backward, a cube a feature whose units walk the rows
//! (its partial sums added in unit order: the same numbers on every run). A product's two
//! or three terms are fused multiply-adds in f32 (whatever the tensors' type) in feature
//! order, then the bias is added, as flex's and the CPU runtime's matmuls make them (on
//! the stand-in two epochs' costs are unchanged, and losses and gradient norms move by
//! ~1e-6 relative: the weight gradients sum in another order); CUDA's matmul ran them on
//! TF32 tensor cores. flex and ndarray keep Burn's operations, which the tests compare
//! against.

use burn::nn::Linear;
use burn::tensor::{Device, Tensor};

/// Whether [`embed`] runs on `device` (with or without autodiff): CubeCL devices, for
/// layers with biases (Kool's and rl4co's).
pub(crate) fn fused_on(device: &Device, depot: &Linear, customer: &Linear) -> bool {
    crate::backend::runs_through_cubecl(device) && depot.bias.is_some() && customer.bias.is_some()
}

/// Every node's embedding as a row: `depot` on the depot's [x, y], `customer` on each
/// customer's [x, y, demand / capacity] (the fraction divided in the kernel, as a
/// division of the tensors rounds it); call it only where [`fused_on`] holds.
///
/// # Shapes
/// - `coords`: `[B, N, 2]` (depot first), `demands`: `[B, N]`, `capacity`: `[B, 1]` →
///   `[B × N, d]`
pub(crate) fn embed(
    depot: &Linear,
    customer: &Linear,
    coords: Tensor<3>,
    [demands, capacity]: [Tensor<2>; 2],
) -> Tensor<2> {
    #[cfg(any(feature = "cuda", feature = "cpu"))]
    {
        use burn::backend::Dispatch;
        let bias = |linear: &Linear| {
            let bias = linear.bias.as_ref().expect("`fused_on` checks the biases");
            bias.val().into_dispatch()
        };
        let out = <Dispatch as extension::NodeEmbeddingBackend>::embed_nodes(
            coords.into_dispatch(),
            demands.into_dispatch(),
            capacity.into_dispatch(),
            depot.weight.val().into_dispatch(),
            bias(depot),
            customer.weight.val().into_dispatch(),
            bias(customer),
        );
        Tensor::from_dispatch(out)
    }
    #[cfg(not(any(feature = "cuda", feature = "cpu")))]
    {
        let _ = (depot, customer, coords, demands, capacity);
        unreachable!("no CubeCL backend is compiled in; check `fused_on` first")
    }
}

#[cfg(any(feature = "cuda", feature = "cpu"))]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::fusion::custom::TensorSpec;
    use burn::backend::tensor::FloatTensor;
    use burn::tensor::Shape;
    use burn_cubecl::CubeBackend;

    use super::kernel;

    /// The rows `[B × N, d]` for Fusion.
    fn embed_metadata(
        coords: &TensorSpec,
        _demands: &TensorSpec,
        _capacity: &TensorSpec,
        depot_weight: &TensorSpec,
        _depot_bias: &TensorSpec,
        _customer_weight: &TensorSpec,
        _customer_bias: &TensorSpec,
    ) -> TensorSpec {
        let [b, n, _] = coords.shape.dims::<3>();
        let [_, d] = depot_weight.shape.dims::<2>();
        TensorSpec::new(Shape::new([b * n, d]), depot_weight.dtype)
    }

    /// The four parameters' gradients, each its parameter's shape.
    fn grads_metadata(
        _coords: &TensorSpec,
        _demands: &TensorSpec,
        _capacity: &TensorSpec,
        depot_weight: &TensorSpec,
        customer_weight: &TensorSpec,
        _grad_out: &TensorSpec,
    ) -> (TensorSpec, TensorSpec, TensorSpec, TensorSpec) {
        let [_, d] = depot_weight.shape.dims::<2>();
        let spec = |shape: Shape| TensorSpec::new(shape, depot_weight.dtype);
        (
            spec(depot_weight.shape.clone()),
            spec(Shape::new([d])),
            spec(customer_weight.shape.clone()),
            spec(Shape::new([d])),
        )
    }

    /// [`super::embed`] as a backend operation.
    #[backend_extension(
        Autodiff: cfg(feature = "autodiff"),
        Cube: cfg(any(feature = "cuda", feature = "cpu")),
        Fusion: cfg(any(feature = "cuda", feature = "cpu"))
    )]
    pub trait NodeEmbeddingBackend: burn::backend::Backend {
        /// See [`super::embed`]; weights `[in, d]`, biases `[d]`.
        #[fusion(meta = embed_metadata)]
        fn embed_nodes(
            coords: FloatTensor<Self>,
            demands: FloatTensor<Self>,
            capacity: FloatTensor<Self>,
            depot_weight: FloatTensor<Self>,
            depot_bias: FloatTensor<Self>,
            customer_weight: FloatTensor<Self>,
            customer_bias: FloatTensor<Self>,
        ) -> FloatTensor<Self>;
    }

    /// The embedding's backward pass on CubeCL, as its own operation.
    #[backend_extension(Cube, Fusion)]
    pub trait NodeEmbeddingGradsBackend: burn::backend::Backend {
        /// The gradients of the depot's weight and bias and the customers' weight and bias
        /// from the rows' gradient `grad_out` `[B × N, d]`.
        #[allow(clippy::type_complexity)]
        #[fusion(meta = grads_metadata)]
        fn embed_nodes_grads(
            coords: FloatTensor<Self>,
            demands: FloatTensor<Self>,
            capacity: FloatTensor<Self>,
            depot_weight: FloatTensor<Self>,
            customer_weight: FloatTensor<Self>,
            grad_out: FloatTensor<Self>,
        ) -> (
            FloatTensor<Self>,
            FloatTensor<Self>,
            FloatTensor<Self>,
            FloatTensor<Self>,
        );
    }

    impl NodeEmbeddingBackend for CubeBackend {
        fn embed_nodes(
            coords: FloatTensor<Self>,
            demands: FloatTensor<Self>,
            capacity: FloatTensor<Self>,
            depot_weight: FloatTensor<Self>,
            depot_bias: FloatTensor<Self>,
            customer_weight: FloatTensor<Self>,
            customer_bias: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            kernel::forward([
                coords,
                demands,
                capacity,
                depot_weight,
                depot_bias,
                customer_weight,
                customer_bias,
            ])
        }
    }

    impl NodeEmbeddingGradsBackend for CubeBackend {
        fn embed_nodes_grads(
            coords: FloatTensor<Self>,
            demands: FloatTensor<Self>,
            capacity: FloatTensor<Self>,
            depot_weight: FloatTensor<Self>,
            _customer_weight: FloatTensor<Self>,
            grad_out: FloatTensor<Self>,
        ) -> (
            FloatTensor<Self>,
            FloatTensor<Self>,
            FloatTensor<Self>,
            FloatTensor<Self>,
        ) {
            let [_, d] = depot_weight.meta.shape().dims::<2>();
            let [dw, db, cw, cb] = kernel::backward([coords, demands, capacity, grad_out], d);
            (dw, db, cw, cb)
        }
    }

    #[cfg(feature = "autodiff")]
    mod autodiff {
        use burn::backend::autodiff::checkpoint::{
            base::Checkpointer, strategy::CheckpointStrategy,
        };
        use burn::backend::autodiff::grads::Gradients;
        use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
        use burn::backend::autodiff::Autodiff;
        use burn::backend::tensor::FloatTensor;
        use burn::backend::Cube;

        use super::{NodeEmbeddingBackend, NodeEmbeddingGradsBackend};

        #[derive(Debug)]
        struct CubeEmbeddingBackward;

        impl Backward<Cube, 7> for CubeEmbeddingBackward {
            /// The coordinates, the demands, the capacities and the two weights.
            type State = [FloatTensor<Cube>; 5];

            fn backward(
                self,
                ops: Ops<Self::State, 7>,
                grads: &mut Gradients,
                _: &mut Checkpointer,
            ) {
                let [coords, demands, capacity, depot_weight, customer_weight] = ops.state;
                let grad_out = grads.consume::<Cube>(&ops.node);
                let (dw, db, cw, cb) = Cube::embed_nodes_grads(
                    coords,
                    demands,
                    capacity,
                    depot_weight,
                    customer_weight,
                    grad_out,
                );
                // The coordinates and demands are data: no gradient of theirs is read.
                let [_, _, _, dw_node, db_node, cw_node, cb_node] = ops.parents;
                for (node, grad) in [(dw_node, dw), (db_node, db), (cw_node, cw), (cb_node, cb)] {
                    if let Some(node) = node {
                        grads.register::<Cube>(node.id, grad);
                    }
                }
            }
        }

        impl<C: CheckpointStrategy> NodeEmbeddingBackend for Autodiff<Cube, C> {
            fn embed_nodes(
                coords: FloatTensor<Self>,
                demands: FloatTensor<Self>,
                capacity: FloatTensor<Self>,
                depot_weight: FloatTensor<Self>,
                depot_bias: FloatTensor<Self>,
                customer_weight: FloatTensor<Self>,
                customer_bias: FloatTensor<Self>,
            ) -> FloatTensor<Self> {
                let nodes = [
                    coords.node(),
                    demands.node(),
                    capacity.node(),
                    depot_weight.node(),
                    depot_bias.node(),
                    customer_weight.node(),
                    customer_bias.node(),
                ];
                let [coords, demands, capacity, depot_weight, customer_weight] =
                    [coords, demands, capacity, depot_weight, customer_weight]
                        .map(|t| t.into_primitive());
                let out = Cube::embed_nodes(
                    coords.clone(),
                    demands.clone(),
                    capacity.clone(),
                    depot_weight.clone(),
                    depot_bias.into_primitive(),
                    customer_weight.clone(),
                    customer_bias.into_primitive(),
                );
                let state = [coords, demands, capacity, depot_weight, customer_weight];
                match CubeEmbeddingBackward
                    .prepare::<C>(nodes)
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => prep.finish(state, out),
                    OpsKind::UnTracked(prep) => prep.finish(out),
                }
            }
        }
    }
}

/// The CubeCL kernels.
#[cfg(any(feature = "cuda", feature = "cpu"))]
mod kernel {
    use burn::backend::cubecl::dtype_to_storage_type;
    use burn::tensor::Shape;
    // The `cube` macro's expansion names the `cubecl` crate: Burn's re-export of it.
    use burn_cubecl::cubecl;
    use burn_cubecl::cubecl::prelude::*;
    use burn_cubecl::cubecl::{calculate_cube_count_elemwise, CubeCount};
    use burn_cubecl::kernel::into_contiguous;
    use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
    use burn_cubecl::tensor::CubeTensor;

    use crate::cube_launch::address_type;
    use crate::cube_launch::cube_dim;

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
        let (mut depot_x, mut depot_y, mut depot_one) =
            (f32::new(0.0), f32::new(0.0), f32::new(0.0));
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
}

#[cfg(all(test, feature = "cpu"))]
mod tests {
    use burn::nn::LinearConfig;
    use burn::tensor::TensorData;

    use super::*;
    use crate::backend::Backend;
    use crate::matmul::MatmulPrecision;
    use crate::test_values::{pseudo_random, read};

    fn assert_close(what: &str, ours: Vec<f32>, reference: Vec<f32>) {
        assert_eq!(ours.len(), reference.len(), "{what}");
        let largest = reference.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(largest > 0.0, "{what}: all zeros");
        for (i, (a, r)) in ours.iter().zip(&reference).enumerate() {
            assert!(
                (a - r).abs() <= 1e-5 * largest.max(1.0),
                "{what}[{i}]: {a} vs {r}"
            );
        }
    }

    crate::cube_launch::for_tests::test_with_64_bit_offsets!(
        cube_embedding_matches_the_linear_layers_with_gradients
    );

    /// On CubeCL's CPU runtime the embedding kernels against the encoder's linear layers in
    /// Burn's operations on the same device: the rows, and the gradients of both weights
    /// and both biases under a loss that weighs every entry differently; more rows than a
    /// backward cube has units.
    #[test]
    fn cube_embedding_matches_the_linear_layers_with_gradients() {
        let _alone = crate::test_values::one_cube_test_at_a_time();
        let device = Backend::Cpu.device().unwrap().autodiff();
        for (b, n, d) in [(3, 7, 16), (5, 101, 128)] {
            let depot = LinearConfig::new(2, d).init(&device);
            let customer = LinearConfig::new(3, d).init(&device);
            assert!(fused_on(&device, &depot, &customer));
            let data =
                |len: usize, seed: u64| TensorData::new(pseudo_random(len, seed, 1.0), [len]);
            let coords = Tensor::<1>::from_data(data(b * n * 2, 3), &device).reshape([b, n, 2]);
            let demands = Tensor::<1>::from_data(data(b * n, 4), &device).reshape([b, n]);
            let capacity = Tensor::<1>::from_data(data(b, 6), &device).reshape([b, 1]) + 2.0;
            let upstream = Tensor::<1>::from_data(data(b * n * d, 5), &device).reshape([b * n, d]);
            let ours = embed(
                &depot,
                &customer,
                coords.clone(),
                [demands.clone(), capacity.clone()],
            );
            let reference = crate::encoder::embed_op_by_op(
                &depot,
                &customer,
                coords,
                demands / capacity,
                MatmulPrecision::High,
            );
            assert_close("rows", read(ours.clone()), read(reference.clone()));
            let ours = (ours * upstream.clone()).sum().backward();
            let reference = (reference * upstream).sum().backward();
            for (what, linear) in [("depot", &depot), ("customer", &customer)] {
                let weight = linear.weight.val();
                let grad = |g| read(weight.grad(g).expect("the weight is tracked"));
                assert_close(what, grad(&ours), grad(&reference));
                let bias = linear.bias.as_ref().unwrap().val();
                let grad = |g| read(bias.grad(g).expect("the bias is tracked"));
                assert_close(what, grad(&ours), grad(&reference));
            }
        }
    }
}
