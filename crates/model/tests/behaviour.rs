//! Shapes, masks, batch independence, seeded sampling and gradients.

mod common;

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::{Int, Tensor, TensorData};
use common::*;
use routeburn_data::{Generator, InstanceRng};
use routeburn_model::{
    AttentionModelConfig, CvrpState, DecodeOptions, DeviceBatch, NoiseShape, Normalization,
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
        let model = small_config(norm).init(&device);
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

#[test]
fn same_seed_same_samples() {
    let device = device();
    let model = small_config(Normalization::Batch).init(&device);
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

#[test]
fn default_model_shapes() {
    let device = device();
    let model = AttentionModelConfig::new().init(&device);
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
        let model = small_config(norm).init(&device);
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
