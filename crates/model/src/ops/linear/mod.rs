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

use crate::ops::matmul::{self, MatmulPrecision};

/// `linear` applied to the rows of `x`: the fused operation on flex, and elsewhere (or at
/// `highest` precision, the split product [`matmul::product`]) a product and the bias.
///
/// # Shapes
/// - `x`: `[R, in]` → `[R, out]`
pub(crate) fn forward(linear: &Linear, x: Tensor<2>, precision: MatmulPrecision) -> Tensor<2> {
    let bias = linear.bias.as_ref().map(|b| b.val());
    if precision != MatmulPrecision::Highest && crate::runtime::device::runs_on_flex(&x.device()) {
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

/// A linear layer applied to every node as one `[B × N, in]` matrix.
///
/// Given `[B, N, in]`, Burn may instead run B matmuls against the broadcast weight (it
/// does for CVRP20: N = 21), and their weight gradient is then a `[B, in, out]` tensor
/// summed over B: for batch 512 that is 100 MB or more per layer, and it was about 40% of
/// a CVRP20 step's backward.
///
/// # Shapes
/// - `x`: `[B, N, in]` → `[B, N, out]`
pub(crate) fn per_node(linear: &Linear, x: Tensor<3>, precision: MatmulPrecision) -> Tensor<3> {
    let [b, n, d_in] = x.dims();
    let out = forward(linear, x.reshape([b * n, d_in]), precision); // [B × N, out]
    let [_, d_out] = out.dims();
    out.reshape([b, n, d_out])
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
    } else if crate::runtime::device::runs_on_flex(&x.device()) {
        fused(x, weight, None)
    } else {
        x.matmul(weight)
    }
}

/// `x·weight + bias` as one flex operation; call it only where
/// [`crate::runtime::device::runs_on_flex`] holds.
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
mod flex_kernel;

#[cfg(feature = "flex")]
mod flex;

#[cfg(all(test, feature = "flex"))]
mod tests;

#[cfg(test)]
mod per_node_tests {
    use burn::tensor::TensorData;

    use burn::nn::LinearConfig;

    use super::*;
    use crate::runtime::backend::Backend;

    fn values(len: usize, step: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (i * step % 97) as f32 / 48.0 - 1.0)
            .collect()
    }

    fn assert_close(a: Tensor<2>, b: Tensor<2>, what: &str) {
        let a: Vec<f32> = a.into_data().try_to_vec().unwrap();
        let b: Vec<f32> = b.into_data().try_to_vec().unwrap();
        for (i, (x, y)) in a.iter().zip(&b).enumerate() {
            assert!((x - y).abs() < 1e-4, "{what}[{i}]: {x} vs {y}");
        }
    }

    /// `per_node` against Burn's own linear on `[B, N, in]`, which for this shape runs B
    /// broadcast matmuls: the same outputs and the same gradients for the input, the
    /// weight and the bias.
    #[test]
    fn per_node_matches_linear_on_three_dims_with_gradients() {
        let device = Backend::first_on_host()
            .unwrap()
            .device()
            .unwrap()
            .autodiff();
        let (b, n, d_in, d_out) = (6, 11, 8, 4);
        let linear =
            crate::fixed_weights::fixed_weights(LinearConfig::new(d_in, d_out).init(&device));
        let x = Tensor::<3>::from_data(
            TensorData::new(values(b * n * d_in, 7), [b, n, d_in]),
            &device,
        )
        .require_grad();
        let upstream = Tensor::<3>::from_data(
            TensorData::new(values(b * n * d_out, 13), [b, n, d_out]),
            &device,
        );

        let ours = per_node(&linear, x.clone(), MatmulPrecision::High);
        let burns = linear.forward(x.clone());
        let flat = |t: Tensor<3>| t.reshape([b * n, d_out]);
        assert_close(flat(ours.clone()), flat(burns.clone()), "output");

        let grads_ours = (ours * upstream.clone()).sum().backward();
        let grads_burns = (burns * upstream).sum().backward();
        let x_grad = |g| x.grad(g).unwrap().reshape([b * n, d_in]);
        assert_close(x_grad(&grads_ours), x_grad(&grads_burns), "input gradient");
        let w_grad = |g| linear.weight.val().grad(g).unwrap();
        assert_close(w_grad(&grads_ours), w_grad(&grads_burns), "weight gradient");
        let bias = linear.bias.as_ref().unwrap().val();
        let b_grad = |g| bias.grad(g).unwrap().reshape([1, d_out]);
        assert_close(b_grad(&grads_ours), b_grad(&grads_burns), "bias gradient");
    }
}
