//! A decode step's choice, the CVRP state's step ([`crate::model::state::CvrpState::step`])
//! and the next step's mask as one operation on CubeCL devices ([`cube_kernel`]). The
//! reference is the state's own op-by-op step and mask, which the tests compare against;
//! flex and ndarray run that reference.

use burn::tensor::{Bool, Int, Tensor};

#[cfg(feature = "cube")]
pub(crate) mod cube_kernel;

/// What a state compares its loads with: the demands `[B, N]` and capacity `[B, 1]`, in
/// the form `arithmetic` asks ([`LoadArithmetic`]), outside autodiff, and the slack of the
/// comparison. A whole decode in one kernel (`crate::ops::decoder_step::fused_decode`) starts
/// from these alone.
#[derive(Debug, Clone)]
pub(crate) struct Loads {
    pub demands: Tensor<2>,
    pub capacity: Tensor<2>,
    pub tolerance: f32,
}

/// One step of the state kernel: the `[R, 1]` node moved to, the new load, served flags,
/// next mask and remaining capacity fraction.
#[derive(Debug, Clone)]
pub(crate) struct KernelStep {
    pub action: Tensor<2, Int>,
    pub used: Tensor<2>,
    pub served: Tensor<2>,
    pub mask: Tensor<2, Bool>,
    pub remaining: Tensor<2>,
}

/// Where the state kernel moves each row.
#[allow(
    clippy::large_enum_variant,
    reason = "made once a step and moved straight into the kernel's call"
)]
#[cfg_attr(
    not(feature = "cube"),
    allow(dead_code, reason = "read only where a CubeCL backend is compiled in")
)]
pub(crate) enum KernelMove {
    /// To the given `[R, 1]` nodes.
    To(Tensor<2, Int>),
    /// To the most likely node of `log_p` (`[R, N]`), or with `noise` (`[R, T]`) and a
    /// column, to the inverse of its CDF at that column's uniform.
    Choose {
        log_p: Tensor<2>,
        noise: Option<(Tensor<2>, usize)>,
    },
}

/// The state a step starts from: the loads, the `[R, 1]` load and node of each row, its
/// `[R, N]` served flags, and a mask whose bool type the next mask takes.
#[cfg_attr(
    not(feature = "cube"),
    allow(dead_code, reason = "read only where a CubeCL backend is compiled in")
)]
pub(crate) struct StepFrom<'a> {
    pub demands: &'a Tensor<2>,
    pub capacity: &'a Tensor<2>,
    pub used: &'a Tensor<2>,
    pub served: &'a Tensor<2>,
    pub last_node: &'a Tensor<2, Int>,
    pub bool_like: &'a Tensor<2, Bool>,
    pub tolerance: f32,
}

/// Moves every row of `from` as `how` says, in one kernel.
#[cfg(feature = "cube")]
pub(crate) fn run(how: KernelMove, from: StepFrom) -> KernelStep {
    use burn::backend::Dispatch;
    use cube_kernel::StateStepBackend;
    let (demands, capacity, used, served, bool_like) = (
        from.demands.clone().into_dispatch(),
        from.capacity.clone().into_dispatch(),
        from.used.clone().into_dispatch(),
        from.served.clone().into_dispatch(),
        from.bool_like.clone().into_dispatch(),
    );
    let (action, outputs) = match how {
        KernelMove::To(action) => {
            let outputs = <Dispatch as StateStepBackend>::state_step(
                action.clone().into_dispatch(),
                demands,
                capacity,
                used,
                served,
                bool_like,
                from.tolerance,
            );
            (action, outputs)
        }
        KernelMove::Choose { log_p, noise } => {
            let sample = noise.is_some();
            // Greedy reads no noise: any float tensor stands in.
            let (noise, column) = noise.unwrap_or_else(|| (from.used.clone(), 0));
            let (action, used, served, mask, remaining) =
                <Dispatch as StateStepBackend>::choose_and_step(
                    log_p.without_autodiff().into_dispatch(),
                    noise.without_autodiff().into_dispatch(),
                    demands,
                    capacity,
                    used,
                    served,
                    from.last_node.clone().into_dispatch(),
                    bool_like,
                    from.tolerance,
                    sample,
                    column as u32,
                );
            (
                Tensor::from_dispatch(action),
                (used, served, mask, remaining),
            )
        }
    };
    let (used, served, mask, remaining) = outputs;
    KernelStep {
        action,
        used: Tensor::from_dispatch(used),
        served: Tensor::from_dispatch(served),
        mask: Tensor::from_dispatch(mask),
        remaining: Tensor::from_dispatch(remaining),
    }
}

/// Where no CubeCL backend is compiled in, no state has the kernel's form.
#[cfg(not(feature = "cube"))]
pub(crate) fn run(_how: KernelMove, _from: StepFrom) -> KernelStep {
    unreachable!("the state kernel is made only on CubeCL devices")
}
