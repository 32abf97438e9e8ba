//! For both models, thousands of random instances (n = 1..=50, demands equal to capacity, single customers,
//! duplicated coordinates): every greedy, sampled and multi-start decode is a solution the
//! cost crate's validator accepts, and its batch cost equals the cost crate's cost of the
//! parsed solution.

mod common;

use burn::tensor::Transaction;
use common::*;
use routeburn_cost::{batch_costs, validate_batch, Euclidean, Solution};
use routeburn_data::InstanceRng;
use routeburn_model::{DecodeOptions, DeviceBatch, NoiseShape, Normalization, Policy};

#[test]
fn every_attention_model_decode_is_valid_and_costed_consistently() {
    let device = device();
    let mut rng = InstanceRng::new(2024);
    let mut decoded = 0usize;
    for (k, norm) in [
        Normalization::Batch,
        Normalization::Instance,
        Normalization::Layer,
    ]
    .into_iter()
    .enumerate()
    {
        let model = fixed_weights(small_config(norm).init(&device));
        // Spread n over the three normalisations: every n in 1..=50 is covered once.
        for n in (1..=50).filter(|n| n % 3 == k) {
            let count = if n <= 20 { 16 } else { 4 };
            decoded += check_decodes(&model, n, count, &mut rng);
        }
    }
    assert!(decoded > 5000, "decoded {decoded}");
}

#[test]
fn every_pointer_network_decode_is_valid_and_costed_consistently() {
    let device = device();
    let mut rng = InstanceRng::new(2025);
    let model = fixed_weights(small_pointer_config().init(&device));
    let mut decoded = 0usize;
    // Every small n, then a spread up to 50: the pointer network's decode loop is the
    // shared one, so this guards its inputs and masks rather than the loop again.
    for n in (1..=12).chain([15, 20, 30, 40, 50]) {
        let count = if n <= 20 { 4 } else { 1 };
        decoded += check_decodes(&model, n, count, &mut rng);
    }
    assert!(decoded > 500, "decoded {decoded}");
}

/// Every decode strategy: greedy and sampled, single and multi-start (from every customer
/// and from the first half of them).
fn strategies(n: usize) -> [(&'static str, DecodeOptions); 5] {
    [
        ("greedy", DecodeOptions::greedy()),
        ("sample", DecodeOptions::sample(1.0)),
        ("multistart", DecodeOptions::greedy().with_multi_start(true)),
        (
            "multistart-sample",
            DecodeOptions::sample(1.0)
                .with_multi_start(true)
                .with_check_every(1),
        ),
        (
            "fewer-starts-sample",
            DecodeOptions::sample(1.0)
                .with_multi_start(true)
                .with_starts(Some(n.div_ceil(2))),
        ),
    ]
}

/// Decodes `count` instances of every family with each strategy; checks every row with the
/// cost crate and returns the number of rows decoded.
fn check_decodes(model: &impl Policy, n: usize, count: usize, rng: &mut InstanceRng) -> usize {
    let device = device();
    let mut decoded = 0;
    for (family, instances) in instance_families(n, count, rng) {
        let batch = batch_of(&instances);
        for (name, options) in strategies(n) {
            let rows = options.rows_per_instance(n);
            let expected_rows = match options.starts {
                Some(starts) => starts,
                None => [1, n][usize::from(options.multi_start)],
            };
            assert_eq!(rows, expected_rows);
            let problem = DeviceBatch::upload(
                &batch,
                Some((
                    NoiseShape {
                        rows_per_instance: rows,
                    },
                    rng,
                )),
                &device,
            );
            let out = model.decode(&problem, &options);
            let [r, t] = out.actions.dims();
            assert_eq!(r, batch.size * rows);
            assert_eq!(out.rows_per_instance, rows);
            let [actions, ll] = Transaction::default()
                .register(out.actions)
                .register(out.log_likelihood)
                .execute()
                .try_into()
                .unwrap();
            let actions = to_i64(actions);
            let ll = to_f32(ll);
            assert!(ll.iter().all(|l| l.is_finite() && *l <= 1e-4), "{ll:?}");

            // Expand the batch's per-instance arrays to one per row.
            let expand = |v: &[u32], per: usize| -> Vec<u32> {
                v.chunks(per)
                    .flat_map(|c| std::iter::repeat_n(c, rows).flatten().copied())
                    .collect()
            };
            let nodes = n + 1;
            let demands = expand(&batch.node_demands, nodes);
            let caps = expand(&batch.capacities, 1);
            let coords: Vec<f32> = batch
                .coords
                .chunks(nodes * 2)
                .flat_map(|c| std::iter::repeat_n(c, rows).flatten().copied())
                .collect();
            validate_batch(&actions, t, &demands, &caps, nodes)
                .unwrap_or_else(|e| panic!("n={n} {family} {name}: {e}"));
            let costs = batch_costs(&actions, t, &coords, nodes).unwrap();
            for (row, cost) in costs.iter().enumerate() {
                let sol = Solution::from_actions(&actions[row * t..(row + 1) * t]).unwrap();
                let inst_coords = batch.instance_coords(row / rows);
                let expected = sol.cost(&Euclidean(&inst_coords));
                assert!((cost - expected).abs() < 1e-9, "{cost} vs {expected}");
                if options.multi_start {
                    assert_eq!(
                        actions[row * t] as usize,
                        row % rows + 1,
                        "forced first customer"
                    );
                }
            }
            decoded += r;
        }
    }
    decoded
}
