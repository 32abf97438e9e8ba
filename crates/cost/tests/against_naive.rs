//! Property tests: the optimised evaluator and validator against deliberately naive
//! implementations written here from the definitions.

use proptest::prelude::*;
use routeburn_cost::*;

/// Naive cost: materialise the full node sequence with explicit depot visits.
fn naive_cost(routes: &[Vec<u32>], coords: &[[f64; 2]]) -> f64 {
    let mut total = 0.0;
    for r in routes {
        let mut path = vec![0usize];
        path.extend(r.iter().map(|&c| c as usize));
        path.push(0);
        for w in path.windows(2) {
            let (a, b) = (coords[w[0]], coords[w[1]]);
            total += ((a[0] - b[0]).powi(2) + (a[1] - b[1]).powi(2)).sqrt();
        }
    }
    total
}

/// Naive feasibility: count visits per customer, sum loads per route.
fn naive_feasible(routes: &[Vec<u32>], demands: &[u32], capacity: u32) -> bool {
    let n = demands.len() - 1;
    let mut count = vec![0; n + 1];
    for r in routes {
        if r.is_empty() {
            return false;
        }
        let mut load = 0u64;
        for &c in r {
            if c == 0 || c as usize > n {
                return false;
            }
            count[c as usize] += 1;
            load += demands[c as usize] as u64;
        }
        if load > capacity as u64 {
            return false;
        }
    }
    count[1..].iter().all(|&k| k == 1)
}

/// An instance and a random permutation of its customers cut into routes.
fn instance_and_routes() -> impl Strategy<Value = (Vec<[f64; 2]>, Vec<u32>, Vec<Vec<u32>>)> {
    (1usize..40).prop_flat_map(|n| {
        (
            prop::collection::vec([0.0f64..1.0, 0.0f64..1.0], n + 1),
            prop::collection::vec(1u32..10, n),
            Just((1..=n as u32).collect::<Vec<_>>()).prop_shuffle(),
            prop::collection::vec(any::<bool>(), n),
        )
            .prop_map(|(coords, d, perm, cuts)| {
                let mut routes = vec![];
                let mut cur = vec![];
                for (c, cut) in perm.into_iter().zip(cuts) {
                    cur.push(c);
                    if cut {
                        routes.push(std::mem::take(&mut cur));
                    }
                }
                if !cur.is_empty() {
                    routes.push(cur);
                }
                let mut demands = vec![0];
                demands.extend(d);
                (coords, demands, routes)
            })
    })
}

/// A mutation that may break feasibility.
#[derive(Debug, Clone)]
enum Mutation {
    None,
    Drop { route: usize, pos: usize },
    Duplicate { route: usize, pos: usize },
    OutOfRange { route: usize, value: u32 },
    EmptyRoute,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        Just(Mutation::None),
        (any::<usize>(), any::<usize>()).prop_map(|(route, pos)| Mutation::Drop { route, pos }),
        (any::<usize>(), any::<usize>())
            .prop_map(|(route, pos)| Mutation::Duplicate { route, pos }),
        (any::<usize>(), prop_oneof![Just(0u32), 40u32..100])
            .prop_map(|(route, value)| Mutation::OutOfRange { route, value }),
        Just(Mutation::EmptyRoute),
    ]
}

fn apply(routes: &mut Vec<Vec<u32>>, m: &Mutation) {
    let nr = routes.len();
    match *m {
        Mutation::None => {}
        Mutation::Drop { route, pos } => {
            let r = &mut routes[route % nr];
            let p = pos % r.len();
            r.remove(p);
            if r.is_empty() {
                routes.remove(route % nr);
            }
        }
        Mutation::Duplicate { route, pos } => {
            let c = routes[route % nr][pos % routes[route % nr].len()];
            routes[(route + 1) % nr].push(c);
        }
        Mutation::OutOfRange { route, value } => routes[route % nr].push(value),
        Mutation::EmptyRoute => routes.push(vec![]),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn cost_matches_naive((coords, _d, routes) in instance_and_routes()) {
        let s = Solution::new(routes.clone());
        let expected = naive_cost(&routes, &coords);
        prop_assert!((s.cost(&Euclidean(&coords)) - expected).abs() < 1e-9);
        let matrix = DistanceMatrix::from_fn(coords.len(), |i, j| Euclidean(&coords).dist(i, j));
        prop_assert!((s.cost(&matrix) - expected).abs() < 1e-9);

        // Batch path: two copies of the instance, one padded further than the other.
        let steps = s.to_actions(0).len() + 3;
        let mut actions = s.to_actions(steps);
        actions.extend(s.to_actions(steps));
        let flat: Vec<f32> = coords.iter().chain(coords.iter()).flat_map(|p| [p[0] as f32, p[1] as f32]).collect();
        let f32_coords: Vec<[f64; 2]> = coords.iter().map(|p| [p[0] as f32 as f64, p[1] as f32 as f64]).collect();
        let expected32 = naive_cost(&routes, &f32_coords);
        for c in batch_costs(&actions, steps, &flat, coords.len()).unwrap() {
            prop_assert!((c - expected32).abs() < 1e-9, "{} vs {}", c, expected32);
        }
    }

    #[test]
    fn validator_agrees_with_naive(
        (_coords, demands, mut routes) in instance_and_routes(),
        m in mutation(),
        capacity in 1u32..60,
    ) {
        apply(&mut routes, &m);
        let s = Solution::new(routes.clone());
        let expected = naive_feasible(&routes, &demands, capacity);
        prop_assert_eq!(validate(&s, &demands, capacity).is_ok(), expected);
        // The action form cannot express an empty route or a customer 0 inside a route.
        let expressible = routes.iter().all(|r| !r.is_empty() && !r.contains(&0));
        if expressible {
            let actions = s.to_actions(0);
            prop_assert_eq!(validate_actions(&actions, &demands, capacity).is_ok(), expected);
            prop_assert_eq!(Solution::from_actions(&actions).unwrap(), s);
        }
    }
}
