use crate::action::ActionIndex;
use crate::distance::Distance;
use crate::error::SolutionError;

/// A CVRP solution: a list of routes, each a sequence of customer indices `1..=n`.
/// The depot (node 0) is implicit at both ends of every route.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Solution {
    pub routes: Vec<Vec<u32>>,
}

impl Solution {
    pub fn new(routes: Vec<Vec<u32>>) -> Self {
        Self { routes }
    }

    /// Parses a decoder's action sequence: node indices, `0` for a return to the depot,
    /// padded with trailing zeros.
    ///
    /// The grammar is `route 0 route 0 ... route [0] 0*`: every route is terminated by a
    /// depot visit (the last one may be left open), and anything after the last customer
    /// is padding. Two depot visits in a row *before* the last customer, or a leading
    /// depot visit, mean an empty route and are rejected. Negative indices are rejected;
    /// indices above `n` are kept here and caught by validation (`validate`), which knows `n`.
    pub fn from_actions<A: ActionIndex>(actions: &[A]) -> Result<Self, SolutionError> {
        let end = actions
            .iter()
            .rposition(|a| a.to_i64() != 0)
            .map_or(0, |p| p + 1);
        let mut routes = Vec::new();
        let mut current = Vec::new();
        for (position, a) in actions[..end].iter().enumerate() {
            let index = a.to_i64();
            if index == 0 {
                if current.is_empty() {
                    return Err(SolutionError::EmptyRoute {
                        route: routes.len(),
                    });
                }
                routes.push(std::mem::take(&mut current));
            } else if index < 0 || index > u32::MAX as i64 {
                return Err(SolutionError::IndexOutOfRange {
                    route: routes.len(),
                    position,
                    index,
                    n: 0,
                });
            } else {
                current.push(index as u32);
            }
        }
        if !current.is_empty() {
            routes.push(current);
        }
        Ok(Self { routes })
    }

    /// The action sequence of this solution: each route followed by a depot visit, padded
    /// with zeros to `len` (no padding when `len` is shorter than the sequence).
    pub fn to_actions(&self, len: usize) -> Vec<i64> {
        let mut actions = Vec::with_capacity(len.max(self.num_customers() + self.routes.len()));
        for route in &self.routes {
            actions.extend(route.iter().map(|&c| c as i64));
            actions.push(0);
        }
        if actions.len() < len {
            actions.resize(len, 0);
        }
        actions
    }

    pub fn num_customers(&self) -> usize {
        self.routes.iter().map(Vec::len).sum()
    }

    /// Total length of all routes under `distance`, depot to depot.
    pub fn cost<D: Distance + ?Sized>(&self, distance: &D) -> f64 {
        self.routes.iter().map(|r| route_cost(r, distance)).sum()
    }
}

/// Length of one route, from the depot through `route` and back.
pub fn route_cost<D: Distance + ?Sized>(route: &[u32], distance: &D) -> f64 {
    let mut prev = 0usize;
    let mut total = 0.0;
    for &c in route {
        total += distance.dist(prev, c as usize);
        prev = c as usize;
    }
    total + distance.dist(prev, 0)
}
