//! Attention-model inference: encode + full greedy decode, batch 512, n = 20/50/100, on
//! the backend this bench was compiled for (`cargo xtask bench` runs ndarray and flex).
//! Criterion's throughput line gives instances per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use routeburn_data::{Generator, InstanceRng};
use routeburn_model::{AttentionModelConfig, Backend, DecodeOptions, DeviceBatch};

fn forward(c: &mut Criterion) {
    let backend = Backend::default_compiled().expect("a CPU backend");
    let device = backend.device().unwrap();
    device.seed(0);
    let model = AttentionModelConfig::new().init(&device);
    let mut group = c.benchmark_group(format!("model-{backend}"));
    group.sample_size(10);
    for n in [20, 50, 100] {
        let b = 512;
        let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(n as u64), b);
        group.throughput(Throughput::Elements(b as u64));
        group.bench_function(format!("greedy/{b}x{n}"), |bench| {
            bench.iter(|| {
                let problem = DeviceBatch::upload(&batch, None, &device);
                let out = model.decode(&problem, &DecodeOptions::greedy());
                out.actions.into_data()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, forward);
criterion_main!(benches);
