//! The scalar CPU evaluator: cost and validation of whole decoded batches.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use routeburn_benches::batch_with_actions;
use routeburn_cost::{batch_costs, validate_batch};

fn cost(c: &mut Criterion) {
    let mut group = c.benchmark_group("cost");
    for (b, n) in [(128, 10), (512, 20), (512, 100)] {
        let (batch, actions, steps) = batch_with_actions(b, n, 1);
        group.throughput(Throughput::Elements(b as u64));
        group.bench_function(format!("batch_costs/{b}x{n}"), |bench| {
            bench.iter(|| {
                batch_costs(black_box(&actions), steps, black_box(&batch.coords), n + 1).unwrap()
            })
        });
        group.bench_function(format!("validate_batch/{b}x{n}"), |bench| {
            bench.iter(|| {
                validate_batch(
                    black_box(&actions),
                    steps,
                    black_box(&batch.node_demands),
                    &batch.capacities,
                    n + 1,
                )
                .unwrap()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, cost);
criterion_main!(benches);
