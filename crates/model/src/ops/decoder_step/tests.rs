//! The fused decoder step against the op-by-op reference: log-probabilities and the
//! gradients of every input, on flex and on CubeCL's CPU runtime.

#![cfg_attr(not(any(feature = "flex", feature = "cpu")), allow(dead_code))]

use burn::tensor::{Bool, Device, Tensor, TensorData};

use super::reference::op_by_op;
use super::{fused_on, fused_step, keys_by_feature};
use crate::ops::matmul::MatmulPrecision;
use crate::runtime::backend::Backend;
use crate::test_support::pseudo_random;

/// C in C·tanh(·), as the shipped models' (any value serves the comparison).
const TANH_CLIPPING: f64 = 10.0;

/// Masks of every kind a decode meets: only the depot left (a finished row), one
/// customer left, nothing masked, random ones with some node open, and late ones with
/// whole runs of nodes closed (so that the backward pass's sums over rows leave some out).
fn step_masks(rows: usize, n: usize) -> Vec<bool> {
    let noise = pseudo_random(rows * n, 99, 1.0);
    (0..rows)
        .flat_map(|r| {
            let noise = &noise[r * n..(r + 1) * n];
            (0..n).map(move |j| match r % 5 {
                0 => j != 0,
                1 => j != n - 1,
                2 => false,
                3 => j != r % n && noise[j] > 0.0,
                _ => j != r % n && (j / 8 + r / 5) % 3 != 0,
            })
        })
        .collect()
}

struct StepCase {
    b: usize,
    s: usize,
    n: usize,
    heads: usize,
    head_dim: usize,
    temperature: f64,
}

/// The step's log-probabilities and the gradients of its four float inputs, from the
/// fused op or the op-by-op form, on the same inputs and the same upstream gradient.
fn step_and_grads(device: &Device, case: &StepCase, fused: bool) -> Vec<Vec<f32>> {
    assert!(
        fused_on(device, case.n, case.heads, case.heads * case.head_dim),
        "the tests run where the fused step exists"
    );
    let device = device.clone();
    let (b, s, n, heads, dk) = (case.b, case.s, case.n, case.heads, case.head_dim);
    let d = heads * dk;
    let leaf = |seed, shape: Vec<usize>| {
        let len = shape.iter().product();
        let data = TensorData::new(pseudo_random(len, seed, 1.5), shape);
        (data, device.clone())
    };
    let tracked3 =
        |(data, device): (TensorData, Device)| Tensor::<3>::from_data(data, &device).require_grad();
    let tracked4 =
        |(data, device): (TensorData, Device)| Tensor::<4>::from_data(data, &device).require_grad();
    let query = tracked3(leaf(1, vec![b, s, d]));
    let keys = tracked4(leaf(2, vec![b, n, heads, dk]));
    let values = tracked4(leaf(3, vec![b, n, heads, dk]));
    let logit_keys = tracked3(leaf(4, vec![b, n, d]));
    let mask =
        Tensor::<2, Bool>::from_data(TensorData::new(step_masks(b * s, n), [b * s, n]), &device);
    let log_probs = if fused {
        fused_step(
            query.clone(),
            keys.clone(),
            values.clone(),
            logit_keys.clone(),
            keys_by_feature(&keys, &values, &logit_keys),
            mask.clone(),
            TANH_CLIPPING,
            case.temperature,
        )
    } else {
        op_by_op(
            query.clone(),
            keys.clone(),
            values.clone(),
            logit_keys.clone(),
            mask.clone(),
            TANH_CLIPPING,
            case.temperature,
            MatmulPrecision::High,
        )
    };
    // An upstream gradient on every open node, as a loss over all of them would give.
    let weights = Tensor::<1>::from_data(
        TensorData::new(pseudo_random(b * s * n, 5, 1.0), [b * s * n]),
        &device,
    )
    .reshape([b * s, n]);
    let loss = (log_probs.clone().mask_fill(mask, 0.0) * weights).sum();
    let grads = loss.backward();
    let read = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().unwrap();
    vec![
        read(log_probs.reshape([b * s * n])),
        read(query.grad(&grads).unwrap().reshape([b * s * d])),
        read(keys.grad(&grads).unwrap().reshape([b * n * d])),
        read(values.grad(&grads).unwrap().reshape([b * n * d])),
        read(logit_keys.grad(&grads).unwrap().reshape([b * n * d])),
    ]
}

/// Each entry within 1e-5 of the reference, relative to the reference tensor's scale.
fn assert_close_relative(what: &str, ours: &[f32], reference: &[f32]) {
    let scale = reference
        .iter()
        .filter(|x| x.is_finite())
        .fold(0.0f32, |m, x| m.max(x.abs()));
    assert!(scale > 0.0, "{what}: the reference is not all zero");
    for (i, (a, r)) in ours.iter().zip(reference).enumerate() {
        if r.is_infinite() {
            assert_eq!(a, r, "{what}[{i}]: masked in the reference");
        } else {
            assert!(
                (a - r).abs() <= 1e-5 * scale.max(1.0),
                "{what}[{i}]: fused {a} vs op-by-op {r} (scale {scale})"
            );
        }
    }
}

fn assert_fused_matches_op_by_op(case: StepCase) {
    let device = Backend::first_on_host().unwrap().device().unwrap();
    assert_fused_matches_op_by_op_on(&device.autodiff(), case);
}

fn assert_fused_matches_op_by_op_on(device: &Device, case: StepCase) {
    let fused = step_and_grads(device, &case, true);
    let reference = step_and_grads(device, &case, false);
    let names = [
        "log-probabilities",
        "query gradient",
        "glimpse key gradient",
        "glimpse value gradient",
        "logit key gradient",
    ];
    for ((name, ours), reference) in names.iter().zip(&fused).zip(&reference) {
        assert_close_relative(name, ours, reference);
    }
}

// The default device's fused step: flex's (ndarray has none).
#[cfg(feature = "flex")]
#[test]
fn fused_step_matches_op_by_op_single_start() {
    assert_fused_matches_op_by_op(StepCase {
        b: 8,
        s: 1,
        n: 7,
        heads: 4,
        head_dim: 4,
        temperature: 1.0,
    });
}

// The default device's fused step: flex's (ndarray has none).
#[cfg(feature = "flex")]
#[test]
fn fused_step_matches_op_by_op_multi_start_with_temperature() {
    assert_fused_matches_op_by_op(StepCase {
        b: 3,
        s: 5,
        n: 6,
        heads: 4,
        head_dim: 4,
        temperature: 0.7,
    });
}

/// The shipped models' head size (16) and more nodes than one 8-lane vector: the
/// kernel's vector paths, where the cases above take its lane-by-lane ones. Seven
/// rollouts an instance go through its blocks of 4, 2 and 1 rows.
// The default device's fused step: flex's (ndarray has none).
#[cfg(feature = "flex")]
#[test]
fn fused_step_matches_op_by_op_at_vector_sizes() {
    assert_fused_matches_op_by_op(StepCase {
        b: 2,
        s: 7,
        n: 21,
        heads: 8,
        head_dim: 16,
        temperature: 1.0,
    });
}

#[cfg(feature = "cpu")]
crate::runtime::testing::test_with_64_bit_offsets!(cube_step_matches_op_by_op_on_cubecl_cpu);

/// The CubeCL kernels on CubeCL's CPU runtime against the op-by-op form on the same
/// device, log-probabilities and every input's gradient: every mask kind, one and
/// several rollouts an instance, a temperature, the shipped models' head size, and more
/// nodes (101) and scores (808) than a cube has units. Runs where the `cpu` feature is
/// built (with `cargo xtask build-cuda`'s LLVM); CI only type-checks it.
#[cfg(feature = "cpu")]
#[test]
fn cube_step_matches_op_by_op_on_cubecl_cpu() {
    assert_cube_step_matches_op_by_op(&[
        (8, 1, 7, 4, 4, 1.0),
        (3, 5, 6, 4, 4, 0.7),
        (2, 7, 21, 8, 16, 1.0),
        (2, 3, 101, 8, 16, 1.0),
    ]);
}

/// The same checks with more units a cube than the instances have nodes, as on a GPU
/// (64 units for tiny_1's 11 nodes); CubeCL's CPU runtime runs as many as it has cores
/// (each a thread that spins at every barrier), so 4 units on 3 nodes here.
#[cfg(feature = "cpu")]
#[test]
fn cube_step_matches_op_by_op_with_idle_units() {
    let given = crate::runtime::cube_launch::for_tests::with_units(4, || {
        assert_cube_step_matches_op_by_op(&[(3, 2, 3, 4, 4, 1.0), (2, 3, 3, 4, 4, 0.7)])
    });
    assert!(given > 0);
}

/// [`cube_step_matches_op_by_op_on_cubecl_cpu`] for `cases` (b, s, n, heads, head
/// size, temperature).
#[cfg(feature = "cpu")]
fn assert_cube_step_matches_op_by_op(cases: &[(usize, usize, usize, usize, usize, f64)]) {
    let _alone = crate::runtime::testing::one_cube_test_at_a_time();
    let device = Backend::Cpu.device().unwrap();
    for &(b, s, n, heads, head_dim, temperature) in cases {
        let case = StepCase {
            b,
            s,
            n,
            heads,
            head_dim,
            temperature,
        };
        assert_fused_matches_op_by_op_on(&device.clone().autodiff(), case);
    }
}

/// The context's tensors, each tracked, and each row's node and remaining capacity.
#[cfg(feature = "flex")]
struct ContextCase {
    fixed: Tensor<3>,
    nodes: Tensor<3>,
    capacity: Tensor<3>,
    last_node: Tensor<2, burn::tensor::Int>,
    remaining: Tensor<2>,
}

#[cfg(feature = "flex")]
impl ContextCase {
    fn new(device: &Device, [b, s, n, d]: [usize; 4]) -> Self {
        let tracked = |seed, shape: [usize; 3]| {
            let data = TensorData::new(pseudo_random(shape.iter().product(), seed, 1.5), shape);
            Tensor::<3>::from_data(data, device).require_grad()
        };
        // Rows share nodes (the depot most), as a decode's rows do.
        let last: Vec<i64> = (0..b * s)
            .map(|r| ((r * r) % (n + 2)).min(n - 1) as i64)
            .collect();
        let remaining: Vec<f32> = (0..b * s).map(|r| 1.0 - (r % 5) as f32 * 0.2).collect();
        Self {
            fixed: tracked(11, [b, 1, d]),
            nodes: tracked(12, [b, n, d]),
            capacity: tracked(13, [1, 1, d]),
            last_node: Tensor::from_data(TensorData::new(last, [b * s, 1]), device),
            remaining: Tensor::from_data(TensorData::new(remaining, [b * s, 1]), device),
        }
    }

    /// The queries `[B, S, d]` in Burn's operations, as `AttentionModel` composes them.
    fn queries(&self, s: usize) -> Tensor<3> {
        let [b, n, d] = self.nodes.dims();
        let offsets =
            Tensor::<1, burn::tensor::Int>::arange(0..(b * s) as i64, &self.nodes.device())
                .div_scalar(s as i64)
                .mul_scalar(n as i64);
        let rows = self.last_node.clone().reshape([b * s]) + offsets;
        let node_rows = self.nodes.clone().reshape([b * n, d]).select(0, rows);
        let step = node_rows.reshape([b, s, d])
            + self.remaining.clone().reshape([b, s, 1]) * self.capacity.clone();
        self.fixed.clone() + step
    }
}

/// The step's tables, mask and upstream gradient, the same for every form.
#[cfg(feature = "flex")]
struct TableCase {
    keys: Tensor<4>,
    values: Tensor<4>,
    logit_keys: Tensor<3>,
    mask: Tensor<2, Bool>,
    weights: Tensor<2>,
}

#[cfg(feature = "flex")]
impl TableCase {
    fn new(device: &Device, [b, s, n, heads, dk]: [usize; 5]) -> Self {
        let data = |seed, shape: Vec<usize>| {
            TensorData::new(pseudo_random(shape.iter().product(), seed, 1.5), shape)
        };
        let table = |seed| Tensor::<4>::from_data(data(seed, vec![b, n, heads, dk]), device);
        let logit_keys = Tensor::<3>::from_data(data(4, vec![b, n, heads * dk]), device);
        let mask = TensorData::new(step_masks(b * s, n), [b * s, n]);
        let weights = TensorData::new(pseudo_random(b * s * n, 5, 1.0), [b * s, n]);
        Self {
            keys: table(2).require_grad(),
            values: table(3).require_grad(),
            logit_keys: logit_keys.require_grad(),
            mask: Tensor::from_data(mask, device),
            weights: Tensor::from_data(weights, device),
        }
    }
}

/// The log-probabilities and the gradients of the context's and the tables' six float
/// tensors, from flex's step from the context (`form` 0), the fused step from the
/// composed queries (1), the op-by-op form from them (2), or flex's step from the context
/// with compatibility tables (3).
#[cfg(feature = "flex")]
fn context_step_outputs(device: &Device, t: &TableCase, s: usize, form: usize) -> Vec<Vec<f32>> {
    let [b, n, d] = t.logit_keys.dims();
    let case = ContextCase::new(device, [b, s, n, d]);
    let (k, v, l) = (t.keys.clone(), t.values.clone(), t.logit_keys.clone());
    let by_feature = keys_by_feature(&k, &v, &l);
    let (mask, clip) = (t.mask.clone(), TANH_CLIPPING);
    let contexts = [
        case.fixed.clone(),
        case.nodes.clone(),
        case.capacity.clone(),
    ];
    let log_probs = match form {
        0 | 3 => super::fused_step_on_flex_from_context(
            contexts.clone(),
            (case.last_node.clone(), case.remaining.clone()),
            (k.clone(), v, l),
            by_feature,
            mask,
            (form == 3).then(|| super::compat_tables(contexts, &k)),
            clip,
            1.0,
        ),
        1 => fused_step(case.queries(s), k, v, l, by_feature, mask, clip, 1.0),
        _ => op_by_op(
            case.queries(s),
            k,
            v,
            l,
            mask,
            clip,
            1.0,
            MatmulPrecision::High,
        ),
    };
    let loss = log_probs.clone().mask_fill(t.mask.clone(), 0.0) * t.weights.clone();
    let grads = loss.sum().backward();
    let read = |t: Tensor<1>| t.into_data().try_to_vec::<f32>().unwrap();
    let flat = |t: Tensor<3>| read(t.flatten(0, 2));
    let flat4 = |t: Tensor<4>| read(t.flatten(0, 3));
    vec![
        read(log_probs.flatten(0, 1)),
        flat(case.fixed.grad(&grads).unwrap()),
        flat(case.nodes.grad(&grads).unwrap()),
        flat(case.capacity.grad(&grads).unwrap()),
        flat4(t.keys.grad(&grads).unwrap()),
        flat4(t.values.grad(&grads).unwrap()),
        flat(t.logit_keys.grad(&grads).unwrap()),
    ]
}

/// Flex's step from the context against the queries composed in Burn's operations: the
/// same log-probabilities and gradients of all six float inputs, bit for bit, as the
/// fused step from those queries (so training takes the same numbers), and within 1e-5 of
/// the op-by-op form.
#[cfg(feature = "flex")]
#[test]
fn step_from_the_context_on_flex_matches_the_composed_queries() {
    let device = Backend::first_on_host().unwrap().device().unwrap();
    let device = device.autodiff();
    let (s, table) = (7, TableCase::new(&device, [3, 7, 21, 8, 16]));
    let [ours, fused, reference] = [0, 1, 2].map(|f| context_step_outputs(&device, &table, s, f));
    let names = [
        "log-probabilities",
        "fixed context",
        "node contexts",
        "capacity row",
    ];
    let names = names
        .iter()
        .chain(&["glimpse keys", "glimpse values", "logit keys"]);
    for ((name, ours), (fused, reference)) in names.zip(&ours).zip(fused.iter().zip(&reference)) {
        assert!(ours == fused, "{name}: not the composed queries' bits");
        assert_close_relative(name, ours, reference);
    }
}

/// Flex's step from the context with compatibility tables: the log-probabilities and the
/// gradients of all six float inputs (the context's and the keys' through the tables)
/// within 1e-5 of the op-by-op form, with several rows at each node, the depot's most.
#[cfg(feature = "flex")]
#[test]
fn step_from_compatibility_tables_matches_op_by_op() {
    let device = Backend::first_on_host().unwrap().device().unwrap();
    let device = device.autodiff();
    for (s, size) in [
        (7, [3, 7, 21, 8, 16]),
        (20, [2, 20, 21, 8, 16]),
        (5, [2, 5, 9, 2, 4]),
    ] {
        let table = TableCase::new(&device, size);
        let [ours, reference] = [3, 2].map(|f| context_step_outputs(&device, &table, s, f));
        let names = [
            "log-probabilities",
            "fixed context",
            "node contexts",
            "capacity row",
            "glimpse keys",
            "glimpse values",
            "logit keys",
        ];
        for ((name, ours), reference) in names.iter().zip(&ours).zip(&reference) {
            assert_close_relative(&format!("{name}, {size:?}"), ours, reference);
        }
    }
}
