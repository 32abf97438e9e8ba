use burn::module::{Module, Param};
use burn::tensor::{Device, TensorData};

use super::*;
use crate::runtime::backend::Backend;
use crate::test_support::{assert_close, pseudo_random, read, weighted_loss_grads};

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
    assert!(crate::runtime::device::runs_on_flex(&device));
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
