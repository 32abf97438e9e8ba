//! The model on every CPU backend compiled in (`cargo xtask bench` builds ndarray and
//! flex): uploading a batch, the encoder, one decode step, and encode + full greedy
//! decode of batch 512 at n = 20, 50 and 100. Throughput lines give instances per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use routeburn_data::{Generator, InstanceRng};
use routeburn_model::{AttentionModelConfig, Backend, CvrpState, DecodeOptions, DeviceBatch};

fn model(c: &mut Criterion) {
    // The heap settings `routeburn` itself runs with.
    routeburn_trainer::allocator::tune_for_tensors();
    for backend in Backend::compiled().into_iter().filter(|b| b.is_cpu()) {
        model_on(c, backend);
    }
}

fn model_on(c: &mut Criterion, backend: Backend) {
    let device = backend.device().unwrap();
    device.seed(0);
    let model = AttentionModelConfig::new().init(&device);
    let mut group = c.benchmark_group(format!("model-{backend}"));
    group.sample_size(10);
    for n in [20, 50, 100] {
        let b = 512;
        let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(n as u64), b);
        group.throughput(Throughput::Elements(b as u64));
        group.bench_function(format!("upload/{b}x{n}"), |bench| {
            bench.iter(|| {
                let problem = DeviceBatch::upload(&batch, None, &device);
                problem.coords.into_data()
            })
        });
        let problem = DeviceBatch::upload(&batch, None, &device);
        group.bench_function(format!("encoder/{b}x{n}"), |bench| {
            bench.iter(|| model.encode(&problem).into_data())
        });
        // The step at the depot with every customer open: the widest mask.
        let pre = model.precompute(model.encode(&problem), 1);
        let state = CvrpState::new(problem.demands.clone(), problem.capacity.clone());
        group.bench_function(format!("decode_step/{b}x{n}"), |bench| {
            bench.iter(|| {
                let mut next = state.clone();
                let log_p = model.step_log_probs(&pre, &next, 1.0); // [B, N]
                next.step(log_p.argmax(1));
                next.last_node().into_data()
            })
        });
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

criterion_group!(benches, model);
criterion_main!(benches);
