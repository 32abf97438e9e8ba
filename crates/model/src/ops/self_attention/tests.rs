use burn::tensor::{Device, TensorData};

use super::*;
use crate::runtime::backend::Backend;
use crate::test_support::{assert_close, pseudo_random, read, weighted_loss_grads};

/// The output and the projection's gradient under a loss that weighs every output
/// entry differently, fused or op by op, on the same inputs.
fn output_and_grad(device: &Device, size: [usize; 4], fused: bool) -> [Vec<f32>; 2] {
    let [b, n, heads, dk] = size;
    let d = heads * dk;
    // Scale 3 gives scores of up to ~dk·9/√dk: peaked softmaxes as well as flat ones.
    let data = TensorData::new(pseudo_random(b * n * 3 * d, 1, 3.0), [b, n, 3 * d]);
    let qkv = Tensor::<3>::from_data(data, device).require_grad();
    let out = if fused {
        self::fused(qkv.clone(), heads)
    } else {
        op_by_op(qkv.clone(), heads, MatmulPrecision::High)
    };
    let grads = weighted_loss_grads(&out, 2);
    let grad = qkv.grad(&grads).expect("the projection is tracked");
    [read(out), read(grad)]
}

/// Within 1e-5 of the op-by-op form on `device` relative to each tensor's largest
/// entry, on sizes with and without node padding, one and several heads, head sizes
/// that are and are not whole 8-lane vectors, the shipped models' (8 × 16) at CVRP10
/// and CVRP100 (more rows than a cube has units), a single node.
fn assert_fused_matches_op_by_op(device: &Device) {
    assert!(
        fused_on(device, 101),
        "the test runs where the fused form exists"
    );
    for size in [
        [3, 11, 8, 16],
        [2, 8, 1, 8],
        [4, 5, 2, 6],
        [2, 101, 8, 16],
        [1, 1, 4, 4],
    ] {
        let fused = output_and_grad(device, size, true);
        let reference = output_and_grad(device, size, false);
        for (what, theirs) in ["output", "gradient"].iter().zip(&reference) {
            assert!(
                theirs.iter().any(|&x| x != 0.0),
                "{size:?} {what}: the reference is all zero"
            );
        }
        let names = ["output", "gradient"];
        assert_close(&fused, &reference, &names, &format!("{size:?}"), 1e-5);
    }
}

#[cfg(feature = "flex")]
#[test]
fn fused_self_attention_matches_op_by_op() {
    let device = Backend::Flex.device().unwrap().autodiff();
    assert_fused_matches_op_by_op(&device);
}

#[cfg(feature = "cpu")]
crate::runtime::testing::test_with_64_bit_offsets!(cube_self_attention_matches_op_by_op);

/// The CubeCL kernels on CubeCL's CPU runtime, against the op-by-op form on the same
/// device. Runs where the `cpu` feature is built (`cargo xtask test-cpu cube_`).
#[cfg(feature = "cpu")]
#[test]
fn cube_self_attention_matches_op_by_op() {
    let _alone = crate::runtime::testing::one_cube_test_at_a_time();
    let device = Backend::Cpu.device().unwrap().autodiff();
    assert_fused_matches_op_by_op(&device);
}

/// Without autodiff the CubeCL kernel gives the same output as with it, and the same
/// output on every run.
#[cfg(feature = "cpu")]
#[test]
fn cube_self_attention_runs_without_autodiff() {
    let _alone = crate::runtime::testing::one_cube_test_at_a_time();
    let device = Backend::Cpu.device().unwrap();
    assert_same_without_autodiff(&device);
}

/// Work is split by instance and every sum taken in one order: one thread and three
/// give the same output and gradient, bit for bit.
#[cfg(feature = "flex")]
#[test]
fn fused_self_attention_does_not_depend_on_the_thread_count() {
    let device = Backend::first_on_host()
        .unwrap()
        .device()
        .unwrap()
        .autodiff();
    let on = |threads| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .expect("a thread pool");
        pool.install(|| output_and_grad(&device, [7, 13, 4, 8], true))
    };
    assert_eq!(on(1), on(3));
}

/// Without autodiff the fused form gives the same output as with it.
#[cfg(feature = "flex")]
#[test]
fn fused_self_attention_runs_without_autodiff() {
    let device = Backend::Flex.device().unwrap();
    assert_same_without_autodiff(&device);
}

fn assert_same_without_autodiff(device: &Device) {
    assert!(fused_on(device, 9));
    let (b, n, heads, dk) = (2, 9, 4, 8);
    let values = pseudo_random(b * n * 3 * heads * dk, 3, 1.0);
    let on = |device: &Device| {
        let data = TensorData::new(values.clone(), [b, n, 3 * heads * dk]);
        let qkv = Tensor::<3>::from_data(data, device);
        let out = fused(qkv, heads).into_data();
        out.try_to_vec::<f32>().expect("f32")
    };
    let plain = on(device);
    assert_eq!(plain, on(&device.clone().autodiff()));
    assert_eq!(plain, on(device));
}
