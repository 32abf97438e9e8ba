use burn::module::Param;
use burn::nn::{BatchNorm, BatchNormConfig, InstanceNormConfig};
use burn::tensor::{Device, TensorData};

use super::*;
use crate::runtime::backend::Backend;
use crate::test_support::{assert_close, pseudo_random, read, weighted_loss_grads};

/// `backend`'s device with autodiff, where the fused forms run in training.
fn training_device(backend: Backend) -> Device {
    let device = backend.device().unwrap();
    assert!(fused_on(&device));
    device.autodiff()
}

/// `outputs` of the fused form within `tolerance` of Burn's (relative to each tensor's
/// largest entry) at every size, on `backend`'s training device.
fn assert_fused_matches_burns<const S: usize, const K: usize>(
    backend: Backend,
    sizes: &[[usize; S]],
    names: &[&str; K],
    outputs: fn(&Device, [usize; S], bool) -> [Vec<f32>; K],
) {
    let device = training_device(backend);
    for &size in sizes {
        let ours = outputs(&device, size, true);
        let reference = outputs(&device, size, false);
        assert_close(&ours, &reference, names, &format!("{size:?}"), 1e-5);
    }
}

/// Features of different offsets and spreads, as after a skip connection.
fn features(rows: usize, d: usize) -> Vec<f32> {
    pseudo_random(rows * d, 13, 2.0)
        .iter()
        .enumerate()
        .map(|(i, v)| v * (1 + i % d % 3) as f32 + (i % d) as f32 * 0.25)
        .collect()
}

/// Gamma and beta of `d` features, neither ones nor zeros.
fn affine(d: usize, device: &Device) -> [Param<Tensor<1>>; 2] {
    [11, 12].map(|seed| {
        let values = TensorData::new(pseudo_random(d, seed, 1.0), [d]);
        Param::from_tensor(Tensor::from_data(values, device))
    })
}

/// A skip connection's rows for `features`' rows, tracked.
fn skip(rows: usize, d: usize, device: &Device) -> Tensor<2> {
    let values = TensorData::new(pseudo_random(rows * d, 15, 1.0), [rows, d]);
    Tensor::<2>::from_data(values, device).require_grad()
}

/// The output; the gradients of the input, the skip, gamma and beta under a loss that
/// weighs every output entry differently; and the running mean and variance after the
/// step.
fn outputs(device: &Device, [rows, d]: [usize; 2], fused: bool) -> [Vec<f32>; 7] {
    let mut norm = BatchNormConfig::new(d).init(device);
    [norm.gamma, norm.beta] = affine(d, device);
    let x = Tensor::<2>::from_data(TensorData::new(features(rows, d), [rows, d]), device)
        .require_grad();
    let skip = skip(rows, d, device);
    let out = if fused {
        let mut updates = RunningUpdates::default();
        let out = BatchNormRun::new(&norm, device).forward(x.clone(), skip.clone(), &mut updates);
        updates.finish();
        out
    } else {
        norm.forward(x.clone() + skip.clone())
    };
    let grads = weighted_loss_grads(&out, 14);
    [
        read(out),
        read(x.grad(&grads).expect("the input is tracked")),
        read(skip.grad(&grads).expect("the skip is tracked")),
        read(norm.gamma.grad(&grads).expect("gamma is tracked")),
        read(norm.beta.grad(&grads).expect("beta is tracked")),
        read(norm.running_mean.value_sync()),
        read(norm.running_var.value_sync()),
    ]
}

const BATCH_NORM_OUTPUTS: [&str; 7] = [
    "output",
    "input gradient",
    "skip gradient",
    "gamma gradient",
    "beta gradient",
    "running mean",
    "running variance",
];

/// The encoder's shapes, sizes that are not whole vectors, and one row (zero variance).
const BATCH_NORM_SIZES: [[usize; 2]; 4] = [[33, 128], [7, 5], [1408, 16], [1, 4]];

/// Within 1e-5 of Burn's batch norm relative to each tensor's largest entry: output,
/// every gradient, and the running statistics.
#[cfg(feature = "flex")]
#[test]
fn fused_batch_norm_matches_burns_with_gradients_and_running_statistics() {
    let (sizes, names) = (&BATCH_NORM_SIZES, &BATCH_NORM_OUTPUTS);
    assert_fused_matches_burns(Backend::Flex, sizes, names, outputs);
}

#[cfg(feature = "cpu")]
crate::runtime::testing::test_with_64_bit_offsets!(
    cube_batch_norm_matches_burns_with_gradients_and_running_statistics
);

/// The CubeCL kernels on CubeCL's CPU runtime, against Burn's batch norm there.
#[cfg(feature = "cpu")]
#[test]
fn cube_batch_norm_matches_burns_with_gradients_and_running_statistics() {
    let _alone = crate::runtime::testing::one_cube_test_at_a_time();
    let (sizes, names) = (&BATCH_NORM_SIZES, &BATCH_NORM_OUTPUTS);
    assert_fused_matches_burns(Backend::Cpu, sizes, names, outputs);
}

/// Outside training (no autodiff) Burn's inference form runs, on the running statistics.
#[cfg(feature = "flex")]
#[test]
fn without_autodiff_the_running_statistics_are_used() {
    let device = Backend::first_on_host().unwrap().device().unwrap();
    let norm = BatchNormConfig::new(3).init(&device);
    let x = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 2.0, 3.0], [1, 3]), &device);
    // Running mean 0 and variance 1: the output is the input, up to epsilon.
    let skip = Tensor::zeros([1, 3], &device);
    let run = BatchNormRun::new(&norm, &device);
    let out = run.forward(x, skip, &mut RunningUpdates::default());
    for (a, r) in read(out).iter().zip([1.0, 2.0, 3.0]) {
        assert!((a - r).abs() < 1e-4, "{a} vs {r}");
    }
}

/// The inference form, its parameters reshaped before the input comes, gives Burn's
/// `BatchNorm::forward` bit for bit: every parameter and statistic set, one norm after
/// another on the same rows as in the encoder.
fn assert_inference_form_is_burns(backend: Backend) {
    let device = backend.device().unwrap();
    let (rows, d) = (33, 128);
    let norms: Vec<BatchNorm> = (0..2u64)
        .map(|i| {
            let mut norm = BatchNormConfig::new(d).init(&device);
            [norm.gamma, norm.beta] = affine(d, &device);
            let stat = |seed: u64, shift: f32| {
                let values = pseudo_random(d, 20 + 2 * i + seed, 1.0);
                let values = values.iter().map(|v| v + shift).collect::<Vec<_>>();
                Tensor::<1>::from_data(TensorData::new(values, [d]), &device)
            };
            norm.running_mean.update(stat(0, 0.0));
            norm.running_var.update(stat(1, 1.5));
            norm
        })
        .collect();
    let x = Tensor::<2>::from_data(TensorData::new(features(rows, d), [rows, d]), &device);
    let skip = x.clone() * 0.5;
    // Made before the first norm runs, as the encoder makes a layer's two.
    let runs: Vec<_> = norms
        .iter()
        .map(|n| BatchNormRun::new(n, &device))
        .collect();
    let mut updates = RunningUpdates::default();
    let mut ours = x.clone();
    let mut burns = x;
    for (run, norm) in runs.into_iter().zip(&norms) {
        ours = run.forward(ours, skip.clone(), &mut updates);
        burns = norm.forward(burns + skip.clone());
    }
    updates.finish();
    assert_eq!(read(ours), read(burns));
}

#[cfg(feature = "flex")]
#[test]
fn batch_norm_inference_form_is_burns() {
    assert_inference_form_is_burns(Backend::Flex);
}

/// On CubeCL the operations fuse differently from Burn's (that is the point): the same
/// numbers still.
#[cfg(feature = "cpu")]
#[test]
fn cube_batch_norm_inference_form_is_burns() {
    let _alone = crate::runtime::testing::one_cube_test_at_a_time();
    assert_inference_form_is_burns(Backend::Cpu);
}

/// Instance norm of `d` features with [`affine`]'s gamma and beta.
fn instance_norm_of(d: usize, device: &Device) -> InstanceNorm {
    let mut norm = InstanceNormConfig::new(d).init(device);
    let [gamma, beta] = affine(d, device);
    (norm.gamma, norm.beta) = (Some(gamma), Some(beta));
    norm
}

/// The output and the gradients of the input, the skip, gamma and beta, as in
/// [`outputs`], for instance norm over `[B, N, d]`.
fn instance_outputs(device: &Device, [b, n, d]: [usize; 3], fused: bool) -> [Vec<f32>; 5] {
    let norm = instance_norm_of(d, device);
    let x = Tensor::<3>::from_data(TensorData::new(features(b * n, d), [b, n, d]), device)
        .require_grad();
    let skip = skip(b * n, d, device);
    // Burn's reference normalises the sum as a tensor of its own, whose gradient is
    // then both addends': with the addition in the same stream, CubeCL's fusion of it
    // into the group norm's reduction fails to expand ("Cast element count must
    // match") in Burn 0.22.1.
    let sum = (x.clone() + skip.clone().reshape([b, n, d])).into_data();
    let sum = Tensor::<3>::from_data(sum, device).require_grad();
    let out = if fused {
        let rows = x.clone().reshape([b * n, d]);
        instance_norm(&norm, rows, skip.clone(), n).reshape([b, n, d])
    } else {
        norm.forward(sum.clone().swap_dims(1, 2)).swap_dims(1, 2)
    };
    let grads = weighted_loss_grads(&out, 14);
    let param_grad = |p: &Option<Param<Tensor<1>>>| {
        read(p.as_ref().expect("affine").grad(&grads).expect("tracked"))
    };
    let sum_grad = || read(sum.grad(&grads).expect("the sum is tracked"));
    let [x_grad, skip_grad] = match fused {
        true => [
            read(x.grad(&grads).expect("the input is tracked")),
            read(skip.grad(&grads).expect("the skip is tracked")),
        ],
        false => [sum_grad(), sum_grad()],
    };
    [
        read(out),
        x_grad,
        skip_grad,
        param_grad(&norm.gamma),
        param_grad(&norm.beta),
    ]
}

const INSTANCE_NORM_OUTPUTS: [&str; 5] = [
    "output",
    "input gradient",
    "skip gradient",
    "gamma gradient",
    "beta gradient",
];

/// POMO's shapes (CVRP20, CVRP100), odd sizes, and one node per instance (zero
/// variance).
const INSTANCE_NORM_SIZES: [[usize; 3]; 4] = [[4, 21, 128], [2, 101, 16], [3, 7, 5], [5, 1, 4]];

/// Within 1e-5 of Burn's instance norm relative to each tensor's largest entry: output
/// and every gradient.
#[cfg(feature = "flex")]
#[test]
fn fused_instance_norm_matches_burns_with_gradients() {
    let (sizes, names) = (&INSTANCE_NORM_SIZES, &INSTANCE_NORM_OUTPUTS);
    assert_fused_matches_burns(Backend::Flex, sizes, names, instance_outputs);
}

#[cfg(feature = "cpu")]
crate::runtime::testing::test_with_64_bit_offsets!(cube_instance_norm_matches_burns_with_gradients);

/// The CubeCL kernels on CubeCL's CPU runtime, against Burn's instance norm there.
#[cfg(feature = "cpu")]
#[test]
fn cube_instance_norm_matches_burns_with_gradients() {
    let _alone = crate::runtime::testing::one_cube_test_at_a_time();
    let (sizes, names) = (&INSTANCE_NORM_SIZES, &INSTANCE_NORM_OUTPUTS);
    assert_fused_matches_burns(Backend::Cpu, sizes, names, instance_outputs);
}

/// Without autodiff (inference) the fused instance norm gives the output it gives in
/// training.
fn assert_instance_norm_same_without_autodiff(backend: Backend) {
    let device = backend.device().unwrap();
    let [b, n, d] = [3, 9, 8];
    let on = |device: &Device| {
        let x = TensorData::new(features(b * n, d), [b * n, d]);
        let x = Tensor::<2>::from_data(x, device);
        let skip = Tensor::<2>::from_data(
            TensorData::new(pseudo_random(b * n * d, 15, 1.0), [b * n, d]),
            device,
        );
        read(instance_norm(&instance_norm_of(d, device), x, skip, n))
    };
    assert_eq!(on(&device), on(&device.clone().autodiff()));
}

#[cfg(feature = "flex")]
#[test]
fn fused_instance_norm_runs_without_autodiff() {
    assert_instance_norm_same_without_autodiff(Backend::Flex);
}

#[cfg(feature = "cpu")]
#[test]
fn cube_instance_norm_runs_without_autodiff() {
    let _alone = crate::runtime::testing::one_cube_test_at_a_time();
    assert_instance_norm_same_without_autodiff(Backend::Cpu);
}
