//! How a decode runs, decided once from the device and the model's config, then carried
//! by the decode (in its [`Precomputed`](crate::Precomputed)) so that no step asks again.

use burn::tensor::Device;

use crate::ops::decoder_step::fused_on;
use crate::ops::StepKernel;
use crate::runtime::device::{steps_from_context, trains_through_cubecl};

/// How a decode with gradients (a training decode) runs on CubeCL devices (CUDA, CubeCL's
/// CPU runtime); flex and ndarray always decode step by step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum GradientDecode {
    /// The tours sampled with no gradient recorded, then scored in one differentiable
    /// decoder step over every step's rows (where the fused step runs; else step by step).
    #[default]
    SampleThenScore,
    /// Every step's operations recorded for the backward as the decode goes.
    StepByStep,
}

/// The route of one decode through the decoder step's forms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodeRoute {
    /// Step by step in Burn's tensor operations: where no fused step runs (ndarray, a
    /// config's `decoder_step = "op-by-op"`, a size the kernel does not fit). The reference
    /// every other route is tested against.
    OpByOp,
    /// Step by step, each step one fused operation from its query: flex, with or without
    /// gradients, and CubeCL devices that record gradients step by step.
    FusedSteps {
        /// The fused step reads the keys by feature alone (CubeCL's kernels), not the
        /// glimpse values' own layout.
        on_cubecl: bool,
    },
    /// Step by step on a CubeCL device without gradients, each step's query made inside
    /// its kernel from the context: scoring given tours (`AttentionModel::follow`).
    FusedStepsFromContext,
    /// The whole decode without gradients as one kernel (CubeCL devices).
    OneLaunch,
    /// A decode with gradients on a CubeCL device: the tours sampled in one launch
    /// outside autodiff, then scored by one fused step over every step's rows.
    SampleThenScore,
}

/// Which form one decoder step takes, given the route.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StepForm {
    OpByOp,
    Fused,
    FusedFromContext,
}

/// What the route depends on besides the device: the model's config and the decode.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RouteInputs {
    pub step_kernel: StepKernel,
    pub gradient_decode: GradientDecode,
    /// `[N, H, d]`: nodes (depot included), heads, embedding size.
    pub size: [usize; 3],
    /// The decode follows given tours instead of choosing.
    pub following: bool,
}

impl DecodeRoute {
    /// The route of a decode on `device`.
    pub(crate) fn decide(device: &Device, inputs: RouteInputs) -> Self {
        let [nodes, heads, d] = inputs.size;
        if inputs.step_kernel == StepKernel::OpByOp || !fused_on(device, nodes, heads, d) {
            return Self::OpByOp;
        }
        if trains_through_cubecl(device) {
            return match inputs.gradient_decode {
                GradientDecode::SampleThenScore if !inputs.following => Self::SampleThenScore,
                _ => Self::FusedSteps { on_cubecl: true },
            };
        }
        match (steps_from_context(device), inputs.following) {
            (true, false) => Self::OneLaunch,
            (true, true) => Self::FusedStepsFromContext,
            (false, _) => Self::FusedSteps { on_cubecl: false },
        }
    }

    /// Whether the route runs the fused decoder step (and so needs the keys by feature).
    pub(crate) fn is_fused(self) -> bool {
        self != Self::OpByOp
    }

    /// Whether the fused step reads the glimpse values only through the keys by feature
    /// (CubeCL's kernels), so that they need no contiguous copy of their own.
    pub(crate) fn reads_keys_by_feature_only(self) -> bool {
        !matches!(self, Self::OpByOp | Self::FusedSteps { on_cubecl: false })
    }

    /// The form of one step on this route. A sampled-then-scored decode's steps with
    /// gradients are fused steps from the query; the one-launch decode's, steps from the
    /// context.
    pub(crate) fn step(self) -> StepForm {
        match self {
            Self::OpByOp => StepForm::OpByOp,
            Self::FusedSteps { .. } | Self::SampleThenScore => StepForm::Fused,
            Self::FusedStepsFromContext | Self::OneLaunch => StepForm::FusedFromContext,
        }
    }
}
