use burn::nn::LinearConfig;
use burn::tensor::TensorData;

use super::*;
use crate::fixed_weights::fixed_weights;
use crate::ops::matmul::MatmulPrecision;
use crate::runtime::backend::Backend;
use crate::test_support::{pseudo_random, read};

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

crate::runtime::testing::test_with_64_bit_offsets!(
    cube_embedding_matches_the_linear_layers_with_gradients
);

/// On CubeCL's CPU runtime the embedding kernels against the encoder's linear layers in
/// Burn's operations on the same device: the rows, and the gradients of both weights
/// and both biases under a loss that weighs every entry differently; more rows than a
/// backward cube has units.
#[test]
fn cube_embedding_matches_the_linear_layers_with_gradients() {
    let _alone = crate::runtime::testing::one_cube_test_at_a_time();
    let device = Backend::Cpu.device().unwrap().autodiff();
    for (b, n, d) in [(3, 7, 16), (5, 101, 128)] {
        let depot = fixed_weights(LinearConfig::new(2, d).init(&device));
        let customer = fixed_weights(LinearConfig::new(3, d).init(&device));
        assert!(fused_on(&device, &depot, &customer));
        let data = |len: usize, seed: u64| TensorData::new(pseudo_random(len, seed, 1.0), [len]);
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
        let reference = crate::ops::node_embedding::embed_op_by_op(
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
