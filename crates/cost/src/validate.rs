use crate::action::ActionIndex;
use crate::error::SolutionError;
use crate::solution::Solution;

/// Checks that `solution` is feasible for an instance with `node_demands` (indexed by node,
/// depot first, so `n = node_demands.len() - 1`) and vehicle `capacity`:
/// no empty routes, every index a customer `1..=n`, every customer visited exactly once,
/// and every route's load within capacity.
pub fn validate(
    solution: &Solution,
    node_demands: &[u32],
    capacity: u32,
) -> Result<(), SolutionError> {
    let mut check = Checker::new(node_demands, capacity)?;
    for (route, customers) in solution.routes.iter().enumerate() {
        if customers.is_empty() {
            return Err(SolutionError::EmptyRoute { route });
        }
        for (position, &c) in customers.iter().enumerate() {
            check.visit(route, position, c as i64)?;
        }
        check.close_route(route)?;
    }
    check.finish()
}

/// [`validate`] for an action sequence (see [`Solution::from_actions`]), without building
/// the routes.
pub fn validate_actions<A: ActionIndex>(
    actions: &[A],
    node_demands: &[u32],
    capacity: u32,
) -> Result<(), SolutionError> {
    let mut seen = Vec::new();
    validate_actions_with(actions, node_demands, capacity, &mut seen)
}

pub(crate) fn validate_actions_with<A: ActionIndex>(
    actions: &[A],
    node_demands: &[u32],
    capacity: u32,
    seen: &mut Vec<u32>,
) -> Result<(), SolutionError> {
    let mut check = Checker::with_scratch(node_demands, capacity, seen)?;
    let end = actions
        .iter()
        .rposition(|a| a.to_i64() != 0)
        .map_or(0, |p| p + 1);
    let mut route = 0;
    let mut route_len = 0;
    for a in &actions[..end] {
        let index = a.to_i64();
        if index == 0 {
            if route_len == 0 {
                return Err(SolutionError::EmptyRoute { route });
            }
            check.close_route(route)?;
            route += 1;
            route_len = 0;
        } else {
            check.visit(route, route_len, index)?;
            route_len += 1;
        }
    }
    if route_len > 0 {
        check.close_route(route)?;
    }
    check.finish()
}

/// Incremental feasibility check shared by both solution forms.
struct Checker<'a> {
    node_demands: &'a [u32],
    capacity: u32,
    /// `seen[c] = route + 1` of the route that visited customer `c`, 0 if unvisited.
    seen: ScratchRef<'a>,
    load: u64,
    visited: usize,
}

enum ScratchRef<'a> {
    Owned(Vec<u32>),
    Borrowed(&'a mut Vec<u32>),
}

impl std::ops::Deref for ScratchRef<'_> {
    type Target = Vec<u32>;
    fn deref(&self) -> &Vec<u32> {
        match self {
            Self::Owned(v) => v,
            Self::Borrowed(v) => v,
        }
    }
}

impl std::ops::DerefMut for ScratchRef<'_> {
    fn deref_mut(&mut self) -> &mut Vec<u32> {
        match self {
            Self::Owned(v) => v,
            Self::Borrowed(v) => v,
        }
    }
}

impl<'a> Checker<'a> {
    fn new(node_demands: &'a [u32], capacity: u32) -> Result<Self, SolutionError> {
        Self::build(node_demands, capacity, ScratchRef::Owned(Vec::new()))
    }

    fn with_scratch(
        node_demands: &'a [u32],
        capacity: u32,
        seen: &'a mut Vec<u32>,
    ) -> Result<Self, SolutionError> {
        Self::build(node_demands, capacity, ScratchRef::Borrowed(seen))
    }

    fn build(
        node_demands: &'a [u32],
        capacity: u32,
        mut seen: ScratchRef<'a>,
    ) -> Result<Self, SolutionError> {
        if node_demands.is_empty() {
            return Err(SolutionError::DemandLength {
                got: 0,
                expected: 1,
            });
        }
        seen.clear();
        seen.resize(node_demands.len(), 0);
        Ok(Self {
            node_demands,
            capacity,
            seen,
            load: 0,
            visited: 0,
        })
    }

    #[inline]
    fn visit(&mut self, route: usize, position: usize, index: i64) -> Result<(), SolutionError> {
        let n = self.node_demands.len() - 1;
        if index < 1 || index as u64 > n as u64 {
            return Err(SolutionError::IndexOutOfRange {
                route,
                position,
                index,
                n,
            });
        }
        let c = index as usize;
        let first = self.seen[c];
        if first != 0 {
            return Err(SolutionError::DuplicateVisit {
                customer: c,
                first_route: first as usize - 1,
                second_route: route,
            });
        }
        self.seen[c] = route as u32 + 1;
        self.visited += 1;
        self.load += self.node_demands[c] as u64;
        Ok(())
    }

    #[inline]
    fn close_route(&mut self, route: usize) -> Result<(), SolutionError> {
        let load = std::mem::take(&mut self.load);
        if load > self.capacity as u64 {
            return Err(SolutionError::CapacityExceeded {
                route,
                load,
                capacity: self.capacity,
                excess: load - self.capacity as u64,
            });
        }
        Ok(())
    }

    fn finish(self) -> Result<(), SolutionError> {
        let n = self.node_demands.len() - 1;
        if self.visited == n {
            return Ok(());
        }
        let first = (1..=n).find(|&c| self.seen[c] == 0).unwrap_or(0);
        Err(SolutionError::MissingCustomers {
            first,
            count: n - self.visited,
        })
    }
}
