use crate::error::InstanceError;
use crate::instance::Instance;

/// A host-side batch of instances with the same number of customers, laid out for one
/// upload to the device. Distances are never materialised: the models and the CPU
/// evaluator both work from coordinates.
#[derive(Debug, Clone, PartialEq)]
pub struct Batch {
    /// Number of instances B.
    pub size: usize,
    /// Customers per instance n (every instance has N = n + 1 nodes, depot first).
    pub n: usize,
    /// `[B, N, 2]` f32 coordinates, depot first.
    pub coords: Vec<f32>,
    /// `[B, N]` demand / capacity, depot 0: what the models see.
    pub demands: Vec<f32>,
    /// `[B, N]` integer demands, depot 0: what the validator sees.
    pub node_demands: Vec<u32>,
    /// `[B]` vehicle capacities.
    pub capacities: Vec<u32>,
}

impl Batch {
    pub fn num_nodes(&self) -> usize {
        self.n + 1
    }

    /// Assembles a batch from raw parts; `demands` is derived from `node_demands`.
    pub(crate) fn from_parts(
        n: usize,
        coords: Vec<f32>,
        node_demands: Vec<u32>,
        capacities: Vec<u32>,
    ) -> Self {
        let size = capacities.len();
        let nodes = n + 1;
        debug_assert_eq!(coords.len(), size * nodes * 2);
        debug_assert_eq!(node_demands.len(), size * nodes);
        let demands = node_demands
            .chunks_exact(nodes)
            .zip(&capacities)
            .flat_map(|(d, &c)| {
                let inv = 1.0 / c as f32;
                d.iter().map(move |&x| x as f32 * inv)
            })
            .collect();
        Self {
            size,
            n,
            coords,
            demands,
            node_demands,
            capacities,
        }
    }

    /// Batches instances as they are (coordinates unchanged). All must have the same n and
    /// coordinates.
    pub fn from_instances<'a>(
        instances: impl IntoIterator<Item = &'a Instance>,
    ) -> Result<Self, InstanceError> {
        Self::build(instances, |inst| inst.coords().to_vec())
    }

    fn build<'a>(
        instances: impl IntoIterator<Item = &'a Instance>,
        coords_of: impl Fn(&Instance) -> Vec<[f64; 2]>,
    ) -> Result<Self, InstanceError> {
        let mut n = None;
        let (mut coords, mut node_demands, mut capacities) = (vec![], vec![], vec![]);
        for inst in instances {
            let first = *n.get_or_insert(inst.n());
            if inst.n() != first {
                return Err(InstanceError::MixedSizes {
                    first,
                    other: inst.n(),
                });
            }
            if !inst.has_coords() {
                return Err(InstanceError::NoCoordinates);
            }
            coords.extend(
                coords_of(inst)
                    .iter()
                    .flat_map(|p| [p[0] as f32, p[1] as f32]),
            );
            node_demands.extend_from_slice(inst.node_demands());
            capacities.push(inst.capacity());
        }
        Ok(Self::from_parts(
            n.unwrap_or(0),
            coords,
            node_demands,
            capacities,
        ))
    }

    /// This batch followed by copies of its last instance, `size` instances in all (a copy
    /// of itself when it has as many or more): a partial batch given a full one's shapes,
    /// whose copies' results the caller drops.
    pub fn padded(&self, size: usize) -> Batch {
        let copies = size.saturating_sub(self.size);
        let nodes = self.num_nodes();
        Self {
            size: self.size + copies,
            n: self.n,
            coords: with_last_repeated(&self.coords, nodes * 2, copies),
            demands: with_last_repeated(&self.demands, nodes, copies),
            node_demands: with_last_repeated(&self.node_demands, nodes, copies),
            capacities: with_last_repeated(&self.capacities, 1, copies),
        }
    }

    /// Coordinates of instance `i` as `[N]` f64 points, for costing with the evaluator.
    pub fn instance_coords(&self, i: usize) -> Vec<[f64; 2]> {
        let nodes = self.num_nodes();
        self.coords[i * nodes * 2..(i + 1) * nodes * 2]
            .chunks_exact(2)
            .map(|p| [p[0] as f64, p[1] as f64])
            .collect()
    }
}

/// `values` followed by `copies` copies of its last `per` values.
fn with_last_repeated<T: Copy>(values: &[T], per: usize, copies: usize) -> Vec<T> {
    let last = &values[values.len() - per..];
    let mut out = Vec::with_capacity(values.len() + copies * per);
    out.extend_from_slice(values);
    for _ in 0..copies {
        out.extend_from_slice(last);
    }
    out
}

/// Maps points into the unit square, keeping the aspect ratio: translated to the bounding
/// box's corner and scaled by its larger side. For CVRPLIB instances, whose coordinates
/// are not in [0,1]², before a model sees them.
pub fn normalize_coords(coords: &[[f64; 2]]) -> Vec<[f64; 2]> {
    let (mut lo, mut hi) = ([f64::INFINITY; 2], [f64::NEG_INFINITY; 2]);
    for p in coords {
        for k in 0..2 {
            lo[k] = lo[k].min(p[k]);
            hi[k] = hi[k].max(p[k]);
        }
    }
    let scale = (hi[0] - lo[0]).max(hi[1] - lo[1]);
    let scale = if scale > 0.0 { scale } else { 1.0 };
    coords
        .iter()
        .map(|p| [(p[0] - lo[0]) / scale, (p[1] - lo[1]) / scale])
        .collect()
}
