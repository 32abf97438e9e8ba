//! The CVRP problem state during decoding, kept on the device.
//!
//! Masking follows Kool et al. (2019):
//! - a customer is masked when it is visited or its demand exceeds the remaining capacity;
//! - the depot is masked right after a depot visit (and at the start), unless no customer
//!   is feasible;
//! - an instance that has served every customer may only pick the depot, so a batch can
//!   decode in lockstep.
//!
//! Loads are tracked in the instance's own integer demand units (stored as f32, exact
//! below 2²⁴), so feasibility is decided exactly; the half-unit [`CAPACITY_TOLERANCE`]
//! only guards against a backend that computes in lower precision. Kool's own code tracks
//! loads as float32 sums of demand/capacity fractions instead, where an exact fit can
//! round above 1 and be masked: [`LoadArithmetic::Float32`] reproduces that for the models
//! trained with it.

use burn::tensor::{Bool, Int, Tensor};
use serde::{Deserialize, Serialize};

use crate::ops::mask::{self, MaskInputs};
use crate::ops::state_step::{self, KernelMove, KernelStep, Loads, StepFrom};

/// Slack, in demand units, when comparing a demand with the remaining capacity.
pub const CAPACITY_TOLERANCE: f32 = 0.5;

/// How a route's load is compared with the vehicle capacity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum LoadArithmetic {
    /// In integer demand units: a customer that exactly fills the vehicle fits.
    #[default]
    Exact,
    /// As Kool et al.'s code: demands as float32 fractions of the capacity, the load their
    /// float32 sum, and a customer masked when `fraction + load > 1.0` in float32, so some
    /// exact fits are masked. The published models were trained (and decode) with it.
    Float32,
}

/// What the decoder needs to know about each instance of the batch at one step.
#[derive(Debug, Clone)]
pub struct CvrpState {
    /// `[B, N]` integer demands as f32, depot 0.
    demands: Tensor<2>,
    /// `[B, 1]` vehicle capacity.
    capacity: Tensor<2>,
    /// `[B, N]` customers already served (the depot column, marked by depot visits, is
    /// ignored).
    visited: Visited,
    /// `[B, 1]` load of the current route.
    used_capacity: Tensor<2>,
    /// `[B, 1]` node the vehicle stands at.
    last_node: Tensor<2, Int>,
    /// Slack when a load is compared with the capacity.
    tolerance: f32,
}

/// Which customers are served, in the form the device's operations take best.
///
/// On CubeCL devices Burn's fusion compiles elementwise chains into one kernel, but a
/// boolean `or`, `and` or `not`, a slice, an expand or a `cat` ends the chain: composed
/// of those, the mask and the step were ~12 kernel launches a decode step. There the
/// state keeps 0/1 floats, and each step (with the decode's choice, where it chooses)
/// and the next mask come from one kernel of this crate's (`state_kernel`,
/// [`CvrpState::choose_and_step`]), the first mask from its step to the depot. The same
/// floats stepped by operations that fuse (`mask_fusable`) are its reference in the
/// tests. Elsewhere the state keeps booleans.
#[derive(Debug, Clone)]
#[allow(
    clippy::large_enum_variant,
    reason = "one per decode, never in a collection: boxing would buy nothing"
)]
enum Visited {
    /// `[B, N]` true where served; with `node_ids` `[1, N]` 0, 1, …, n, each column's
    /// node, to mark the one a step serves.
    Flags {
        visited: Tensor<2, Bool>,
        node_ids: Tensor<2, Int>,
    },
    /// `[B, N]` 1 where served, 0 elsewhere, stepped by operations that fuse; with
    /// `is_customer` `[1, N]`, 0 at the depot and 1 elsewhere. The state kernel's
    /// reference, run in the tests.
    Ones {
        served: Tensor<2>,
        is_customer: Tensor<2>,
        node_ids: Tensor<2, Int>,
    },
    /// On CubeCL devices: what the state kernel made at the last step (its served
    /// flags, load, next mask and remaining capacity). The decode starts from its step
    /// to the depot, so no index row or first mask is made in Burn's operations there.
    Kernel(KernelStep),
}

impl Loads {
    pub(crate) fn new(demands: Tensor<2>, capacity: Tensor<2>, arithmetic: LoadArithmetic) -> Self {
        // The state carries no gradient: outside autodiff, its operations skip the autodiff
        // layer's bookkeeping, and the model's differentiable operations read them as
        // constants.
        let (demands, capacity) = (demands.without_autodiff(), capacity.without_autodiff());
        match arithmetic {
            LoadArithmetic::Exact => Self {
                demands,
                capacity,
                tolerance: CAPACITY_TOLERANCE,
            },
            LoadArithmetic::Float32 => Self {
                demands: demands / capacity.clone(), // [B, N], correctly rounded
                capacity: capacity.ones_like(),
                tolerance: 0.0,
            },
        }
    }
}

impl CvrpState {
    /// Every vehicle at the depot with an empty route.
    ///
    /// # Shapes
    /// - `demands`: `[B, N]`, `capacity`: `[B, 1]`
    pub fn new(demands: Tensor<2>, capacity: Tensor<2>) -> Self {
        Self::with_arithmetic(demands, capacity, LoadArithmetic::Exact)
    }

    /// [`CvrpState::new`] with loads compared by `arithmetic`.
    pub fn with_arithmetic(
        demands: Tensor<2>,
        capacity: Tensor<2>,
        arithmetic: LoadArithmetic,
    ) -> Self {
        let fusable = crate::runtime::device::runs_through_cubecl(&demands.device());
        Self::in_form(demands, capacity, arithmetic, fusable)
    }

    /// [`CvrpState::with_arithmetic`], with the served customers as 0/1 floats when
    /// `fusable` (the form CubeCL devices get, see [`Visited`]).
    pub(crate) fn in_form(
        demands: Tensor<2>,
        capacity: Tensor<2>,
        arithmetic: LoadArithmetic,
        fusable: bool,
    ) -> Self {
        let [b, n] = demands.dims();
        let Loads {
            demands,
            capacity,
            tolerance,
        } = Loads::new(demands, capacity, arithmetic);
        let device = demands.device();
        let (used_capacity, last_node) = (
            Tensor::zeros([b, 1], &device),
            Tensor::zeros([b, 1], &device),
        );
        if fusable && crate::runtime::device::runs_through_cubecl(&device) {
            // The decode starts from the state kernel's step to the depot from an empty
            // state: the first mask and remaining capacity in one launch, where Burn's
            // operations made an index row (three launches on CubeCL), the customer flags
            // and a mask chain. Until that step the mask and remaining capacity are
            // allocations that nothing reads (the kernel takes only the mask's bool type).
            let empty = KernelStep {
                action: last_node.clone(),
                used: used_capacity.clone(),
                served: Tensor::zeros([b, n], &device),
                mask: Tensor::empty([b, n], &device),
                remaining: Tensor::empty([b, 1], &device),
            };
            let mut state = Self {
                visited: Visited::Kernel(empty),
                used_capacity,
                last_node: last_node.clone(),
                demands,
                capacity,
                tolerance,
            };
            state.move_by_kernel(KernelMove::To(last_node));
            return state;
        }
        // On CubeCL each arange is three launches (a fill, a cumulative sum and an affine
        // map): one for both uses.
        let node_ids = Tensor::<1, Int>::arange(0..n as i64, &device).reshape([1, n]); // [1, N]
        Self {
            visited: match fusable {
                true => Visited::Ones {
                    served: Tensor::zeros([b, n], &device),
                    is_customer: node_ids.clone().clamp_max(1).float(),
                    node_ids,
                },
                false => Visited::Flags {
                    visited: Tensor::<2>::zeros([b, n], &device).bool(),
                    node_ids,
                },
            },
            used_capacity,
            last_node,
            demands,
            capacity,
            tolerance,
        }
    }

    /// `[B, 1]` remaining capacity as a fraction of the vehicle capacity (the decoder's
    /// context feature).
    pub fn remaining_capacity_fraction(&self) -> Tensor<2> {
        if let Some(last) = self.kernel_step() {
            return last.remaining.clone();
        }
        (self.capacity.clone() - self.used_capacity.clone()) / self.capacity.clone()
    }

    /// `[B, 1]` the node the vehicle stands at.
    pub fn last_node(&self) -> Tensor<2, Int> {
        self.last_node.clone()
    }

    /// `[B, N]` true where a node may not be chosen next: one operation on flex, the state
    /// kernel's on CubeCL devices, Burn's tensor operations elsewhere.
    pub fn mask(&self) -> Tensor<2, Bool> {
        let visited = match &self.visited {
            Visited::Kernel(last) => return last.mask.clone(),
            Visited::Ones { .. } => return self.mask_fusable(),
            Visited::Flags { visited, .. } => visited,
        };
        mask::mask(self.mask_inputs(visited.clone()))
    }

    /// What the mask of a state whose served customers are `visited` is made from.
    fn mask_inputs(&self, visited: Tensor<2, Bool>) -> MaskInputs {
        MaskInputs {
            demands: self.demands.clone(),
            used_capacity: self.used_capacity.clone(),
            capacity: self.capacity.clone(),
            visited,
            last_node: self.last_node.clone(),
            tolerance: self.tolerance,
        }
    }

    /// [`CvrpState::mask`] from 0/1 floats: the same comparison, then only operations
    /// CubeCL's fusion joins (no boolean logic, slice or cat).
    fn mask_fusable(&self) -> Tensor<2, Bool> {
        let [b, _] = self.demands.dims();
        let Visited::Ones {
            served,
            is_customer,
            ..
        } = &self.visited
        else {
            unreachable!("the 0/1 form's mask");
        };
        // `demand + load > capacity`, added in this order: Kool's float32 test exactly.
        let too_heavy = (self.demands.clone() + self.used_capacity.clone())
            .greater(self.capacity.clone().add_scalar(self.tolerance)); // [B, N]
        let blocked = served.clone().mask_fill(too_heavy, 1.0) * is_customer.clone(); // [B, N]
        let open_customers = (is_customer.clone() - blocked.clone()).sum_dim(1); // [B, 1]

        // At the depot with a customer left to serve: the depot is shut.
        let depot_blocked = Tensor::<2>::zeros([b, 1], &self.demands.device())
            .mask_fill(open_customers.greater_elem(0.5), 1.0)
            .mask_fill(self.last_node.clone().greater_elem(0), 0.0); // [B, 1]

        // Computed here, not kept: as one more input of the fused chain it tipped CubeCL's
        // fusion into running the whole step's chain op by op (benches/README, Session 33).
        let is_depot = is_customer.clone().neg().add_scalar(1.0); // [1, N]
        (blocked + depot_blocked * is_depot).greater_elem(0.5)
    }

    /// What the state kernel made at the last step, where the state has the kernel.
    fn kernel_step(&self) -> Option<&KernelStep> {
        match &self.visited {
            Visited::Kernel(last) => Some(last),
            _ => None,
        }
    }

    /// On CubeCL devices, chooses each row's next node from `log_p` (`[R, N]`) and moves
    /// there in one kernel: the most likely node, or with `noise` (`[R, T]`) the inverse
    /// of the CDF at the uniform in the given column, as the decode's op-by-op choice
    /// makes them. The `[R, 1]` choice; `None` (and nothing done) on other devices, where
    /// the caller chooses.
    pub(crate) fn choose_and_step(
        &mut self,
        log_p: Tensor<2>,
        noise: Option<(Tensor<2>, usize)>,
    ) -> Option<Tensor<2, Int>> {
        self.move_by_kernel(KernelMove::Choose { log_p, noise })
    }

    /// Runs the state kernel's step where the state has one (CubeCL devices): the `[R, 1]`
    /// nodes moved to; `None` (and nothing done) elsewhere.
    fn move_by_kernel(&mut self, how: KernelMove) -> Option<Tensor<2, Int>> {
        // The kernel's mask takes the bool type of the last step's.
        let last = self.kernel_step()?;
        let step = self.run_state_kernel(how, &last.served, &last.mask);
        Some(self.take_kernel_step(step))
    }

    /// The state after a kernel's `step`; the `[R, 1]` nodes moved to.
    fn take_kernel_step(&mut self, step: KernelStep) -> Tensor<2, Int> {
        self.used_capacity = step.used.clone();
        self.last_node = step.action.clone();
        let action = step.action.clone();
        self.visited = Visited::Kernel(step);
        action
    }

    /// The state kernel's step from this state (CubeCL devices).
    fn run_state_kernel(
        &self,
        how: KernelMove,
        served: &Tensor<2>,
        bool_like: &Tensor<2, Bool>,
    ) -> KernelStep {
        state_step::run(
            how,
            StepFrom {
                demands: &self.demands,
                capacity: &self.capacity,
                used: &self.used_capacity,
                served,
                last_node: &self.last_node,
                bool_like,
                tolerance: self.tolerance,
            },
        )
    }

    /// `[B, 1]` true where every customer has been served.
    pub fn finished(&self) -> Tensor<2, Bool> {
        let visited = match &self.visited {
            Visited::Flags { visited, .. } => visited.clone(),
            Visited::Ones { served, .. } => served.clone().greater_elem(0.5),
            Visited::Kernel(last) => last.served.clone().greater_elem(0.5),
        };
        let [b, n] = visited.dims();
        visited.slice([0..b, 1..n]).all_dim(1)
    }

    /// Moves each vehicle to `action` (`[B, 1]`): a depot visit starts a new route.
    pub fn step(&mut self, action: Tensor<2, Int>) {
        let [b, n] = self.demands.dims();
        let action = action.without_autodiff();
        if self
            .move_by_kernel(KernelMove::To(action.clone()))
            .is_some()
        {
            return;
        }
        let to_depot = action.clone().equal_elem(0); // [B, 1]
        let demand = self.demands.clone().gather(1, action.clone()); // [B, 1]
        self.used_capacity = (self.used_capacity.clone() + demand).mask_fill(to_depot, 0.0);
        // Not `one_hot`: Burn 0.22.1 checks its indices with a device read (`into_scalar`),
        // a host sync at every step, which a CUDA graph cannot record (error 907).
        self.visited = match &self.visited {
            Visited::Flags { visited, node_ids } => {
                let served = node_ids
                    .clone()
                    .expand([b, n])
                    .equal(action.clone().expand([b, n])); // [B, N]
                Visited::Flags {
                    visited: visited.clone().bool_or(served),
                    node_ids: node_ids.clone(),
                }
            }
            Visited::Ones {
                served,
                is_customer,
                node_ids,
            } => Visited::Ones {
                // Broadcast, not expanded: an expand ends a fused chain.
                served: served
                    .clone()
                    .mask_fill(node_ids.clone().equal(action.clone()), 1.0), // [B, N]
                is_customer: is_customer.clone(),
                node_ids: node_ids.clone(),
            },
            Visited::Kernel(_) => unreachable!("a kernel state moves by the kernel"),
        };
        self.last_node = action;
    }
}

#[cfg(test)]
mod tests {
    use burn::tensor::{Device, TensorData};

    use super::*;
    use crate::runtime::backend::Backend;
    use crate::runtime::testing::{device_of, one_cube_test_at_a_time, test_with_64_bit_offsets};

    fn read_mask(mask: Tensor<2, Bool>) -> Vec<bool> {
        mask.into_data().try_into_vec_as::<bool>().expect("bool")
    }

    /// Rows walking random routes, each step to a node that the op-by-op mask allows:
    /// integer demands against small capacities, so that exact fits, customers too heavy
    /// for the load, depot returns with customers left and finished rows all occur. At
    /// every step the fused mask equals the op-by-op one. Rows of `n` nodes.
    fn assert_fused_mask_matches(device: &Device, arithmetic: LoadArithmetic, n: usize) {
        let rows = 48;
        let mut x = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move |bound: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % bound
        };
        let capacities: Vec<f32> = (0..rows).map(|_| (7 + next(24)) as f32).collect();
        let demands: Vec<f32> = (0..rows * n)
            .map(|i| {
                if i % n == 0 {
                    0.0
                } else {
                    (1 + next(9)) as f32
                }
            })
            .collect();
        let demands = Tensor::<2>::from_data(TensorData::new(demands, [rows, n]), device);
        let capacity = Tensor::<2>::from_data(TensorData::new(capacities, [rows, 1]), device);
        let mut state = CvrpState::in_form(demands.clone(), capacity.clone(), arithmetic, false);
        // CubeCL's form, run here in lockstep: the same masks from 0/1 floats (and on a
        // CubeCL device, from the state kernel).
        let mut ones = CvrpState::in_form(demands, capacity, arithmetic, true);
        let (mut depot_open_at_depot, mut depot_shut, mut fits_exactly) = (0, 0, 0);
        for step in 0..2 * n {
            let Visited::Flags { visited, .. } = &state.visited else {
                panic!("flex keeps flags");
            };
            let reference = read_mask(mask::op_by_op(state.mask_inputs(visited.clone())));
            assert_eq!(
                read_mask(state.mask()),
                reference,
                "{arithmetic:?}, step {step}"
            );
            assert_eq!(read_mask(ones.mask()), reference, "0/1 form, step {step}");
            assert_eq!(read_mask(ones.finished()), read_mask(state.finished()));
            let last: Vec<i64> = state.last_node().into_data().iter::<i64>().collect();
            let mut actions = Vec::with_capacity(rows);
            for (r, masked) in reference.chunks_exact(n).enumerate() {
                let open: Vec<usize> = (0..n).filter(|&j| !masked[j]).collect();
                depot_open_at_depot += usize::from(last[r] == 0 && !masked[0]);
                depot_shut += usize::from(masked[0]);
                let choice = open[next(open.len() as u64) as usize];
                actions.push(choice as i64);
            }
            let actions = Tensor::<2, Int>::from_data(TensorData::new(actions, [rows, 1]), device);
            state.step(actions.clone());
            ones.step(actions);
            let read = |s: &CvrpState| {
                let remaining = s.remaining_capacity_fraction().into_data();
                remaining.try_to_vec::<f32>().expect("floats")
            };
            let remaining = read(&state);
            assert_eq!(read(&ones), remaining, "0/1 form's loads, step {step}");
            fits_exactly += remaining.iter().filter(|&&f| f == 0.0).count();
        }
        // The walk reached the cases the rule tells apart, and ended with every row done.
        assert!(depot_open_at_depot > 0 && depot_shut > 0 && fits_exactly > 0);
        assert!(read_mask(ones.finished()).iter().any(|&f| f));
    }

    #[test]
    fn fused_mask_matches_op_by_op() {
        let Some(flex) = device_of(Backend::Flex) else {
            return;
        };
        for device in [flex.clone(), flex.autodiff()] {
            // 8 customers, and 36: vectors of 16 with some left over.
            for (arithmetic, n) in [
                (LoadArithmetic::Exact, 9),
                (LoadArithmetic::Float32, 9),
                (LoadArithmetic::Exact, 37),
            ] {
                assert_fused_mask_matches(&device, arithmetic, n);
            }
        }
    }

    test_with_64_bit_offsets!(cube_state_kernel_matches_op_by_op);

    /// On CubeCL's CPU runtime the 0/1 form steps through the state kernel
    /// (`state_kernel`), which makes the next mask with the step: the same masks, loads
    /// and finished rows as the op-by-op form at every step of the walk.
    #[test]
    fn cube_state_kernel_matches_op_by_op() {
        let Some(device) = device_of(Backend::Cpu) else {
            return;
        };
        let _alone = one_cube_test_at_a_time();
        for arithmetic in [LoadArithmetic::Exact, LoadArithmetic::Float32] {
            assert_fused_mask_matches(&device, arithmetic, 9);
        }
    }
}
