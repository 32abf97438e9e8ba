//! Host-side batch building: generating a batch in model layout, and batching existing
//! instances.

use criterion::{black_box, criterion_group, criterion_main, Criterion, Throughput};
use routeburn_data::{Batch, Generator, InstanceRng};

fn batch(c: &mut Criterion) {
    let mut group = c.benchmark_group("batch");
    for (b, n) in [(128, 10), (512, 100)] {
        let generator = Generator::uniform(n);
        group.throughput(Throughput::Elements(b as u64));
        group.bench_function(format!("generate/{b}x{n}"), |bench| {
            let mut rng = InstanceRng::new(1);
            bench.iter(|| generator.sample_batch(black_box(&mut rng), b))
        });
        let instances = generator.sample_many(&mut InstanceRng::new(2), b, "i");
        group.bench_function(format!("from_instances/{b}x{n}"), |bench| {
            bench.iter(|| Batch::from_instances(black_box(&instances)).unwrap())
        });
    }
    group.finish();
}

criterion_group!(benches, batch);
criterion_main!(benches);
