//! Seeded instance generation.
//!
//! # Portability
//! Every random number comes from [`InstanceRng`]: PCG64 (`rand_pcg::Pcg64`, the 128-bit
//! XSL-RR generator, whose output sequence is fixed by its specification) seeded with
//! `Pcg64::seed_from_u64(seed)`. Floats and integers are derived from its raw `u64`
//! output with the formulas in [`InstanceRng`], not with `rand`'s distributions, whose
//! exact values may change between `rand` releases. The same seed therefore gives the
//! same instances on every machine and every build.

use rand::{RngCore, SeedableRng};
use rand_pcg::Pcg64;
use serde::{Deserialize, Serialize};

use crate::batch::Batch;
use crate::error::InstanceError;
use crate::instance::Instance;

/// A portable, serialisable random stream for instance generation (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InstanceRng(Pcg64);

impl InstanceRng {
    pub fn new(seed: u64) -> Self {
        Self(Pcg64::seed_from_u64(seed))
    }

    /// Uniform in `[0, 1)`: the top 53 bits of one `u64`, times 2⁻⁵³.
    #[inline]
    pub fn unit(&mut self) -> f64 {
        (self.0.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform integer in `lo..=hi`, by Lemire's multiply-and-reject (unbiased).
    #[inline]
    pub fn int_inclusive(&mut self, lo: u32, hi: u32) -> u32 {
        debug_assert!(lo <= hi);
        let range = (hi - lo) as u64 + 1;
        let threshold = range.wrapping_neg() % range;
        loop {
            let m = (self.0.next_u64() as u128) * range as u128;
            if (m as u64) >= threshold {
                return lo + (m >> 64) as u32;
            }
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Shuffles `items` in place (Fisher–Yates on this stream).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            let j = self.int_inclusive(0, i as u32) as usize;
            items.swap(i, j);
        }
    }
}

/// The capacities of Kool et al. (2019) and rl4co's generator table, by number of customers.
const CAPACITY_TABLE: [(usize, f64); 14] = [
    (10, 20.0),
    (15, 25.0),
    (20, 30.0),
    (30, 33.0),
    (40, 37.0),
    (50, 40.0),
    (60, 43.0),
    (75, 45.0),
    (100, 50.0),
    (125, 55.0),
    (150, 60.0),
    (200, 70.0),
    (500, 100.0),
    (1000, 150.0),
];

/// Vehicle capacity for `n` customers: 20/30/40/50 for n = 10/20/50/100 (Kool et al.),
/// other table points from rl4co's generator; between points, linear interpolation rounded
/// to the nearest integer; below 10 customers 20, above 1000 customers 150.
pub fn kool_capacity(n: usize) -> u32 {
    let (first, last) = (CAPACITY_TABLE[0], CAPACITY_TABLE[CAPACITY_TABLE.len() - 1]);
    if n <= first.0 {
        return first.1 as u32;
    }
    if n >= last.0 {
        return last.1 as u32;
    }
    let i = CAPACITY_TABLE.iter().position(|&(m, _)| m >= n).unwrap();
    let ((n0, c0), (n1, c1)) = (CAPACITY_TABLE[i - 1], CAPACITY_TABLE[i]);
    let t = (n - n0) as f64 / (n1 - n0) as f64;
    (c0 + t * (c1 - c0)).round() as u32
}

/// The distribution instances are drawn from. New distributions are new variants; callers
/// only see [`Generator`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "distribution", rename_all = "snake_case", deny_unknown_fields)]
pub enum GeneratorConfig {
    /// Kool et al. (2019): depot and customers uniform in [0,1]², integer demands uniform
    /// in `min_demand..=max_demand` (1..=9).
    Uniform {
        #[serde(default = "default_min_demand")]
        min_demand: u32,
        #[serde(default = "default_max_demand")]
        max_demand: u32,
    },
}

fn default_min_demand() -> u32 {
    1
}
fn default_max_demand() -> u32 {
    9
}

impl Default for GeneratorConfig {
    fn default() -> Self {
        Self::Uniform {
            min_demand: 1,
            max_demand: 9,
        }
    }
}

/// Draws instances of `n` customers with a fixed capacity.
#[derive(Debug, Clone, PartialEq)]
pub struct Generator {
    n: usize,
    capacity: u32,
    distribution: GeneratorConfig,
}

impl Generator {
    /// `capacity: None` takes [`kool_capacity`]. Fails when the distribution could draw a
    /// demand the capacity cannot carry.
    pub fn new(
        n: usize,
        capacity: Option<u32>,
        distribution: GeneratorConfig,
    ) -> Result<Self, InstanceError> {
        if n == 0 {
            return Err(InstanceError::NoCustomers);
        }
        let capacity = capacity.unwrap_or_else(|| kool_capacity(n));
        if capacity == 0 {
            return Err(InstanceError::ZeroCapacity);
        }
        match distribution {
            GeneratorConfig::Uniform {
                min_demand,
                max_demand,
            } => {
                if min_demand == 0 || min_demand > max_demand || max_demand > capacity {
                    return Err(InstanceError::BadDemand {
                        customer: 0,
                        demand: if min_demand == 0 { 0 } else { max_demand },
                        capacity,
                    });
                }
            }
        }
        Ok(Self {
            n,
            capacity,
            distribution,
        })
    }

    /// Kool's uniform generator for `n` customers.
    pub fn uniform(n: usize) -> Self {
        Self::new(n, None, GeneratorConfig::default()).expect("Kool's defaults are valid")
    }

    pub fn n(&self) -> usize {
        self.n
    }
    pub fn capacity(&self) -> u32 {
        self.capacity
    }

    /// Fills one instance's node coordinates (`[n + 1]`, depot first) and customer demands.
    /// The draw order (depot, then each customer's x and y, then demands) is part of the
    /// format: it fixes which instance a seed gives.
    fn draw(
        &self,
        rng: &mut InstanceRng,
        mut coord: impl FnMut(f64, f64),
        mut demand: impl FnMut(u32),
    ) {
        match self.distribution {
            GeneratorConfig::Uniform {
                min_demand,
                max_demand,
            } => {
                for _ in 0..=self.n {
                    let x = rng.unit();
                    let y = rng.unit();
                    coord(x, y);
                }
                for _ in 0..self.n {
                    demand(rng.int_inclusive(min_demand, max_demand));
                }
            }
        }
    }

    pub fn sample(&self, rng: &mut InstanceRng, name: impl Into<String>) -> Instance {
        let mut coords = Vec::with_capacity(self.n + 1);
        let mut demands = Vec::with_capacity(self.n);
        self.draw(rng, |x, y| coords.push([x, y]), |d| demands.push(d));
        Instance::from_nodes(name, coords, demands, self.capacity, None)
            .expect("the generator only draws valid instances")
    }

    /// `count` instances named `{prefix}{index:06}`.
    pub fn sample_many(&self, rng: &mut InstanceRng, count: usize, prefix: &str) -> Vec<Instance> {
        (0..count)
            .map(|i| self.sample(rng, format!("{prefix}{i:06}")))
            .collect()
    }

    /// A batch of `size` instances written straight into batch layout. It consumes the RNG
    /// exactly as `size` calls of [`Generator::sample`] would, and gives the same batch as
    /// [`Batch::from_instances`] on those instances.
    // The depot's 0 is pushed once per instance, with the draws in between.
    #[allow(clippy::same_item_push)]
    pub fn sample_batch(&self, rng: &mut InstanceRng, size: usize) -> Batch {
        let nodes = self.n + 1;
        let mut coords = Vec::with_capacity(size * nodes * 2);
        let mut node_demands = Vec::with_capacity(size * nodes);
        for _ in 0..size {
            node_demands.push(0);
            self.draw(
                rng,
                |x, y| coords.extend_from_slice(&[x as f32, y as f32]),
                |d| node_demands.push(d),
            );
        }
        Batch::from_parts(self.n, coords, node_demands, vec![self.capacity; size])
    }
}
