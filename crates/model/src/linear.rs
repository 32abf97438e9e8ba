//! A linear layer over rows, `x·W + b`, as one operation on flex, forward and backward.
//!
//! Burn 0.22.1 runs a linear layer as a matmul and a broadcast add of the bias. On flex
//! the matmul allocates its output as bytes of alignment 1, which `Bytes::from_bytes_vec`
//! (cubecl-environment 0.11.3) then copies into a 16-byte-aligned buffer: every output is
//! written three times (zeroed, copied, computed) before the bias is added in a fourth pass.
//! That was ~6% of a `tiny_1` epoch, plus the bias. Here the output starts as the bias rows,
//! gemm accumulates the product onto them, and the backward takes the weight's gradient
//! from strided views of the saved input: one gemm per gradient, as Burn's own backward.
//!
//! Only flex has it; elsewhere a product and a broadcast bias run, as Burn's `Linear::forward`
//! (which the tests compare against) but with the bias reshaped before the product.

use burn::nn::Linear;
use burn::tensor::Tensor;

use crate::matmul::{self, MatmulPrecision};

/// `linear` applied to the rows of `x`: the fused operation on flex, and elsewhere (or at
/// `highest` precision, the split product [`matmul::product`]) a product and the bias.
///
/// # Shapes
/// - `x`: `[R, in]` → `[R, out]`
pub(crate) fn forward(linear: &Linear, x: Tensor<2>, precision: MatmulPrecision) -> Tensor<2> {
    let bias = linear.bias.as_ref().map(|b| b.val());
    if precision != MatmulPrecision::Highest && crate::backend::runs_on_flex(&x.device()) {
        return fused(x, linear.weight.val(), bias);
    }
    // Burn's linear reshapes the bias after the product, and on CubeCL a reshape ends a
    // fused chain: the bias (and the skip connection after it) were kernels of their own.
    // Reshaped first, the product fuses with the additions that follow it.
    let bias = bias.map(|b| b.unsqueeze_dim::<2>(0)); // [1, out]
    let out = matmul::product(x, linear.weight.val(), precision); // [R, out]
    match bias {
        Some(bias) => out + bias,
        None => out,
    }
}

/// `x·weight` for a weight that is not a whole layer (a slice of one, a transpose): the
/// fused operation on flex, Burn's matmul elsewhere, the split product at `highest`.
///
/// # Shapes
/// - `x`: `[R, in]`, `weight`: `[in, out]` → `[R, out]`
pub(crate) fn matmul_rows(
    x: Tensor<2>,
    weight: Tensor<2>,
    precision: MatmulPrecision,
) -> Tensor<2> {
    if precision == MatmulPrecision::Highest {
        matmul::product(x, weight, precision)
    } else if crate::backend::runs_on_flex(&x.device()) {
        fused(x, weight, None)
    } else {
        x.matmul(weight)
    }
}

/// `x·weight + bias` as one flex operation; call it only where
/// [`crate::backend::runs_on_flex`] holds.
///
/// # Shapes
/// - `x`: `[R, in]`, `weight`: `[in, out]`, `bias`: `[out]` → `[R, out]`
#[cfg(feature = "flex")]
fn fused(x: Tensor<2>, weight: Tensor<2>, bias: Option<Tensor<1>>) -> Tensor<2> {
    use burn::backend::Dispatch;
    let (x, weight) = (x.into_dispatch(), weight.into_dispatch());
    let out = match bias {
        Some(bias) => <Dispatch as LinearBackend>::linear(x, weight, bias.into_dispatch()),
        None => <Dispatch as LinearBackend>::linear_without_bias(x, weight),
    };
    Tensor::from_dispatch(out)
}

#[cfg(not(feature = "flex"))]
fn fused(_x: Tensor<2>, _weight: Tensor<2>, _bias: Option<Tensor<1>>) -> Tensor<2> {
    unreachable!("flex is not compiled in; check `runs_on_flex` first")
}

#[cfg(feature = "flex")]
use extension::LinearBackend;

#[cfg(feature = "flex")]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::FloatTensor;

    /// A linear layer over rows as a backend operation (two, as the extension macro takes
    /// no optional tensors).
    #[backend_extension(Autodiff: cfg(feature = "autodiff"), Flex: cfg(feature = "flex"))]
    pub trait LinearBackend: burn::backend::Backend {
        /// See [`super::fused`].
        fn linear(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            bias: FloatTensor<Self>,
        ) -> FloatTensor<Self>;

        /// See [`super::fused`].
        fn linear_without_bias(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
        ) -> FloatTensor<Self>;
    }
}

/// Row-major products through gemm, with every operand given by its strides.
#[cfg(feature = "flex")]
mod kernel {
    /// A matrix in a slice: `values[row * row_stride + col * col_stride]`.
    pub(super) struct Strided<'a> {
        pub values: &'a [f32],
        pub row_stride: usize,
        pub col_stride: usize,
    }

    impl<'a> Strided<'a> {
        pub fn rows(values: &'a [f32], cols: usize) -> Self {
            Self {
                values,
                row_stride: cols,
                col_stride: 1,
            }
        }

        /// The transpose of a row-major matrix of `cols` columns.
        pub fn transposed(values: &'a [f32], cols: usize) -> Self {
            Self {
                values,
                row_stride: 1,
                col_stride: cols,
            }
        }

        fn covers(&self, rows: usize, cols: usize) -> bool {
            rows == 0
                || cols == 0
                || (rows - 1) * self.row_stride + (cols - 1) * self.col_stride < self.values.len()
        }
    }

    /// `lhs[m, k] · rhs[k, n]`, row-major, plus `row` added to every output row if given.
    pub(super) fn product(
        [m, n, k]: [usize; 3],
        row: Option<&[f32]>,
        lhs: Strided,
        rhs: Strided,
    ) -> Vec<f32> {
        assert!(lhs.covers(m, k) && rhs.covers(k, n) && row.is_none_or(|r| r.len() == n));
        // Without a bias the output is not zeroed first: gemm writes every entry.
        let mut out = row.map_or_else(|| Vec::with_capacity(m * n), |row| row.repeat(m));
        // flex's own threshold: below it a product is not worth splitting across threads.
        let parallelism = if m * n * k >= 192 * 192 * 192 {
            gemm::Parallelism::Rayon(0)
        } else {
            gemm::Parallelism::None
        };
        let accumulate = row.is_some();
        // SAFETY: every index gemm reads is within the slices (checked above), and it
        // writes the m × n entries of `out`'s allocation; without `accumulate` it reads none
        // of them (it zeroes them when k = 0), so the uninitialised capacity is only written.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                out.as_mut_ptr(),
                1,
                n as isize,
                accumulate,
                lhs.values.as_ptr(),
                lhs.col_stride as isize,
                lhs.row_stride as isize,
                rhs.values.as_ptr(),
                rhs.col_stride as isize,
                rhs.row_stride as isize,
                // gemm's `dst = alpha·dst + beta·lhs·rhs`.
                if accumulate { 1.0 } else { 0.0 },
                1.0,
                false,
                false,
                false,
                parallelism,
            );
            out.set_len(m * n);
        }
        out
    }

    /// The sum of every row of a row-major `[R, cols]` matrix.
    pub(super) fn column_sums(values: &[f32], cols: usize) -> Vec<f32> {
        let mut sums = vec![0.0; cols];
        for row in values.chunks_exact(cols) {
            for (sum, v) in sums.iter_mut().zip(row) {
                *sum += v;
            }
        }
        sums
    }
}

#[cfg(feature = "flex")]
mod flex_impl {
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, NodeGuard, Ops, OpsKind};
    use burn::backend::autodiff::{Autodiff, NodeId};
    use burn::backend::tensor::FloatTensor;
    use burn::backend::Flex;
    use burn_flex::FlexTensor;

    use super::kernel::{column_sums, product, Strided};
    use super::LinearBackend;
    use crate::row_kernels::{floats, tensor};

    fn sizes(x: &FlexTensor, weight: &FlexTensor) -> [usize; 3] {
        let (x, w) = (x.layout().shape(), weight.layout().shape());
        assert_eq!(
            x[1], w[0],
            "linear: {} input features, weight of {}",
            x[1], w[0]
        );
        [x[0], w[0], w[1]]
    }

    fn forward(x: &FlexTensor, weight: &FlexTensor, bias: Option<&FlexTensor>) -> FlexTensor {
        let [rows, d_in, d_out] = sizes(x, weight);
        let out = product(
            [rows, d_out, d_in],
            bias.map(floats),
            Strided::rows(floats(x), d_in),
            Strided::rows(floats(weight), d_out),
        );
        tensor(out, [rows, d_out])
    }

    impl LinearBackend for Flex {
        fn linear(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            bias: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            let bias = bias.to_contiguous();
            forward(&x.to_contiguous(), &weight.to_contiguous(), Some(&bias))
        }

        fn linear_without_bias(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            forward(&x.to_contiguous(), &weight.to_contiguous(), None)
        }
    }

    /// The gradients of `x·W (+ b)` for the parents that are tracked.
    /// `parents`: the input's, the weight's and the bias's (if any) node ids.
    fn register_grads(
        (x, weight): &(FlexTensor, FlexTensor),
        grad_out: FlexTensor,
        parents: [Option<NodeId>; 3],
        grads: &mut Gradients,
    ) {
        let [rows, d_in, d_out] = sizes(x, weight);
        let grad_out = grad_out.to_contiguous();
        let grad_out = floats(&grad_out);
        let [x_id, weight_id, bias_id] = parents;
        let mut register = |id: Option<NodeId>, values: Vec<f32>, shape: Vec<usize>| {
            if let Some(id) = id {
                grads.register::<Flex>(id, tensor(values, shape));
            }
        };
        if x_id.is_some() {
            let w_t = Strided::transposed(floats(weight), d_out); // [out, in]
            let grad = product(
                [rows, d_in, d_out],
                None,
                Strided::rows(grad_out, d_out),
                w_t,
            );
            register(x_id, grad, vec![rows, d_in]);
        }
        if weight_id.is_some() {
            let x_t = Strided::transposed(floats(x), d_in); // [in, R]
            let grad = product(
                [d_in, d_out, rows],
                None,
                x_t,
                Strided::rows(grad_out, d_out),
            );
            register(weight_id, grad, vec![d_in, d_out]);
        }
        if bias_id.is_some() {
            register(bias_id, column_sums(grad_out, d_out), vec![d_out]);
        }
    }

    /// The backward of `x·W (+ b)`, for N = 3 parents (input, weight, bias) or 2 (no bias).
    #[derive(Debug)]
    struct LinearBackward<const N: usize>;

    impl<const N: usize> Backward<Flex, N> for LinearBackward<N> {
        /// The (contiguous) input and weight.
        type State = (FlexTensor, FlexTensor);

        fn backward(self, ops: Ops<Self::State, N>, grads: &mut Gradients, _: &mut Checkpointer) {
            let grad_out = grads.consume::<Flex>(&ops.node);
            let mut parents = [None; 3];
            for (id, parent) in parents.iter_mut().zip(&ops.parents) {
                *id = parent.as_ref().map(|node| node.id);
            }
            register_grads(&ops.state, grad_out, parents, grads);
        }
    }

    /// The product, recorded for the backward when any of `nodes` (the input's, the
    /// weight's and, with a bias, the bias's) is tracked.
    fn tracked<C: CheckpointStrategy, const N: usize>(
        nodes: [NodeGuard; N],
        x: FlexTensor,
        weight: FlexTensor,
        bias: Option<FlexTensor>,
    ) -> FloatTensor<Autodiff<Flex, C>> {
        let (x, weight) = (x.to_contiguous(), weight.to_contiguous());
        let bias = bias.map(|b| b.to_contiguous());
        let out = forward(&x, &weight, bias.as_ref());
        match LinearBackward::<N>
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => prep.finish((x, weight), out),
            OpsKind::UnTracked(prep) => prep.finish(out),
        }
    }

    impl<C: CheckpointStrategy> LinearBackend for Autodiff<Flex, C> {
        fn linear(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
            bias: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            let nodes = [x.node(), weight.node(), bias.node()];
            let [x, weight, bias] = [x, weight, bias].map(|t| t.into_primitive());
            tracked::<C, 3>(nodes, x, weight, Some(bias))
        }

        fn linear_without_bias(
            x: FloatTensor<Self>,
            weight: FloatTensor<Self>,
        ) -> FloatTensor<Self> {
            let nodes = [x.node(), weight.node()];
            tracked::<C, 2>(nodes, x.into_primitive(), weight.into_primitive(), None)
        }
    }
}

#[cfg(all(test, feature = "flex"))]
mod tests {
    use burn::module::{Module, Param};
    use burn::tensor::{Device, TensorData};

    use super::*;
    use crate::backend::Backend;
    use crate::test_values::{assert_close, pseudo_random, read, weighted_loss_grads};

    fn autodiff_device() -> Device {
        Backend::first_on_host()
            .unwrap()
            .device()
            .unwrap()
            .autodiff()
    }

    /// A layer with fixed pseudo-random weights (Burn's initialiser draws new ones per call).
    fn layer(device: &Device, [d_in, d_out]: [usize; 2], bias: bool) -> Linear {
        let weight = TensorData::new(pseudo_random(d_in * d_out, 8, 0.5), [d_in, d_out]);
        let bias_values = TensorData::new(pseudo_random(d_out, 9, 0.5), [d_out]);
        Linear {
            weight: Param::from_tensor(Tensor::from_data(weight, device)),
            bias: bias.then(|| Param::from_tensor(Tensor::from_data(bias_values, device))),
        }
    }

    fn burns(layer: &Linear, x: Tensor<2>) -> Tensor<2> {
        layer.forward(x)
    }

    fn fused_form(layer: &Linear, x: Tensor<2>) -> Tensor<2> {
        fused(x, layer.weight.val(), layer.bias.as_ref().map(|b| b.val()))
    }

    /// The output and the gradients of the input, weight and bias (empty when there is
    /// none) under a loss that weighs every output entry differently, `run` computing
    /// the layer.
    fn output_and_grads(
        device: &Device,
        [rows, d_in, d_out]: [usize; 3],
        bias: bool,
        run: fn(&Linear, Tensor<2>) -> Tensor<2>,
    ) -> [Vec<f32>; 4] {
        let layer = layer(device, [d_in, d_out], bias);
        let x = TensorData::new(pseudo_random(rows * d_in, 5, 2.0), [rows, d_in]);
        let x = Tensor::<2>::from_data(x, device).require_grad();
        let out = run(&layer, x.clone());
        let grads = weighted_loss_grads(&out, 6);
        let bias_grad = match &layer.bias {
            Some(b) => read(b.grad(&grads).expect("the bias is tracked")),
            None => Vec::new(),
        };
        [
            read(out),
            read(x.grad(&grads).expect("the input is tracked")),
            read(layer.weight.grad(&grads).expect("the weight is tracked")),
            bias_grad,
        ]
    }

    /// `run`'s output and gradients within 1e-5 of Burn's linear layer, relative to each
    /// tensor's largest entry, at each `[rows, in, out]` size, with and without a bias.
    fn assert_matches_burns(run: fn(&Linear, Tensor<2>) -> Tensor<2>, sizes: &[[usize; 3]]) {
        let device = autodiff_device();
        assert!(crate::backend::runs_on_flex(&device));
        let names = [
            "output",
            "input gradient",
            "weight gradient",
            "bias gradient",
        ];
        for &size in sizes {
            for bias in [true, false] {
                let ours = output_and_grads(&device, size, bias, run);
                let reference = output_and_grads(&device, size, bias, burns);
                let case = format!("{size:?} bias {bias}");
                assert_close(&ours, &reference, &names, &case, 1e-5);
            }
        }
    }

    /// Burn's numbers for one row, for sizes that are not whole vectors, and for one
    /// large enough for gemm to split it across threads.
    #[test]
    fn fused_linear_matches_burns_with_gradients() {
        assert_matches_burns(
            fused_form,
            &[[1, 3, 5], [33, 128, 384], [37, 17, 9], [300, 200, 128]],
        );
    }

    /// gemm splits a large product across threads by output blocks, never by the sum:
    /// one thread and three give the same numbers, bit for bit.
    #[test]
    fn fused_linear_does_not_depend_on_the_thread_count() {
        let device = autodiff_device();
        let on = |threads| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("a thread pool");
            pool.install(|| output_and_grads(&device, [300, 200, 128], true, fused_form))
        };
        assert_eq!(on(1), on(3));
    }

    /// Without autodiff (evaluation, the rollout baseline) the same output as with it.
    #[test]
    fn fused_linear_runs_without_autodiff() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let layer = layer(&device, [6, 4], true);
        let x = TensorData::new(pseudo_random(5 * 6, 7, 1.0), [5, 6]);
        let on = |device: &Device| {
            let layer = layer.clone().to_device(device);
            let x = Tensor::<2>::from_data(x.clone(), device);
            read(forward(&layer, x, MatmulPrecision::High))
        };
        let plain = on(&device);
        assert_eq!(plain, on(&device.clone().autodiff()));
        let reference = read(layer.forward(Tensor::<2>::from_data(x.clone(), &device)));
        for (a, r) in plain.iter().zip(&reference) {
            assert!((a - r).abs() <= 1e-6, "{a} vs {r}");
        }
    }

    /// At `highest` precision (three products of split operands, then the bias) the
    /// output and every gradient of Burn's linear layer: the split passes gradients
    /// through its head whole.
    #[test]
    fn highest_linear_matches_burns_with_gradients() {
        fn highest(layer: &Linear, x: Tensor<2>) -> Tensor<2> {
            forward(layer, x, MatmulPrecision::Highest)
        }
        assert_matches_burns(highest, &[[1, 3, 5], [37, 17, 9], [33, 128, 384]]);
    }
}
