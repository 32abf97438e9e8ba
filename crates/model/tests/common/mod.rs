#![allow(dead_code)]
//! Helpers shared by the model tests.

use burn::tensor::{Device, TensorData};
use routeburn_data::{Batch, Generator, GeneratorConfig, Instance, InstanceRng};
pub use routeburn_model::fixed_weights::fixed_weights;
use routeburn_model::{
    AttentionModelConfig, Backend, GraphEncoderConfig, Normalization, PointerNetworkConfig,
};

pub fn device() -> Device {
    Backend::first_on_host().unwrap().device().unwrap()
}

/// A small model: validity does not depend on size, and small models keep thousands of
/// decodes fast.
pub fn small_config(normalization: Normalization) -> AttentionModelConfig {
    AttentionModelConfig::new().with_encoder(
        GraphEncoderConfig::new()
            .with_embed_dim(16)
            .with_num_heads(2)
            .with_num_layers(1)
            .with_feed_forward_dim(32)
            .with_normalization(normalization),
    )
}

/// A small pointer network, for the same reason.
pub fn small_pointer_config() -> PointerNetworkConfig {
    PointerNetworkConfig::new().with_hidden_dim(16)
}

pub fn to_i64(data: TensorData) -> Vec<i64> {
    data.try_into_vec_as::<i64>().unwrap()
}

pub fn to_f32(data: TensorData) -> Vec<f32> {
    data.try_into_vec_as::<f32>().unwrap()
}

/// The instance families the validity tests sweep, for `n` customers.
pub fn instance_families(
    n: usize,
    count: usize,
    rng: &mut InstanceRng,
) -> Vec<(String, Vec<Instance>)> {
    let mut families = vec![];
    families.push((
        "kool".to_string(),
        Generator::uniform(n).sample_many(rng, count, "k"),
    ));
    // Every demand equals the capacity: one customer per route.
    let full: Vec<Instance> = Generator::uniform(n)
        .sample_many(rng, count, "f")
        .into_iter()
        .map(|i| {
            let c = i.coords();
            Instance::new("full", c[0], c[1..].to_vec(), vec![7; n], 7).unwrap()
        })
        .collect();
    families.push(("demand=capacity".into(), full));
    // Duplicated coordinates: customers share a handful of points, some on the depot.
    let dup: Vec<Instance> = (0..count)
        .map(|_| {
            let points: Vec<[f64; 2]> = (0..3).map(|_| [rng.unit(), rng.unit()]).collect();
            let depot = points[0];
            let customers = (0..n)
                .map(|_| points[rng.int_inclusive(0, 2) as usize])
                .collect();
            let demands = (0..n).map(|_| rng.int_inclusive(1, 9)).collect();
            Instance::new("dup", depot, customers, demands, 10).unwrap()
        })
        .collect();
    families.push(("duplicated coordinates".into(), dup));
    // Wide demand spread with a random capacity.
    let cap = rng.int_inclusive(1, 60);
    let wide = Generator::new(
        n,
        Some(cap),
        GeneratorConfig::Uniform {
            min_demand: 1,
            max_demand: cap,
        },
    )
    .unwrap()
    .sample_many(rng, count, "w");
    families.push(("random capacity".into(), wide));
    families
}

pub fn batch_of(instances: &[Instance]) -> Batch {
    Batch::from_instances(instances).unwrap()
}
