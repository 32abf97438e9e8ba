//! A classical CVRP heuristic, for supervised labels and as a yardstick: Clarke–Wright
//! savings, then local search, then ruin-and-recreate rounds.
//!
//! 1. **Savings** (Clarke & Wright 1964, parallel version) with the shape parameter λ of
//!    Yellow (1970): s_ij = d_0i + d_0j − λ·d_ij. One construction per λ in
//!    [`HeuristicConfig::savings_shapes`]; the best after local search is kept.
//! 2. **Local search** to a local optimum of four neighbourhoods, first improvement:
//!    2-opt inside a route, relocate one customer (within or between routes), swap two
//!    customers of different routes, and 2-opt* (exchange the tails of two routes).
//! 3. **Ruin and recreate** (Schrimpf et al. 2000): remove a customer and its nearest
//!    neighbours, reinsert each at its cheapest feasible position, run the local search
//!    again, and keep the result when it is better. The rounds draw from a seeded
//!    [`InstanceRng`], so the same instance and config always give the same solution.
//!
//! Distances are the instance's own ([`Instance::default_metric`], or its explicit matrix).

use routeburn_cost::{Distance, DistanceMatrix, Euclidean, Metric, RoundedEuclidean, Solution};

use crate::generate::InstanceRng;
use crate::instance::Instance;

/// Moves must improve the cost by more than this to be taken (guards against cycling on
/// floating-point noise).
const IMPROVEMENT_EPS: f64 = 1e-9;

/// How hard the heuristic works.
#[derive(Debug, Clone, PartialEq)]
pub struct HeuristicConfig {
    /// λ of each savings construction.
    pub savings_shapes: Vec<f64>,
    /// Ruin-and-recreate rounds after the constructions (0: none).
    pub perturbation_rounds: usize,
    /// Customers removed per round, as a fraction of n (at least 2 are removed).
    pub ruin_fraction: f64,
    /// Seed of the ruin-and-recreate rounds.
    pub seed: u64,
}

impl Default for HeuristicConfig {
    /// About 1–2 ms per 20-customer instance on one core, within about 1% of a strong
    /// solver's costs on `data/validation/cvrp20.jsonl` (see the data crate's tests).
    fn default() -> Self {
        Self {
            savings_shapes: vec![0.6, 1.0, 1.4, 1.8],
            perturbation_rounds: 200,
            ruin_fraction: 0.2,
            seed: 0,
        }
    }
}

/// A good feasible solution of `instance`.
pub fn solve(instance: &Instance, config: &HeuristicConfig) -> Solution {
    let problem = Problem::new(instance);
    if problem.num_nodes == 1 {
        return Solution::default();
    }
    let mut best: Option<Routes> = None;
    for &shape in &config.savings_shapes {
        let mut routes = problem.savings(shape);
        problem.local_search(&mut routes);
        if best
            .as_ref()
            .is_none_or(|b| routes.cost < b.cost - IMPROVEMENT_EPS)
        {
            best = Some(routes);
        }
    }
    let mut best = best.unwrap_or_else(|| {
        let mut r = problem.savings(1.0);
        problem.local_search(&mut r);
        r
    });
    let mut rng = InstanceRng::new(config.seed);
    let ruin = ((config.ruin_fraction * problem.n() as f64).round() as usize)
        .max(2)
        .min(problem.n());
    for _ in 0..config.perturbation_rounds {
        let mut candidate = best.clone();
        problem.ruin_and_recreate(&mut candidate, ruin, &mut rng);
        problem.local_search(&mut candidate);
        if candidate.cost < best.cost - IMPROVEMENT_EPS {
            best = candidate;
        }
    }
    best.into_solution()
}

/// Routes with the depot at both ends (`[0, c1, ..., ck, 0]`), their loads and total cost.
#[derive(Debug, Clone)]
struct Routes {
    routes: Vec<Vec<usize>>,
    loads: Vec<u64>,
    cost: f64,
}

impl Routes {
    fn into_solution(self) -> Solution {
        Solution::new(
            self.routes
                .into_iter()
                .filter(|r| r.len() > 2)
                .map(|r| r[1..r.len() - 1].iter().map(|&c| c as u32).collect())
                .collect(),
        )
    }

    fn drop_empty(&mut self) {
        let mut i = 0;
        while i < self.routes.len() {
            if self.routes[i].len() <= 2 {
                self.routes.swap_remove(i);
                self.loads.swap_remove(i);
            } else {
                i += 1;
            }
        }
    }
}

/// The instance in the form the moves need: a dense distance matrix and integer demands.
struct Problem {
    num_nodes: usize,
    dist: DistanceMatrix,
    demand: Vec<u64>,
    capacity: u64,
    /// Each customer's other customers, nearest first (for related removal).
    neighbours: Vec<Vec<usize>>,
}

impl Problem {
    fn new(instance: &Instance) -> Self {
        let num_nodes = instance.n() + 1;
        let dist = match (instance.explicit_distances(), instance.default_metric()) {
            (Some(m), _) => m.clone(),
            (None, Metric::Exact) => {
                let e = Euclidean(instance.coords());
                DistanceMatrix::from_fn(num_nodes, |i, j| e.dist(i, j))
            }
            (None, Metric::Cvrplib) => {
                let e = RoundedEuclidean(instance.coords());
                DistanceMatrix::from_fn(num_nodes, |i, j| e.dist(i, j))
            }
        };
        let neighbours = (0..num_nodes)
            .map(|i| {
                let mut others: Vec<usize> = (1..num_nodes).filter(|&j| j != i).collect();
                others.sort_by(|&a, &b| dist.dist(i, a).total_cmp(&dist.dist(i, b)));
                others
            })
            .collect();
        Self {
            num_nodes,
            demand: instance.node_demands().iter().map(|&d| d as u64).collect(),
            capacity: instance.capacity() as u64,
            dist,
            neighbours,
        }
    }

    fn n(&self) -> usize {
        self.num_nodes - 1
    }

    #[inline]
    fn d(&self, i: usize, j: usize) -> f64 {
        self.dist.row(i)[j]
    }

    fn route_cost(&self, route: &[usize]) -> f64 {
        route.windows(2).map(|w| self.d(w[0], w[1])).sum()
    }

    fn make_routes(&self, routes: Vec<Vec<usize>>) -> Routes {
        let loads = routes
            .iter()
            .map(|r| r.iter().map(|&c| self.demand[c]).sum())
            .collect();
        let cost = routes.iter().map(|r| self.route_cost(r)).sum();
        Routes {
            routes,
            loads,
            cost,
        }
    }

    /// Parallel Clarke–Wright savings with shape λ.
    fn savings(&self, shape: f64) -> Routes {
        let n = self.n();
        // Customer chains, merged end to end; `chain_of[c]` is the chain holding c.
        let mut chains: Vec<Vec<usize>> = (0..=n).map(|c| vec![c]).collect();
        let mut chain_of: Vec<usize> = (0..=n).collect();
        let mut loads: Vec<u64> = self.demand.clone();
        let mut savings = Vec::with_capacity(n * n.saturating_sub(1) / 2);
        for i in 1..=n {
            for j in i + 1..=n {
                let s = self.d(0, i) + self.d(0, j) - shape * self.d(i, j);
                if s > 0.0 {
                    savings.push((s, i, j));
                }
            }
        }
        // Largest saving first; ties by index, so the order is deterministic.
        savings.sort_by(|a, b| b.0.total_cmp(&a.0).then((a.1, a.2).cmp(&(b.1, b.2))));
        for (_, i, j) in savings {
            let (ci, cj) = (chain_of[i], chain_of[j]);
            if ci == cj || loads[ci] + loads[cj] > self.capacity {
                continue;
            }
            let is_end = |c: &Vec<usize>, x| c.first() == Some(&x) || c.last() == Some(&x);
            if !is_end(&chains[ci], i) || !is_end(&chains[cj], j) {
                continue;
            }
            // Join as [... i][j ...].
            let mut left = std::mem::take(&mut chains[ci]);
            let mut right = std::mem::take(&mut chains[cj]);
            if left.last() != Some(&i) {
                left.reverse();
            }
            if right.first() != Some(&j) {
                right.reverse();
            }
            for &c in &right {
                chain_of[c] = ci;
            }
            left.extend(right);
            chains[ci] = left;
            loads[ci] += loads[cj];
            loads[cj] = 0;
        }
        let routes = chains
            .into_iter()
            .skip(1)
            .filter(|c| !c.is_empty())
            .map(|c| {
                let mut r = Vec::with_capacity(c.len() + 2);
                r.push(0);
                r.extend(c);
                r.push(0);
                r
            })
            .collect();
        self.make_routes(routes)
    }

    /// Applies improving moves until none of the neighbourhoods has one.
    fn local_search(&self, s: &mut Routes) {
        loop {
            let improved =
                self.two_opt(s) || self.relocate(s) || self.swap(s) || self.two_opt_star(s);
            if !improved {
                break;
            }
            s.drop_empty();
        }
        // Recompute from scratch so rounding in the deltas never accumulates.
        s.cost = s.routes.iter().map(|r| self.route_cost(r)).sum();
    }

    /// Reverses a segment of one route.
    fn two_opt(&self, s: &mut Routes) -> bool {
        let mut any = false;
        for r in 0..s.routes.len() {
            loop {
                let v = &s.routes[r];
                let m = v.len() - 2;
                let mut found = None;
                'search: for i in 0..m {
                    for j in i + 2..=m {
                        let delta = self.d(v[i], v[j]) + self.d(v[i + 1], v[j + 1])
                            - self.d(v[i], v[i + 1])
                            - self.d(v[j], v[j + 1]);
                        if delta < -IMPROVEMENT_EPS {
                            found = Some((i, j, delta));
                            break 'search;
                        }
                    }
                }
                let Some((i, j, delta)) = found else { break };
                s.routes[r][i + 1..=j].reverse();
                s.cost += delta;
                any = true;
            }
        }
        any
    }

    /// Moves one customer to another position, in its route or another.
    fn relocate(&self, s: &mut Routes) -> bool {
        for r1 in 0..s.routes.len() {
            for p in 1..s.routes[r1].len() - 1 {
                let v1 = &s.routes[r1];
                let (a, u, b) = (v1[p - 1], v1[p], v1[p + 1]);
                let removal = self.d(a, b) - self.d(a, u) - self.d(u, b);
                for r2 in 0..s.routes.len() {
                    if r2 != r1 && s.loads[r2] + self.demand[u] > self.capacity {
                        continue;
                    }
                    let v2 = &s.routes[r2];
                    for q in 0..v2.len() - 1 {
                        if r1 == r2 && (q == p - 1 || q == p) {
                            continue;
                        }
                        let (x, y) = (v2[q], v2[q + 1]);
                        let delta = removal + self.d(x, u) + self.d(u, y) - self.d(x, y);
                        if delta < -IMPROVEMENT_EPS {
                            s.routes[r1].remove(p);
                            let at = if r1 == r2 && q > p { q } else { q + 1 };
                            s.routes[r2].insert(at, u);
                            s.loads[r1] -= self.demand[u];
                            s.loads[r2] += self.demand[u];
                            s.cost += delta;
                            return true;
                        }
                    }
                }
            }
        }
        false
    }

    /// Exchanges two customers of different routes.
    fn swap(&self, s: &mut Routes) -> bool {
        for r1 in 0..s.routes.len() {
            for r2 in r1 + 1..s.routes.len() {
                let (v1, v2) = (&s.routes[r1], &s.routes[r2]);
                for p in 1..v1.len() - 1 {
                    let (a1, u, b1) = (v1[p - 1], v1[p], v1[p + 1]);
                    for q in 1..v2.len() - 1 {
                        let (a2, w, b2) = (v2[q - 1], v2[q], v2[q + 1]);
                        let (du, dw) = (self.demand[u], self.demand[w]);
                        if s.loads[r1] - du + dw > self.capacity
                            || s.loads[r2] - dw + du > self.capacity
                        {
                            continue;
                        }
                        let delta = self.d(a1, w) + self.d(w, b1) - self.d(a1, u) - self.d(u, b1)
                            + self.d(a2, u)
                            + self.d(u, b2)
                            - self.d(a2, w)
                            - self.d(w, b2);
                        if delta < -IMPROVEMENT_EPS {
                            s.routes[r1][p] = w;
                            s.routes[r2][q] = u;
                            s.loads[r1] = s.loads[r1] - du + dw;
                            s.loads[r2] = s.loads[r2] - dw + du;
                            s.cost += delta;
                            return true;
                        }
                    }
                }
            }
        }
        false
    }

    /// Exchanges the tails of two routes: `[..i] + [j+1..]` and `[..j] + [i+1..]`.
    fn two_opt_star(&self, s: &mut Routes) -> bool {
        for r1 in 0..s.routes.len() {
            for r2 in r1 + 1..s.routes.len() {
                let (v1, v2) = (&s.routes[r1], &s.routes[r2]);
                let (m1, m2) = (v1.len() - 2, v2.len() - 2);
                let mut head1 = 0u64;
                for i in 0..=m1 {
                    head1 += self.demand[v1[i]];
                    let mut head2 = 0u64;
                    for j in 0..=m2 {
                        head2 += self.demand[v2[j]];
                        if (i == 0 && j == 0) || (i == m1 && j == m2) {
                            continue;
                        }
                        let new1 = head1 + (s.loads[r2] - head2);
                        let new2 = head2 + (s.loads[r1] - head1);
                        if new1 > self.capacity || new2 > self.capacity {
                            continue;
                        }
                        let delta = self.d(v1[i], v2[j + 1]) + self.d(v2[j], v1[i + 1])
                            - self.d(v1[i], v1[i + 1])
                            - self.d(v2[j], v2[j + 1]);
                        if delta < -IMPROVEMENT_EPS {
                            let tail1 = s.routes[r1].split_off(i + 1);
                            let tail2 = s.routes[r2].split_off(j + 1);
                            s.routes[r1].extend(tail2);
                            s.routes[r2].extend(tail1);
                            s.loads[r1] = new1;
                            s.loads[r2] = new2;
                            s.cost += delta;
                            return true;
                        }
                    }
                }
            }
        }
        false
    }

    /// Removes a random customer and its `count - 1` nearest customers, then reinserts them
    /// in random order, each at its cheapest feasible position (or on a new route).
    fn ruin_and_recreate(&self, s: &mut Routes, count: usize, rng: &mut InstanceRng) {
        let n = self.n();
        let seed = rng.int_inclusive(1, n as u32) as usize;
        let mut removed: Vec<usize> = std::iter::once(seed)
            .chain(self.neighbours[seed].iter().copied())
            .take(count)
            .collect();
        for route in &mut s.routes {
            route.retain(|c| *c == 0 || !removed.contains(c));
        }
        rng.shuffle(&mut removed);
        let mut rebuilt = self.make_routes(std::mem::take(&mut s.routes));
        rebuilt.drop_empty();
        for &u in &removed {
            let mut best: Option<(f64, usize, usize)> = None;
            for (r, v) in rebuilt.routes.iter().enumerate() {
                if rebuilt.loads[r] + self.demand[u] > self.capacity {
                    continue;
                }
                for q in 0..v.len() - 1 {
                    let delta = self.d(v[q], u) + self.d(u, v[q + 1]) - self.d(v[q], v[q + 1]);
                    if best.is_none_or(|b| delta < b.0) {
                        best = Some((delta, r, q));
                    }
                }
            }
            match best {
                Some((_, r, q)) => {
                    rebuilt.routes[r].insert(q + 1, u);
                    rebuilt.loads[r] += self.demand[u];
                }
                None => {
                    rebuilt.routes.push(vec![0, u, 0]);
                    rebuilt.loads.push(self.demand[u]);
                }
            }
        }
        *s = self.make_routes(rebuilt.routes);
    }
}
