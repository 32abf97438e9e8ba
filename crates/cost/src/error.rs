use thiserror::Error;

/// Why a solution is not a feasible CVRP solution.
///
/// Routes and positions are 0-based (route 0 is the first route); customers and nodes are
/// the instance's own indices (1..=n for customers).
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum SolutionError {
    #[error("route {route} is empty")]
    EmptyRoute { route: usize },
    #[error("route {route}, position {position}: node index {index} is not a customer (expected 1..={n})")]
    IndexOutOfRange {
        route: usize,
        position: usize,
        index: i64,
        n: usize,
    },
    #[error("customer {customer} is visited twice: in route {first_route} and again in route {second_route}")]
    DuplicateVisit {
        customer: usize,
        first_route: usize,
        second_route: usize,
    },
    #[error("{count} customer(s) never visited, first {first}")]
    MissingCustomers { first: usize, count: usize },
    #[error("route {route} carries {load}, above the capacity {capacity} by {excess}")]
    CapacityExceeded {
        route: usize,
        load: u64,
        capacity: u32,
        excess: u64,
    },
    #[error("the instance has {got} demand entries, expected {expected} (depot + customers)")]
    DemandLength { got: usize, expected: usize },
}
