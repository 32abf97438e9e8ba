//! Shapes, masks, batch independence, seeded sampling and gradients; the pointer network's
//! teacher forcing and loss.

mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Int, Tensor, TensorData};
use common::*;
use routeburn_data::{label_instances, Generator, HeuristicConfig, InstanceRng};
use routeburn_model::{
    decode_chunk, decode_in_chunks, pointer_network_loss, AttentionModelConfig, CvrpState,
    DecodeOptions, DeviceBatch, NoiseShape, Normalization,
};

fn trim(row: &[i64]) -> Vec<i64> {
    let end = row.iter().rposition(|&a| a != 0).map_or(0, |p| p + 1);
    row[..end].to_vec()
}

#[test]
fn masks_follow_kools_rules() {
    let device = device();
    // One instance: capacity 5, demands 3, 2, 4 (customers 1..=3).
    let demands = Tensor::<2>::from_data(
        TensorData::new(vec![0.0f32, 3.0, 2.0, 4.0], [1, 4]),
        &device,
    );
    let capacity = Tensor::<2>::from_data(TensorData::new(vec![5.0f32], [1, 1]), &device);
    let mut state = CvrpState::new(demands, capacity);
    let mask = |s: &CvrpState| s.mask().into_data().try_into_vec_as::<bool>().unwrap();
    // At the start the depot is masked, every customer is open.
    assert_eq!(mask(&state), vec![true, false, false, false]);
    let go = |s: &mut CvrpState, node: i64| {
        s.step(Tensor::<2, Int>::from_data(
            TensorData::new(vec![node], [1, 1]),
            &device,
        ))
    };
    go(&mut state, 1); // load 3, remaining 2: customer 3 (4) too heavy.
    assert_eq!(mask(&state), vec![false, true, false, true]);
    go(&mut state, 2); // load 5, remaining 0: only the depot.
    assert_eq!(mask(&state), vec![false, true, true, true]);
    go(&mut state, 0); // back at the depot: depot masked since customer 3 is feasible.
    assert_eq!(mask(&state), vec![true, true, true, false]);
    assert!(
        !state
            .finished()
            .into_data()
            .try_into_vec_as::<bool>()
            .unwrap()[0]
    );
    go(&mut state, 3);
    assert!(
        state
            .finished()
            .into_data()
            .try_into_vec_as::<bool>()
            .unwrap()[0]
    );
    // Finished: only the depot, forever.
    assert_eq!(mask(&state), vec![false, true, true, true]);
    go(&mut state, 0);
    assert_eq!(mask(&state), vec![false, true, true, true]);
}

#[test]
fn greedy_alone_equals_greedy_in_batch() {
    let device = device();
    for norm in [
        Normalization::Batch,
        Normalization::Instance,
        Normalization::Layer,
    ] {
        let model = fixed_weights(small_config(norm).init(&device));
        let instances = Generator::uniform(12).sample_many(&mut InstanceRng::new(9), 16, "a");
        let batch = batch_of(&instances);
        let out = model.decode(
            &DeviceBatch::upload(&batch, None, &device),
            &DecodeOptions::greedy(),
        );
        let [_, t] = out.actions.dims();
        let all = to_i64(out.actions.into_data());
        for (i, inst) in instances.iter().enumerate() {
            let alone = model.decode(
                &DeviceBatch::upload(&batch_of(std::slice::from_ref(inst)), None, &device),
                &DecodeOptions::greedy(),
            );
            let alone = to_i64(alone.actions.into_data());
            assert_eq!(
                trim(&alone),
                trim(&all[i * t..(i + 1) * t]),
                "{norm:?} instance {i}"
            );
        }
    }
}

/// Decoding in chunks (as evaluation does on the CPU) gives every row the tour the whole
/// batch gives it: greedy, sampled (each chunk reads its own rows of the noise) and
/// multi-start, in chunks of unequal sizes.
#[test]
fn chunked_decode_equals_whole_batch() {
    let device = device();
    let model = fixed_weights(small_config(Normalization::Batch).init(&device));
    let batch = Generator::uniform(9).sample_batch(&mut InstanceRng::new(4), 16);
    for options in [
        DecodeOptions::greedy(),
        DecodeOptions::sample(1.0),
        DecodeOptions::greedy().with_multi_start(true),
    ] {
        let noise = NoiseShape {
            rows_per_instance: options.rows_per_instance(9),
        };
        let problem = DeviceBatch::upload(&batch, Some((noise, &mut InstanceRng::new(8))), &device);
        let whole = model.decode(&problem, &options).actions;
        let [rows, t] = whole.dims();
        let whole = to_i64(whole.into_data());
        let chunks = decode_in_chunks(&model, &problem, 0..16, &options, 6);
        let sizes: Vec<usize> = chunks.iter().map(|c| c.dims()[0]).collect();
        let starts = options.rows_per_instance(9);
        assert_eq!(
            sizes,
            [6 * starts, 5 * starts, 5 * starts],
            "16 instances, 6 at most"
        );
        let mut row = 0;
        for chunk in chunks {
            let [r, ct] = chunk.dims();
            let actions = to_i64(chunk.into_data());
            for k in 0..r {
                assert_eq!(
                    trim(&actions[k * ct..(k + 1) * ct]),
                    trim(&whole[(row + k) * t..(row + k + 1) * t]),
                    "{options:?}, row {}",
                    row + k
                );
            }
            row += r;
        }
        assert_eq!(row, rows);
    }
    // On the CPU a CVRP100 chunk's keys take about 8 MiB: 54 instances of 155 kB.
    assert_eq!(decode_chunk(&device, 101), 54);
}

#[test]
fn same_seed_same_samples() {
    let device = device();
    let model = fixed_weights(small_config(Normalization::Batch).init(&device));
    let batch = Generator::uniform(20).sample_batch(&mut InstanceRng::new(1), 32);
    let sample = |seed| {
        let mut rng = InstanceRng::new(seed);
        let p = DeviceBatch::upload(
            &batch,
            Some((
                NoiseShape {
                    rows_per_instance: 1,
                },
                &mut rng,
            )),
            &device,
        );
        to_i64(
            model
                .decode(&p, &DecodeOptions::sample(1.0))
                .actions
                .into_data(),
        )
    };
    assert_eq!(sample(5), sample(5));
    assert_ne!(sample(5), sample(6));
}

/// `follow` scores given tours: a sampled decode's tours get that decode's
/// log-likelihood, and a tour built on the host (customers in index order, back to the
/// depot when the next does not fit) gets the sum of its nodes' log-probabilities, stepped
/// here one node at a time.
#[test]
fn follow_scores_given_tours() {
    let device = device();
    let model = fixed_weights(small_config(Normalization::Batch).init(&device));
    let (b, n) = (6, 8);
    let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(21), b);
    let noise = NoiseShape {
        rows_per_instance: 1,
    };
    let problem = DeviceBatch::upload(&batch, Some((noise, &mut InstanceRng::new(3))), &device);
    let sampled = model.decode(&problem, &DecodeOptions::sample(1.0));
    let followed = model.follow(&problem, &sampled.actions);
    assert_eq!(
        to_i64(followed.actions.into_data()),
        to_i64(sampled.actions.into_data())
    );
    let (ours, theirs) = (
        to_f32(followed.log_likelihood.into_data()),
        to_f32(sampled.log_likelihood.into_data()),
    );
    for (i, (a, e)) in ours.iter().zip(&theirs).enumerate() {
        assert!(
            (a - e).abs() <= 1e-5 * e.abs().max(1.0),
            "instance {i}: {a} vs {e}"
        );
    }

    let nodes = n + 1;
    let tours: Vec<Vec<i64>> = (0..b).map(|i| in_index_order(&batch, i)).collect();
    let len = tours.iter().map(Vec::len).max().unwrap();
    let padded: Vec<i64> = tours
        .iter()
        .flat_map(|t| t.iter().copied().chain(std::iter::repeat(0)).take(len))
        .collect();
    let tours_tensor =
        Tensor::<2, Int>::from_data(TensorData::new(padded.clone(), [b, len]), &device);
    let scored = to_f32(
        model
            .follow(&problem, &tours_tensor)
            .log_likelihood
            .into_data(),
    );

    let pre = model.precompute(model.encode(&problem), 1);
    let mut state = CvrpState::new(problem.demands.clone(), problem.capacity.clone());
    let mut expected = vec![0.0f64; b];
    for step in 0..len {
        let log_p = to_f32(model.step_log_probs(&pre, &state, 1.0).into_data()); // [B, N]
        let action: Vec<i64> = (0..b).map(|i| padded[i * len + step]).collect();
        for (i, &a) in action.iter().enumerate() {
            let p = log_p[i * nodes + a as usize];
            // Past its tour's end an instance sits at the depot with probability 1.
            if step < tours[i].len() {
                expected[i] += p as f64;
            } else {
                assert_eq!(p, 0.0, "instance {i} finished");
            }
        }
        state.step(Tensor::<2, Int>::from_data(
            TensorData::new(action, [b, 1]),
            &device,
        ));
    }
    for (i, (a, e)) in scored.iter().zip(&expected).enumerate() {
        assert!(a.is_finite(), "instance {i}: a feasible tour");
        assert!(
            (*a as f64 - e).abs() <= 1e-4 * e.abs().max(1.0),
            "instance {i}: {a} vs {e}"
        );
    }
}

/// Instance `i`'s customers in index order, back to the depot when the next does not fit.
fn in_index_order(batch: &routeburn_data::Batch, i: usize) -> Vec<i64> {
    let nodes = batch.n + 1;
    let (demands, capacity) = (
        &batch.node_demands[i * nodes..(i + 1) * nodes],
        batch.capacities[i],
    );
    let (mut tour, mut load) = (Vec::new(), 0);
    for (c, &demand) in demands.iter().enumerate().skip(1) {
        if load + demand > capacity {
            tour.push(0);
            load = 0;
        }
        tour.push(c as i64);
        load += demand;
    }
    tour
}

#[test]
fn default_model_shapes() {
    let device = device();
    let model = fixed_weights(AttentionModelConfig::new().init(&device));
    let batch = Generator::uniform(10).sample_batch(&mut InstanceRng::new(3), 4);
    let out = model.decode(
        &DeviceBatch::upload(&batch, None, &device),
        &DecodeOptions::greedy(),
    );
    let [b, t] = out.actions.dims();
    assert_eq!(b, 4);
    assert!((10..=20).contains(&t), "{t}");
    assert_eq!(out.log_likelihood.dims(), [4]);
}

/// Collects the gradient norm of every float parameter.
struct GradCheck<'a> {
    grads: &'a burn::optim::GradientsParams,
    seen: usize,
    bad: Vec<String>,
}

impl ModuleVisitor for GradCheck<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        // BatchNorm's running statistics are visited too, but are not trained.
        if !param.val().is_require_grad() {
            return;
        }
        self.seen += 1;
        match self.grads.get::<D>(param.id) {
            None => self.bad.push(format!("{:?}: no gradient", param.id)),
            Some(g) => {
                let v: Vec<f32> = to_f32(g.into_data());
                let finite = v.iter().all(|x| x.is_finite());
                let nonzero = v.iter().any(|&x| x != 0.0);
                if !(finite && nonzero) {
                    self.bad.push(format!(
                        "{:?} {:?}: finite={finite} nonzero={nonzero}",
                        param.id,
                        param.shape()
                    ));
                }
            }
        }
    }
}

#[test]
fn every_parameter_gets_a_gradient() {
    let device = device().autodiff();
    for norm in [
        Normalization::Batch,
        Normalization::Instance,
        Normalization::Layer,
    ] {
        let model = fixed_weights(small_config(norm).init(&device));
        let batch = Generator::uniform(10).sample_batch(&mut InstanceRng::new(4), 16);
        let mut rng = InstanceRng::new(8);
        let problem = DeviceBatch::upload(
            &batch,
            Some((
                NoiseShape {
                    rows_per_instance: 1,
                },
                &mut rng,
            )),
            &device,
        );
        let out = model.decode(&problem, &DecodeOptions::sample(1.0));
        // REINFORCE: (cost - baseline) * log-likelihood, with made-up non-zero advantages.
        let advantage = Tensor::<1>::from_data(
            TensorData::new((0..16).map(|i| i as f32 - 7.5).collect::<Vec<_>>(), [16]),
            &device,
        );
        let loss = (advantage * out.log_likelihood).mean();
        let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &model);
        let mut check = GradCheck {
            grads: &grads,
            seen: 0,
            bad: vec![],
        };
        model.visit(&mut check);
        assert!(check.seen > 10);
        assert!(check.bad.is_empty(), "{norm:?}: {:?}", check.bad);
    }
}

/// The teacher-forced pass and the free-running decode are two code paths through the
/// pointer network: fed the greedy decode's own tours, the first must give back the
/// second's log-likelihood, and the loss must be their mean negative log-probability.
#[test]
fn pointer_network_teacher_forcing_reproduces_its_greedy_decode() {
    let device = device();
    let model = fixed_weights(small_pointer_config().init(&device));
    let batch = Generator::uniform(10).sample_batch(&mut InstanceRng::new(11), 8);
    let problem = DeviceBatch::upload(&batch, None, &device);
    let out = model.decode(&problem, &DecodeOptions::greedy());
    let [b, t] = out.actions.dims();
    let log_probs = model.teacher_forced(&problem, out.actions.clone(), &vec![true; t]);
    let n = batch.num_nodes();
    assert_eq!(log_probs.dims(), [b, t, n]);

    let actions = to_i64(out.actions.clone().into_data());
    let lp = to_f32(log_probs.clone().into_data());
    let ll = to_f32(out.log_likelihood.into_data());
    let mut total = 0.0f64;
    for row in 0..b {
        let mut sum = 0.0f64;
        for step in 0..t {
            let a = actions[row * t + step] as usize;
            sum += lp[(row * t + step) * n + a] as f64;
        }
        assert!(
            (sum - ll[row] as f64).abs() < 1e-4,
            "row {row}: teacher-forced {sum} vs decode {}",
            ll[row]
        );
        total += sum;
    }
    let valid = Tensor::<2>::ones([b, t], &device).bool();
    let loss = pointer_network_loss(log_probs, out.actions, valid).into_scalar::<f32>();
    let by_hand = -total / (b * t) as f64;
    assert!((loss as f64 - by_hand).abs() < 1e-5, "{loss} vs {by_hand}");
}

#[test]
fn pointer_network_loss_ignores_padding_even_at_minus_infinity() {
    let device = device();
    let ln = |p: f32| p.ln();
    // One tour of 2 real steps and 1 padded step whose target is masked (−∞).
    let log_probs = Tensor::<3>::from_data(
        TensorData::new(
            vec![ln(0.25), ln(0.75), ln(0.5), ln(0.5), 0.0, f32::NEG_INFINITY],
            [1, 3, 2],
        ),
        &device,
    );
    let targets = Tensor::<2, Int>::from_data(TensorData::new(vec![1i64, 0, 1], [1, 3]), &device);
    let valid = Tensor::<2>::from_data(TensorData::new(vec![1.0f32, 1.0, 0.0], [1, 3]), &device)
        .greater_elem(0.5);
    let loss = pointer_network_loss(log_probs, targets, valid).into_scalar::<f32>();
    let by_hand = -(0.75f32.ln() + 0.5f32.ln()) / 2.0;
    assert!((loss - by_hand).abs() < 1e-6, "{loss} vs {by_hand}");
}

#[test]
fn pointer_network_parameters_all_get_gradients_from_heuristic_labels() {
    let device = device().autodiff();
    let model = fixed_weights(small_pointer_config().init(&device));
    let instances = Generator::uniform(8).sample_many(&mut InstanceRng::new(5), 12, "g");
    let labels = label_instances(&instances, &HeuristicConfig::default(), &|_| {});
    let targets: Vec<Vec<i64>> = labels
        .iter()
        .map(|r| r.reference_routes.as_ref().unwrap().to_actions(0))
        .collect();
    let batch = batch_of(&instances);
    let (problem, target) = DeviceBatch::upload_with_targets(&batch, &targets, &device);
    let [_, t] = target.targets.dims();
    assert_eq!(t, targets.iter().map(Vec::len).max().unwrap());
    // Half the steps fed the network's own choice: both decoder inputs get exercised.
    let teacher: Vec<bool> = (0..t).map(|i| i % 2 == 0).collect();
    let log_probs = model.teacher_forced(&problem, target.targets.clone(), &teacher);
    let loss = pointer_network_loss(log_probs, target.targets, target.valid);
    let value = loss.clone().into_scalar::<f32>();
    assert!(
        value.is_finite() && value > 0.0,
        "every label is feasible under the masks: loss {value}"
    );
    let grads = burn::optim::GradientsParams::from_grads(loss.backward(), &model);
    let mut check = GradCheck {
        grads: &grads,
        seen: 0,
        bad: vec![],
    };
    model.visit(&mut check);
    assert!(check.seen > 10);
    assert!(check.bad.is_empty(), "{:?}", check.bad);
}
