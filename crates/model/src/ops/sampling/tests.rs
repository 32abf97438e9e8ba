//! Sampling by the inverse CDF: hand-computed choices, and the fused flex form against the
//! op-by-op reference.

use burn::tensor::activation::log_softmax;
use burn::tensor::{Bool, Device, Tensor, TensorData};

use super::{op_by_op, sample};
use crate::runtime::backend::Backend;
use crate::runtime::testing::device_of;
use crate::test_support::pseudo_random;

fn read(t: Tensor<2, burn::tensor::Int>) -> Vec<i64> {
    t.into_data().iter::<i64>().collect()
}

/// Every CPU device compiled in: the fused form runs on flex, the reference elsewhere.
fn cpu_devices() -> Vec<Device> {
    [Backend::Flex, Backend::Ndarray]
        .into_iter()
        .filter_map(device_of)
        .collect()
}

/// Inverting the CDF by hand: row 0 has probabilities 0.5, 0 (masked), 0.25, 0.25, so a
/// uniform u picks the first node whose CDF reaches u: [0, 0.5] node 0, (0.5, 0.75] node
/// 2, (0.75, 1) node 3, never the masked node. 0.5 and 0.75 fall on the CDF's values
/// exactly (all are powers of two).
#[test]
fn sampling_picks_the_nodes_the_cdf_gives() {
    for device in cpu_devices() {
        let p = [0.5f32, 0.0, 0.25, 0.25];
        let uniforms = [0.01f32, 0.49, 0.5, 0.6, 0.74, 0.75, 0.76, 0.99];
        let rows = uniforms.len();
        let log_p: Vec<f32> = uniforms.iter().flat_map(|_| p.map(f32::ln)).collect();
        let log_p = Tensor::<2>::from_data(TensorData::new(log_p, [rows, 4]), &device);
        let uniform =
            Tensor::<2>::from_data(TensorData::new(uniforms.to_vec(), [rows, 1]), &device);
        let expected = [0, 0, 0, 2, 2, 2, 3, 3];
        assert_eq!(
            read(sample(log_p.clone(), uniform.clone())),
            expected,
            "{device:?}"
        );
        assert_eq!(read(op_by_op(log_p, uniform)), expected, "{device:?}");
    }
}

/// Masks of every kind a decode meets: only the depot open (a finished row), only the
/// last node open, nothing masked, and random ones with some node open.
fn masks(rows: usize, n: usize) -> Vec<bool> {
    let noise = pseudo_random(rows * n, 7, 1.0);
    (0..rows * n)
        .map(|i| {
            let (r, j) = (i / n, i % n);
            match r % 4 {
                0 => j != 0,
                1 => j != n - 1,
                2 => false,
                _ => j != r % n && noise[i] > 0.0,
            }
        })
        .collect()
}

/// On flex the fused form picks what the op-by-op form picks, at random uniforms and at
/// uniforms that put `uniform · total` on a CDF value, where `<` decides the node.
#[test]
fn fused_sampling_picks_as_the_op_by_op_form() {
    let Some(device) = device_of(Backend::Flex) else {
        return;
    };
    // 11 blocks of 8 rows and one of 5.
    let (rows, n) = (93, 21);
    let logits = pseudo_random(rows * n, 3, 4.0);
    let logits = Tensor::<2>::from_data(TensorData::new(logits, [rows, n]), &device);
    let mask = Tensor::<2, Bool>::from_data(TensorData::new(masks(rows, n), [rows, n]), &device);
    let log_p = log_softmax(logits.mask_fill(mask, f32::NEG_INFINITY), 1);
    // The reference's own CDF, to aim uniforms at its values: u = cdf[j] / total.
    let cdf: Vec<f32> = log_p
        .clone()
        .exp()
        .cumsum(1)
        .into_data()
        .try_to_vec()
        .unwrap();
    let random = pseudo_random(rows, 11, 0.5);
    let mut at_values = 0;
    for pass in 0..3 {
        let uniforms: Vec<f32> = (0..rows)
            .map(|r| match pass {
                0 => 0.5 + random[r],
                1 => cdf[r * n + (r * 5) % n] / cdf[r * n + n - 1],
                _ => f32::from_bits(
                    (cdf[r * n + (r * 3) % n] / cdf[r * n + n - 1])
                        .to_bits()
                        .saturating_sub(1),
                ),
            })
            .collect();
        at_values += (0..rows)
            .filter(|&r| uniforms[r] * cdf[r * n + n - 1] == cdf[r * n + (r * 5) % n])
            .count();
        let uniform = Tensor::<2>::from_data(TensorData::new(uniforms, [rows, 1]), &device);
        let expected = read(op_by_op(log_p.clone(), uniform.clone()));
        assert_eq!(
            read(sample(log_p.clone(), uniform)),
            expected,
            "pass {pass}"
        );
    }
    assert!(at_values > rows / 2, "the uniforms hit the CDF's values");
}
