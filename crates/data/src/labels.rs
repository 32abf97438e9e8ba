//! Supervised labels: a good solution for each training instance, in canonical order.
//!
//! A pointer network learns to emit a solution one node at a time, so the order of the
//! routes and the direction of each route are part of the target. Both are fixed by the
//! geometry, the same way for every instance, so the network can learn them:
//!
//! - **Direction.** Each route is travelled counterclockwise around the depot: the
//!   polygon depot → route → depot has a positive signed (shoelace) area. A route with no
//!   area (one customer, or all collinear with the depot) starts at its lower-numbered end.
//! - **Order.** Routes are sorted by the polar angle, around the depot, of the centroid of
//!   their customers, from −π up to π; ties go to the route holding the lower-numbered
//!   customer.
//!
//! Together this is a counterclockwise sweep starting due west of the depot. Instances
//! without coordinates (explicit distance matrices) fall back to index order: routes by
//! their lowest customer, each starting at its lower-numbered end.
//!
//! Labels are written as a JSONL dataset ([`crate::write_jsonl`]): each record's
//! `reference_routes` is the canonical label and `reference_cost` its exact cost.

use std::sync::atomic::{AtomicUsize, Ordering};

use rayon::prelude::*;
use routeburn_cost::{Metric, Solution};

use crate::generate::InstanceRng;
use crate::heuristic::{solve, HeuristicConfig};
use crate::instance::Instance;
use crate::jsonl::Record;

/// `solution` with its routes ordered and oriented canonically (see the module docs).
pub fn canonical(instance: &Instance, solution: &Solution) -> Solution {
    let mut routes: Vec<Vec<u32>> = solution
        .routes
        .iter()
        .filter(|r| !r.is_empty())
        .cloned()
        .collect();
    if !instance.has_coords() {
        for r in &mut routes {
            if r.first() > r.last() {
                r.reverse();
            }
        }
        routes.sort_by_key(|r| r.iter().copied().min());
        return Solution::new(routes);
    }
    let coords = instance.coords();
    let depot = coords[0];
    let rel = |c: u32| {
        let p = coords[c as usize];
        [p[0] - depot[0], p[1] - depot[1]]
    };
    for r in &mut routes {
        // Twice the signed area of depot → r → depot; the depot is the origin.
        let area: f64 = r
            .windows(2)
            .map(|w| {
                let (a, b) = (rel(w[0]), rel(w[1]));
                a[0] * b[1] - a[1] * b[0]
            })
            .sum();
        if area < 0.0 || (area == 0.0 && r.first() > r.last()) {
            r.reverse();
        }
    }
    let angle = |r: &Vec<u32>| {
        let (sx, sy) = r.iter().fold((0.0, 0.0), |(x, y), &c| {
            let p = rel(c);
            (x + p[0], y + p[1])
        });
        sy.atan2(sx)
    };
    routes.sort_by(|a, b| {
        angle(a)
            .total_cmp(&angle(b))
            .then(a.iter().min().cmp(&b.iter().min()))
    });
    Solution::new(routes)
}

/// Labels every instance with the heuristic, in parallel (rayon), calling `on_done` after
/// each. Instance `i` uses the seed `config.seed` mixed with `i`, so the labels do not
/// depend on the number of threads. Each record holds the canonical label and its exact
/// Euclidean cost (or explicit-matrix cost).
pub fn label_instances(
    instances: &[Instance],
    config: &HeuristicConfig,
    on_done: &(dyn Fn(usize) + Sync),
) -> Vec<Record> {
    let done = AtomicUsize::new(0);
    instances
        .par_iter()
        .enumerate()
        .map(|(i, instance)| {
            let mut per_instance = config.clone();
            per_instance.seed =
                InstanceRng::new(config.seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                    .next_u64();
            let solution = canonical(instance, &solve(instance, &per_instance));
            let metric = if instance.has_coords() {
                Metric::Exact
            } else {
                instance.default_metric()
            };
            let cost = instance
                .cost(&solution, metric)
                .expect("the heuristic only builds feasible solutions");
            on_done(done.fetch_add(1, Ordering::Relaxed) + 1);
            Record {
                instance: instance.clone(),
                reference_cost: Some(cost),
                reference_routes: Some(solution),
            }
        })
        .collect()
}
