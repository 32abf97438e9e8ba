use routeburn_cost::{
    validate, Distance, DistanceMatrix, Euclidean, Metric, RoundedEuclidean, Solution,
    SolutionError,
};

use crate::error::InstanceError;

/// One CVRP instance. Construction validates it, so every `Instance` has at least one
/// customer, finite coordinates, a positive capacity and demands `1 <= d <= capacity`.
#[derive(Debug, Clone, PartialEq)]
pub struct Instance {
    name: String,
    /// `[n + 1]` node coordinates, depot first. Empty only for EXPLICIT instances without
    /// display coordinates.
    coords: Vec<[f64; 2]>,
    /// `[n + 1]` node demands, depot first (the depot's is 0).
    demands: Vec<u32>,
    capacity: u32,
    /// Given edge weights (CVRPLIB EXPLICIT); they take precedence over coordinates.
    explicit: Option<DistanceMatrix>,
}

impl Instance {
    /// An instance from coordinates. `customer_demands[i]` belongs to `customers[i]`.
    pub fn new(
        name: impl Into<String>,
        depot: [f64; 2],
        customers: Vec<[f64; 2]>,
        customer_demands: Vec<u32>,
        capacity: u32,
    ) -> Result<Self, InstanceError> {
        let mut coords = Vec::with_capacity(customers.len() + 1);
        coords.push(depot);
        coords.extend(customers);
        Self::from_nodes(name, coords, customer_demands, capacity, None)
    }

    /// The general constructor: node coordinates depot first (may be empty when `explicit`
    /// is given), customer demands, capacity and optional explicit distances over all nodes.
    pub fn from_nodes(
        name: impl Into<String>,
        coords: Vec<[f64; 2]>,
        customer_demands: Vec<u32>,
        capacity: u32,
        explicit: Option<DistanceMatrix>,
    ) -> Result<Self, InstanceError> {
        let n = customer_demands.len();
        if n == 0 {
            return Err(InstanceError::NoCustomers);
        }
        if capacity == 0 {
            return Err(InstanceError::ZeroCapacity);
        }
        if !(coords.is_empty() && explicit.is_some()) && coords.len() != n + 1 {
            return Err(InstanceError::Length {
                what: "coordinates (depot + customers)",
                expected: n + 1,
                got: coords.len(),
            });
        }
        if let Some((node, &[x, y])) = coords
            .iter()
            .enumerate()
            .find(|(_, p)| !(p[0].is_finite() && p[1].is_finite()))
        {
            return Err(InstanceError::NonFiniteCoordinate { node, x, y });
        }
        if let Some((i, &demand)) = customer_demands
            .iter()
            .enumerate()
            .find(|(_, &d)| d == 0 || d > capacity)
        {
            return Err(InstanceError::BadDemand {
                customer: i + 1,
                demand,
                capacity,
            });
        }
        if let Some(m) = &explicit {
            if m.num_nodes() != n + 1 {
                return Err(InstanceError::Length {
                    what: "distance matrix rows",
                    expected: n + 1,
                    got: m.num_nodes(),
                });
            }
            for i in 0..=n {
                if let Some((j, &value)) = m
                    .row(i)
                    .iter()
                    .enumerate()
                    .find(|(_, v)| !(v.is_finite() && **v >= 0.0))
                {
                    return Err(InstanceError::BadDistance { i, j, value });
                }
            }
        }
        let mut demands = Vec::with_capacity(n + 1);
        demands.push(0);
        demands.extend(customer_demands);
        Ok(Self {
            name: name.into(),
            coords,
            demands,
            capacity,
            explicit,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }
    /// Number of customers.
    pub fn n(&self) -> usize {
        self.demands.len() - 1
    }
    pub fn capacity(&self) -> u32 {
        self.capacity
    }
    /// `[n + 1]` node demands, depot (0) first.
    pub fn node_demands(&self) -> &[u32] {
        &self.demands
    }
    /// `[n + 1]` coordinates, depot first; empty for EXPLICIT instances without coordinates.
    pub fn coords(&self) -> &[[f64; 2]] {
        &self.coords
    }
    pub fn has_coords(&self) -> bool {
        !self.coords.is_empty()
    }
    pub fn explicit_distances(&self) -> Option<&DistanceMatrix> {
        self.explicit.as_ref()
    }
    pub fn total_demand(&self) -> u64 {
        self.demands.iter().map(|&d| d as u64).sum()
    }

    /// Checks `solution` against this instance with the cost crate's validator.
    pub fn validate(&self, solution: &Solution) -> Result<(), SolutionError> {
        validate(solution, &self.demands, self.capacity)
    }

    /// Validates `solution` and returns its cost: explicit distances when the instance has
    /// them, otherwise coordinates under `metric`.
    pub fn cost(&self, solution: &Solution, metric: Metric) -> Result<f64, SolutionError> {
        self.validate(solution)?;
        Ok(match (&self.explicit, metric) {
            (Some(m), _) => solution.cost(m),
            (None, Metric::Exact) => solution.cost(&Euclidean(&self.coords)),
            (None, Metric::Cvrplib) => solution.cost(&RoundedEuclidean(&self.coords)),
        })
    }

    /// Whether every coordinate is an integer (CVRPLIB style), which makes the CVRPLIB
    /// rounded metric the natural default.
    pub fn has_integer_coords(&self) -> bool {
        self.coords
            .iter()
            .all(|p| p[0].fract() == 0.0 && p[1].fract() == 0.0)
    }

    /// The metric a user most likely means for this instance: CVRPLIB rounding for integer
    /// coordinates or explicit weights, exact Euclidean otherwise.
    pub fn default_metric(&self) -> Metric {
        if self.explicit.is_some() || self.has_integer_coords() {
            Metric::Cvrplib
        } else {
            Metric::Exact
        }
    }
}
