/// Edge lengths between nodes (0 = depot).
pub trait Distance {
    fn num_nodes(&self) -> usize;
    /// Length of the edge from node `i` to node `j`. Panics when either is out of range;
    /// validate a solution before costing it.
    fn dist(&self, i: usize, j: usize) -> f64;
}

/// Which rule turns coordinates into edge lengths.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    /// Exact Euclidean distance in f64: the convention of the neural-CVRP literature.
    Exact,
    /// CVRPLIB's EUC_2D: each edge rounded to the nearest integer, then summed.
    Cvrplib,
}

impl std::str::FromStr for Metric {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "exact" => Ok(Self::Exact),
            "cvrplib" => Ok(Self::Cvrplib),
            other => Err(format!(
                "unknown metric `{other}`, expected `exact` or `cvrplib`"
            )),
        }
    }
}

/// Exact Euclidean distances between coordinates (depot first).
#[derive(Debug, Clone, Copy)]
pub struct Euclidean<'a>(pub &'a [[f64; 2]]);

impl Distance for Euclidean<'_> {
    fn num_nodes(&self) -> usize {
        self.0.len()
    }
    #[inline]
    fn dist(&self, i: usize, j: usize) -> f64 {
        let (a, b) = (self.0[i], self.0[j]);
        (a[0] - b[0]).hypot(a[1] - b[1])
    }
}

/// CVRPLIB EUC_2D distances: Euclidean, rounded to the nearest integer (TSPLIB's `nint`).
#[derive(Debug, Clone, Copy)]
pub struct RoundedEuclidean<'a>(pub &'a [[f64; 2]]);

impl Distance for RoundedEuclidean<'_> {
    fn num_nodes(&self) -> usize {
        self.0.len()
    }
    #[inline]
    fn dist(&self, i: usize, j: usize) -> f64 {
        // TSPLIB defines nint(x) = (int)(x + 0.5); for non-negative x that is round-half-up.
        (Euclidean(self.0).dist(i, j) + 0.5).floor()
    }
}

/// A full, symmetric distance matrix, as CVRPLIB's EXPLICIT instances give it.
#[derive(Debug, Clone, PartialEq)]
pub struct DistanceMatrix {
    num_nodes: usize,
    /// Row-major `[num_nodes, num_nodes]`.
    weights: Vec<f64>,
}

impl DistanceMatrix {
    /// From a row-major square matrix. Returns `None` unless `weights.len() == num_nodes²`.
    pub fn from_square(num_nodes: usize, weights: Vec<f64>) -> Option<Self> {
        (weights.len() == num_nodes * num_nodes).then_some(Self { num_nodes, weights })
    }

    /// From a function of (i, j), evaluated for every ordered pair.
    pub fn from_fn(num_nodes: usize, mut f: impl FnMut(usize, usize) -> f64) -> Self {
        let mut weights = Vec::with_capacity(num_nodes * num_nodes);
        for i in 0..num_nodes {
            for j in 0..num_nodes {
                weights.push(f(i, j));
            }
        }
        Self { num_nodes, weights }
    }

    pub fn row(&self, i: usize) -> &[f64] {
        &self.weights[i * self.num_nodes..(i + 1) * self.num_nodes]
    }
}

impl Distance for DistanceMatrix {
    fn num_nodes(&self) -> usize {
        self.num_nodes
    }
    #[inline]
    fn dist(&self, i: usize, j: usize) -> f64 {
        assert!(
            i < self.num_nodes && j < self.num_nodes,
            "node out of range"
        );
        self.weights[i * self.num_nodes + j]
    }
}
