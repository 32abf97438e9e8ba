//! The labelling heuristic against independent references: a strong solver's costs on the
//! cvrp20 validation set, CVRPLIB optima, brute force on tiny instances; and the canonical
//! label order on hand-made cases.

use std::path::PathBuf;

use routeburn_cost::{Metric, Solution};
use routeburn_data::heuristic::solve;
use routeburn_data::{
    canonical, label_instances, read_jsonl, read_sol, read_vrp, Generator, HeuristicConfig,
    Instance, InstanceRng,
};

fn data_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data")
}

#[test]
fn within_three_percent_of_the_reference_solver_on_cvrp20() {
    let records = read_jsonl(data_dir().join("validation/cvrp20.jsonl")).unwrap();
    let instances: Vec<Instance> = records.iter().map(|r| r.instance.clone()).collect();
    let labels = label_instances(&instances, &HeuristicConfig::default(), &|_| {});
    let mut gap_sum = 0.0;
    for (label, reference) in labels.iter().zip(&records) {
        let routes = label.reference_routes.as_ref().unwrap();
        let cost = reference.instance.cost(routes, Metric::Exact).unwrap();
        assert!((cost - label.reference_cost.unwrap()).abs() < 1e-9);
        gap_sum += cost / reference.reference_cost.unwrap() - 1.0;
    }
    let gap = 100.0 * gap_sum / records.len() as f64;
    eprintln!("heuristic mean gap on cvrp20: {gap:.3}%");
    assert!(gap < 3.0, "mean gap {gap:.3}% ≥ 3%");
    assert!(
        gap > -0.5,
        "better than the reference solver by {gap:.3}%? suspicious"
    );
}

#[test]
fn close_to_cvrplib_optima() {
    for (set, name, optimum) in [
        ("P", "P-n16-k8", 450.0),
        ("P", "P-n19-k2", 212.0),
        ("P", "P-n20-k2", 216.0),
        ("P", "P-n23-k8", 529.0),
        ("E", "E-n13-k4", 247.0),
        ("A", "A-n32-k5", 784.0),
    ] {
        let dir = data_dir().join("cvrplib").join(set);
        let instance = read_vrp(dir.join(format!("{name}.vrp"))).unwrap();
        assert_eq!(
            read_sol(dir.join(format!("{name}.sol"))).unwrap().cost,
            Some(optimum)
        );
        let solution = solve(&instance, &HeuristicConfig::default());
        let cost = instance.cost(&solution, Metric::Cvrplib).unwrap();
        assert!(
            cost >= optimum,
            "{name}: {cost} below the optimum {optimum}"
        );
        assert!(
            cost <= optimum * 1.03,
            "{name}: {cost} vs optimum {optimum}"
        );
    }
}

/// The optimum by brute force: every permutation of the customers, split optimally into
/// capacity-feasible consecutive routes.
fn brute_force(instance: &Instance) -> f64 {
    fn permute(items: &mut Vec<u32>, k: usize, f: &mut dyn FnMut(&[u32])) {
        if k == items.len() {
            f(items);
            return;
        }
        for i in k..items.len() {
            items.swap(k, i);
            permute(items, k + 1, f);
            items.swap(k, i);
        }
    }
    let n = instance.n();
    let mut best = f64::INFINITY;
    let mut customers: Vec<u32> = (1..=n as u32).collect();
    permute(&mut customers, 0, &mut |order| {
        // Each of the n − 1 gaps either splits a route or not.
        for splits in 0u32..(1 << (n - 1)) {
            let mut routes = vec![vec![order[0]]];
            for (k, &c) in order.iter().enumerate().skip(1) {
                if splits & (1 << (k - 1)) != 0 {
                    routes.push(vec![]);
                }
                routes.last_mut().unwrap().push(c);
            }
            if let Ok(cost) = instance.cost(&Solution::new(routes), Metric::Exact) {
                best = best.min(cost);
            }
        }
    });
    best
}

#[test]
fn optimal_on_tiny_instances() {
    let mut rng = InstanceRng::new(7);
    for n in 1..=6 {
        let generator = Generator::uniform(n);
        for i in 0..8 {
            let instance = generator.sample(&mut rng, format!("tiny{n}_{i}"));
            let solution = solve(&instance, &HeuristicConfig::default());
            let cost = instance.cost(&solution, Metric::Exact).unwrap();
            let optimum = brute_force(&instance);
            assert!(
                cost <= optimum + 1e-9,
                "n={n} #{i}: heuristic {cost} vs optimum {optimum}"
            );
        }
    }
}

#[test]
fn deterministic_and_independent_of_threads() {
    let generator = Generator::uniform(20);
    let instances = generator.sample_many(&mut InstanceRng::new(3), 16, "d");
    let config = HeuristicConfig::default();
    let a = label_instances(&instances, &config, &|_| {});
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let b = pool.install(|| label_instances(&instances, &config, &|_| {}));
    assert_eq!(a, b);
}

#[test]
fn canonical_order_is_a_counterclockwise_sweep() {
    // Depot at the origin; customers at the four compass points and two more.
    let instance = Instance::new(
        "compass",
        [0.5, 0.5],
        vec![
            [0.9, 0.5], // 1 east
            [0.5, 0.9], // 2 north
            [0.1, 0.5], // 3 west
            [0.5, 0.1], // 4 south
            [0.8, 0.8], // 5 north-east
            [0.2, 0.2], // 6 south-west
        ],
        vec![1; 6],
        3,
    )
    .unwrap();
    // Route {1, 5, 2} (north-east) given clockwise, route {3, 6, 4} (south-west) given
    // clockwise too, listed north-east first.
    let given = Solution::new(vec![vec![2, 5, 1], vec![4, 6, 3]]);
    let label = canonical(&instance, &given);
    // South-west centroid has angle −3π/4, north-east +π/4: south-west comes first; both
    // travel counterclockwise: west → south-west → south, east → north-east → north.
    assert_eq!(label.routes, vec![vec![3, 6, 4], vec![1, 5, 2]]);
    // Canonical form is a fixed point and keeps the cost.
    assert_eq!(canonical(&instance, &label), label);
    let c = |s: &Solution| instance.cost(s, Metric::Exact).unwrap();
    assert!((c(&label) - c(&given)).abs() < 1e-12);
    // A single-customer route has no area: it stays as it is.
    let single = Solution::new(vec![vec![4], vec![1, 2, 3, 5, 6]]);
    assert_eq!(canonical(&instance, &single).routes[0], vec![4]);
}
