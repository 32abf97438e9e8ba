//! One full REINFORCE training step (generate, upload, sampled decode, the baseline's
//! decode, download and cost, backward, clip, Adam) through the trainer itself, on every
//! CPU backend compiled in: with the rollout baseline for `tiny_1` (n = 10, batch 128) and
//! cvrp20 (n = 20, batch 512), and POMO's (multi-start from every customer, instance
//! norm) for cvrp20 at batch 64 (`configs/cvrp20_25min.toml`'s step).
//!
//! Each measurement is a real run of `train` with one epoch of `iters` batches; the time
//! reported is the sum of the step phases the trainer records, so the run's set-up,
//! validation and checkpoint are left out.

use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion, SamplingMode, Throughput};
use routeburn_model::Backend;
use routeburn_trainer::config::Config;
use routeburn_trainer::{train, TrainOptions};

fn config(n: usize, batch: usize, batches: u64, baseline: &str) -> Config {
    let normalization = if baseline == "pomo" {
        "instance"
    } else {
        "batch"
    };
    let text = format!(
        r#"
[problem]
n = {n}

[model]
kind = "attention"
normalization = "{normalization}"

[training]
epochs = 1
batch_size = {batch}
lr = 1e-4
max_grad_norm = 1.0
seed = 1234

[reinforce]
batches_per_epoch = {batches}
baseline = "{baseline}"
warmup_epochs = 0
baseline_eval_size = {batch}

[validation]
size = {batch}
batch_size = {batch}

[logging]
progress = false
summary = false
"#
    );
    Config::from_toml(&text, "train_step bench").expect("bench config")
}

fn train_step(c: &mut Criterion) {
    // The heap settings `routeburn` itself runs with.
    routeburn_trainer::allocator::tune_for_tensors();
    for backend in Backend::compiled()
        .into_iter()
        .filter(|b| b.traits().host_memory)
    {
        train_step_on(c, backend);
    }
}

fn train_step_on(c: &mut Criterion, backend: Backend) {
    let mut group = c.benchmark_group(format!("train_step-{backend}"));
    group.sample_size(10);
    group.sampling_mode(SamplingMode::Flat);
    group.measurement_time(Duration::from_secs(20));
    for (name, n, batch, baseline) in [
        ("tiny_1", 10, 128, "rollout"),
        ("cvrp20", 20, 512, "rollout"),
        ("cvrp20-pomo", 20, 64, "pomo"),
    ] {
        group.throughput(Throughput::Elements(batch as u64));
        group.bench_function(format!("{name}/{batch}x{n}"), |bench| {
            bench.iter_custom(|iters| {
                let run_dir = std::env::temp_dir()
                    .join(format!("routeburn-bench-{}-{name}", std::process::id()));
                let _ = std::fs::remove_dir_all(&run_dir);
                let summary = train(TrainOptions {
                    config: config(n, batch, iters, baseline),
                    run_dir: run_dir.clone(),
                    backend,
                    resume: false,
                    resume_from: None,
                    stop_after_epochs: None,
                    verbose: false,
                    config_dir: None,
                    init_weights: None,
                    validate_initial: false,
                    after_epoch: None,
                })
                .expect("training run");
                let _ = std::fs::remove_dir_all(&run_dir);
                Duration::from_secs_f64(summary.epochs[0].phases.step_seconds())
            })
        });
    }
    group.finish();
}

criterion_group!(benches, train_step);
criterion_main!(benches);
