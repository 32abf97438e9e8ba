//! The model on every CPU backend compiled in (`cargo xtask bench` builds ndarray and
//! flex): uploading a batch, the encoder, one decode step, and encode + full greedy
//! decode of batch 512 at n = 20, 50 and 100, whole and in cache-sized chunks (as `eval`
//! decodes). Throughput lines give instances per second.
//! And on flex with autodiff, a POMO training decode and its backward (batch 64 × 20
//! starts, n = 20, d = 128): the fused decoder step against Burn's ops one by one; and
//! the encoder's forward and backward (`tiny_1`'s batch 128 at n = 10, batch 64 at
//! n = 100): the fused attention core against Burn's ops one by one.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use routeburn_data::{Generator, InstanceRng};
use routeburn_model::{
    decode_chunk, decode_in_chunks, AttentionModelConfig, Backend, CvrpState, DecodeOptions,
    DeviceBatch, GraphEncoderConfig, NoiseShape, Normalization, StepKernel,
};

fn model(c: &mut Criterion) {
    // The heap settings `routeburn` itself runs with.
    routeburn_trainer::allocator::tune_for_tensors();
    for backend in Backend::compiled()
        .into_iter()
        .filter(|b| b.traits().host_memory)
    {
        model_on(c, backend);
    }
    if Backend::Flex.is_compiled() {
        pomo_decode(c);
        encoder_training(c);
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
        // As `routeburn eval` decodes: in chunks whose keys fit in the cache.
        let chunk = decode_chunk(&device, n + 1);
        group.bench_function(format!("greedy_chunked/{b}x{n}"), |bench| {
            bench.iter(|| {
                let problem = DeviceBatch::upload(&batch, None, &device);
                let parts =
                    decode_in_chunks(&model, &problem, 0..b, &DecodeOptions::greedy(), chunk);
                parts.into_iter().map(|a| a.into_data()).collect::<Vec<_>>()
            })
        });
    }
    group.finish();
}

/// A POMO training decode (multi-start from every customer, sampled) and its backward,
/// in each form of the decoder step; the encoder's share is the same in both.
fn pomo_decode(c: &mut Criterion) {
    let device = Backend::Flex.device().unwrap().autodiff();
    device.seed(0);
    let (b, n) = (64, 20);
    let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(7), b);
    let noise = NoiseShape {
        rows_per_instance: n,
    };
    let problem = DeviceBatch::upload(&batch, Some((noise, &mut InstanceRng::new(8))), &device);
    let sampling = DecodeOptions::sample(1.0).with_multi_start(true);
    let mut group = c.benchmark_group("pomo_decode-flex-autodiff");
    group.sample_size(10);
    group.throughput(Throughput::Elements(b as u64));
    for (name, kernel) in [
        ("fused", StepKernel::Fused),
        ("op-by-op", StepKernel::OpByOp),
    ] {
        let model = AttentionModelConfig::new()
            .with_decoder_step(kernel)
            .init(&device);
        group.bench_function(format!("{name}/{b}x{n}"), |bench| {
            bench.iter(|| {
                let out = model.decode(&problem, &sampling);
                out.log_likelihood.sum().backward()
            })
        });
    }
    group.finish();
}

/// The encoder's forward and backward, with its attention core fused and op by op.
fn encoder_training(c: &mut Criterion) {
    let device = Backend::Flex.device().unwrap().autodiff();
    device.seed(0);
    let mut group = c.benchmark_group("encoder_training-flex-autodiff");
    group.sample_size(10);
    for (b, n) in [(128, 10), (64, 100)] {
        let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(9), b);
        let problem = DeviceBatch::upload(&batch, None, &device);
        group.throughput(Throughput::Elements(b as u64));
        for (name, kernel) in [
            ("fused", StepKernel::Fused),
            ("op-by-op", StepKernel::OpByOp),
        ] {
            let encoder = GraphEncoderConfig::new().with_encoder_attention(kernel);
            let model = AttentionModelConfig::new()
                .with_encoder(encoder)
                .init(&device);
            group.bench_function(format!("{name}/{b}x{n}"), |bench| {
                bench.iter(|| model.encode(&problem).sum().backward())
            });
        }
    }
    // POMO's encoder (instance norm) at the 25-minute recipe's CVRP20 batch.
    let (b, n) = (64, 20);
    let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(9), b);
    let problem = DeviceBatch::upload(&batch, None, &device);
    let encoder = GraphEncoderConfig::new().with_normalization(Normalization::Instance);
    let model = AttentionModelConfig::new()
        .with_encoder(encoder)
        .init(&device);
    group.throughput(Throughput::Elements(b as u64));
    group.bench_function(format!("instance-norm/{b}x{n}"), |bench| {
        bench.iter(|| model.encode(&problem).sum().backward())
    });
    group.finish();
}

criterion_group!(benches, model);
criterion_main!(benches);
