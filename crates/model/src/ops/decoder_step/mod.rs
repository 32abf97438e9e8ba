//! The attention decoder's step as one differentiable operation: the 8-head glimpse of
//! each row's query over its instance's node keys and values, the single-head logits
//! against the logit keys, tanh clipping, temperature, the mask and `log_softmax`, with a
//! hand-written backward.
//!
//! Composed from Burn's tensor ops, the same step is ~30 tracked operations on small
//! tensors (autodiff alone turns each softmax into 5–6), run one after another; as one
//! operation it is one pass over the rows in the forward and one in the backward, split
//! across cores by instance.
//!
//! One signature, one implementation per backend: flex's is plain Rust
//! ([`flex_kernel`]); CubeCL's (CUDA and the CPU runtime) is a kernel for the forward pass
//! and one for the backward ([`cube_kernel`]), the latter its own operation
//! (`cube::DecoderStepGradsBackend`) so that Fusion can queue it. Elsewhere (ndarray) the
//! op-by-op form ([`reference`]) runs; it stays the reference the tests compare against.

mod by_feature;
#[cfg(feature = "cube")]
mod cube_decode;
#[cfg(feature = "cube")]
mod cube_kernel;
#[cfg(feature = "flex")]
mod flex_context;
#[cfg(feature = "flex")]
mod flex_decode;
#[cfg(feature = "flex")]
mod flex_kernel;
mod reference;
#[cfg(test)]
mod tests;

pub(crate) use by_feature::keys_by_feature;
pub(crate) use reference::op_by_op;

use burn::tensor::{Bool, Device, Tensor};

/// Whether the fused step runs on `device` for instances of `nodes` nodes, `heads` heads
/// and `d` features, with or without autodiff: on flex, and on CubeCL devices where the
/// step (and with autodiff its backward) fits the kernel's shared memory.
pub fn fused_on(device: &Device, nodes: usize, heads: usize, d: usize) -> bool {
    use burn::backend::DispatchDevice;
    fn has_kernel(device: &DispatchDevice, size: [usize; 3], training: bool) -> bool {
        let _ = (size, training);
        match device {
            #[cfg(feature = "flex")]
            DispatchDevice::Flex(_) => true,
            #[cfg(feature = "cube")]
            DispatchDevice::Cube(_) => cube_kernel::fits(size[0], size[1], size[2], training),
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
    let size = [nodes, heads, d];
    match device.as_dispatch() {
        #[cfg(feature = "autodiff")]
        DispatchDevice::Autodiff(inner) => has_kernel(inner, size, true),
        other => has_kernel(other, size, false),
    }
}

/// The fused step; call it only where [`fused_on`] holds.
///
/// # Shapes
/// - `query`: `[B, S, d]`, `glimpse_keys` (already divided by √dk) and `glimpse_values`:
///   `[B, N, H, dk]`, `logit_keys`: `[B, N, d]`, `by_feature`: [`keys_by_feature`] of
///   those three, `mask`: `[B × S, N]` (true = masked)
/// - output: `[B × S, N]` log-probabilities, −∞ at masked nodes
#[cfg(any(feature = "flex", feature = "cube"))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fused_step(
    query: Tensor<3>,
    glimpse_keys: Tensor<4>,
    glimpse_values: Tensor<4>,
    logit_keys: Tensor<3>,
    by_feature: Tensor<3>,
    mask: Tensor<2, Bool>,
    tanh_clipping: f64,
    temperature: f64,
) -> Tensor<2> {
    use burn::backend::Dispatch;
    let out = <Dispatch as DecoderStepBackend>::decoder_step(
        query.into_dispatch(),
        glimpse_keys.into_dispatch(),
        glimpse_values.into_dispatch(),
        logit_keys.into_dispatch(),
        by_feature.into_dispatch(),
        mask.into_dispatch(),
        tanh_clipping as f32,
        temperature as f32,
    );
    Tensor::from_dispatch(out)
}

#[cfg(not(any(feature = "flex", feature = "cube")))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn fused_step(
    _query: Tensor<3>,
    _glimpse_keys: Tensor<4>,
    _glimpse_values: Tensor<4>,
    _logit_keys: Tensor<3>,
    _by_feature: Tensor<3>,
    _mask: Tensor<2, Bool>,
    _tanh_clipping: f64,
    _temperature: f64,
) -> Tensor<2> {
    unreachable!("no backend with a fused decoder step is compiled in; check `fused_on` first")
}

/// The fused step from each row's context, on a CubeCL device without autodiff (see
/// [`DecoderStepFromContextBackend`]); call it only where [`crate::runtime::device::steps_from_context`]
/// holds.
///
/// # Shapes
/// - `fixed_context`: `[B, 1, d]`, `last_node_context`: `[B, N, d]`, `capacity_context`:
///   `[1, 1, d]`, `last_node` and `remaining`: `[B × S, 1]`, `by_feature`: as
///   [`fused_step`]'s, `mask`: `[B × S, N]`
/// - output: `[B × S, N]` log-probabilities, −∞ at masked nodes
#[allow(clippy::too_many_arguments)]
pub(crate) fn fused_step_from_context(
    [fixed_context, last_node_context, capacity_context]: [Tensor<3>; 3],
    last_node: Tensor<2, burn::tensor::Int>,
    remaining: Tensor<2>,
    by_feature: Tensor<3>,
    mask: Tensor<2, Bool>,
    heads: usize,
    tanh_clipping: f64,
    temperature: f64,
) -> Tensor<2> {
    #[cfg(feature = "cube")]
    {
        use burn::backend::Dispatch;
        let out = <Dispatch as DecoderStepFromContextBackend>::decoder_step_from_context(
            fixed_context.into_dispatch(),
            last_node_context.into_dispatch(),
            capacity_context.into_dispatch(),
            last_node.into_dispatch(),
            remaining.into_dispatch(),
            by_feature.into_dispatch(),
            mask.into_dispatch(),
            heads,
            tanh_clipping as f32,
            temperature as f32,
        );
        Tensor::from_dispatch(out)
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = (
            fixed_context,
            last_node_context,
            capacity_context,
            last_node,
            remaining,
        );
        let _ = (by_feature, mask, heads, tanh_clipping, temperature);
        unreachable!("no CubeCL backend is compiled in; check `steps_from_context` first")
    }
}

/// The fused step from each row's context on flex, with or without gradients (see
/// [`ContextStepBackend`]); call it only on flex.
///
/// # Shapes
/// - `fixed_context`: `[B, 1, d]`, `last_node_context`: `[B, N, d]`, `capacity_context`:
///   `[1, 1, d]`, `last_node` and `remaining`: `[B × S, 1]`; the tables, `by_feature` and
///   `mask` as [`fused_step`]'s; `compat_tables`: [`compat_tables`] of the same, or none
/// - output: `[B × S, N]` log-probabilities, −∞ at masked nodes
#[allow(clippy::too_many_arguments)]
pub(crate) fn fused_step_on_flex_from_context(
    [fixed_context, last_node_context, capacity_context]: [Tensor<3>; 3],
    (last_node, remaining): (Tensor<2, burn::tensor::Int>, Tensor<2>),
    (glimpse_keys, glimpse_values, logit_keys): (Tensor<4>, Tensor<4>, Tensor<3>),
    by_feature: Tensor<3>,
    mask: Tensor<2, Bool>,
    compat_tables: Option<Tensor<3>>,
    tanh_clipping: f64,
    temperature: f64,
) -> Tensor<2> {
    #[cfg(feature = "flex")]
    {
        use burn::backend::Dispatch;
        let [b, _, _] = last_node_context.dims();
        let compat_tables =
            compat_tables.unwrap_or_else(|| Tensor::zeros([b, 0, 8], &last_node_context.device()));
        let out = <Dispatch as ContextStepBackend>::decoder_step_from_context(
            fixed_context.into_dispatch(),
            last_node_context.into_dispatch(),
            capacity_context.into_dispatch(),
            last_node.into_dispatch(),
            remaining.into_dispatch(),
            glimpse_keys.into_dispatch(),
            glimpse_values.into_dispatch(),
            logit_keys.into_dispatch(),
            by_feature.into_dispatch(),
            mask.into_dispatch(),
            compat_tables.into_dispatch(),
            tanh_clipping as f32,
            temperature as f32,
        );
        Tensor::from_dispatch(out)
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (fixed_context, last_node_context, capacity_context);
        let _ = (
            last_node,
            remaining,
            glimpse_keys,
            glimpse_values,
            logit_keys,
        );
        let _ = (by_feature, mask, compat_tables, tanh_clipping, temperature);
        unreachable!("flex is not compiled in; check the route first")
    }
}

/// A decode's compatibility tables for flex's step from the context: per instance, each
/// node's context (`fixed + node ℓ`, what a row standing at ℓ adds to its query before
/// its remaining capacity) against every head's keys of every node, then the capacity's
/// weight row against them; lanes padded with zeros to a multiple of 8. With them a
/// multi-start step's compatibilities cost 2 H · N operations a row instead of N · d
/// (`flex_kernel::CompatTables`), and with gradients the step's backward pass gives the
/// tables' (2 H · N a row), which the steps add to one sum in place
/// (`flex_kernel::StepSums`) and autodiff takes back to the contexts and keys once, where
/// each step took two more N · d products a row.
///
/// # Shapes
/// - `fixed_context`: `[B, 1, d]`, `last_node_context`: `[B, N, d]`, `capacity_context`:
///   `[1, 1, d]`, `glimpse_keys`: `[B, N, H, dk]`
/// - output: `[B, (N + 1)·H, Np]`, Np = N rounded up to a multiple of 8
pub(crate) fn compat_tables(
    [fixed_context, last_node_context, capacity_context]: [Tensor<3>; 3],
    glimpse_keys: &Tensor<4>,
) -> Tensor<3> {
    let [b, n, heads, dk] = glimpse_keys.dims();
    let (d, np) = (heads * dk, n.div_ceil(8) * 8);
    let contexts = Tensor::cat(
        vec![
            fixed_context + last_node_context,
            capacity_context.expand([b, 1, d]),
        ],
        1,
    ); // [B, N + 1, d]
    let contexts = contexts.reshape([b, n + 1, heads, dk]).swap_dims(1, 2); // [B, H, N + 1, dk]
    let keys = glimpse_keys.clone().permute([0, 2, 3, 1]); // [B, H, dk, N]
    let compat = contexts.matmul(keys).swap_dims(1, 2); // [B, N + 1, H, N]
    let padding = Tensor::zeros([b, n + 1, heads, np - n], &compat.device());
    Tensor::cat(vec![compat, padding], 3).reshape([b, (n + 1) * heads, np])
}

/// Which steps a whole decode runs ([`fused_decode`]) and what it keeps: steps
/// `first..first + steps` (POMO's forced first step is the start state's, `first` = 1),
/// the chosen log-probabilities' sum, and what each step met (its mask and remaining
/// capacity fraction), for scoring the tours afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DecodeSpan {
    pub first: usize,
    pub steps: usize,
    pub log_likelihood: bool,
    pub record_seen: bool,
}

/// What each of a decode's K chosen steps met, for scoring its tours afterwards
/// (`AttentionModel::score_steps`).
pub(crate) struct SeenSteps {
    /// `[R, K, N]` the step's mask.
    pub mask: Tensor<3, Bool>,
    /// `[R, K]` the remaining capacity fraction.
    pub remaining: Tensor<2>,
    /// `[R, K]` where the step's context is read in the instances' node rows `[B × N, d]`:
    /// i · N + the node the row stood at (instance i).
    pub context_rows: Tensor<2, burn::tensor::Int>,
}

/// What [`fused_decode`] gives: the actions `[R, first + steps]`, the log-likelihood `[R]`
/// (zeros unless asked for), and where recorded, what each of the K steps met.
pub(crate) struct WholeDecode {
    pub actions: Tensor<2, burn::tensor::Int>,
    pub log_likelihood: Tensor<1>,
    pub seen: Option<SeenSteps>,
}

/// A whole decode without gradients as one kernel: from the state kernel's start (each
/// row's step to the depot from an empty route, then with `span.first` = 1 POMO's forced
/// step to customer s + 1), at every step of `span` [`fused_step_from_context`]'s step,
/// then the state kernel's choice and step (`CvrpState::choose_and_step`), comparing loads
/// as `loads` says (the noise `[R, T]` read at the step's column where the decode
/// samples). The same tours and log-likelihoods as those steps two launches each; call it
/// only where `crate::runtime::device::steps_from_context` holds.
pub(crate) fn fused_decode(
    [fixed_context, last_node_context, capacity_context]: [Tensor<3>; 3],
    by_feature: Tensor<3>,
    loads: crate::ops::state_step::Loads,
    noise: Option<Tensor<2>>,
    span: DecodeSpan,
    heads: usize,
    (tanh_clipping, temperature): (f64, f64),
) -> WholeDecode {
    #[cfg(feature = "cube")]
    {
        use burn::backend::Dispatch;
        let sample = noise.is_some();
        // Greedy reads no noise: any float tensor stands in.
        let noise = noise.unwrap_or_else(|| loads.capacity.clone());
        // The actions' and masks' types (allocations nothing reads).
        let device = loads.demands.device();
        let int_like = Tensor::<2, burn::tensor::Int>::empty([1, 1], &device);
        let bool_like = Tensor::<2, Bool>::empty([1, 1], &device);
        let (actions, log_likelihood, seen_mask, seen_remaining, seen_rows) =
            <Dispatch as DecoderStepFromContextBackend>::decode_from_context(
                fixed_context.into_dispatch(),
                last_node_context.into_dispatch(),
                capacity_context.into_dispatch(),
                by_feature.into_dispatch(),
                loads.demands.into_dispatch(),
                loads.capacity.into_dispatch(),
                noise.without_autodiff().into_dispatch(),
                int_like.into_dispatch(),
                bool_like.into_dispatch(),
                heads,
                tanh_clipping as f32,
                temperature as f32,
                loads.tolerance,
                sample,
                span.first,
                span.steps,
                span.log_likelihood,
                span.record_seen,
            );
        WholeDecode {
            actions: Tensor::from_dispatch(actions),
            log_likelihood: Tensor::from_dispatch(log_likelihood),
            seen: span.record_seen.then(|| SeenSteps {
                mask: Tensor::from_dispatch(seen_mask),
                remaining: Tensor::from_dispatch(seen_remaining),
                context_rows: Tensor::from_dispatch(seen_rows),
            }),
        }
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = (
            fixed_context,
            last_node_context,
            capacity_context,
            by_feature,
        );
        let _ = (loads, noise, span, heads, tanh_clipping, temperature);
        unreachable!("no CubeCL backend is compiled in; check `steps_from_context` first")
    }
}

/// How a multi-start decode on flex runs ([`decode_on_flex`]): at most `max_steps` steps,
/// with "all finished?" checks at steps `from, from + every, …` (`checks`), as the
/// step-by-step decode's loop stops; whether it sums the log-likelihood; its scale.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(
    not(feature = "flex"),
    allow(dead_code, reason = "read only where flex is compiled in")
)]
pub(crate) struct FlexDecodePlan {
    pub max_steps: usize,
    pub checks: (usize, usize),
    pub log_likelihood: bool,
    pub tanh_clipping: f64,
    pub temperature: f64,
}

/// A multi-start decode from compatibility tables on flex as one operation, instance by
/// instance, with or without gradients: the tours (`[R, T]`, POMO's forced first customer
/// first) and log-likelihoods (`[R]`) of the step-by-step decode with
/// [`fused_step_on_flex_from_context`]'s steps, bit for bit (`flex_decode`). Gradients
/// reach the glimpse values, logit keys and compatibility tables, as the steps' do.
///
/// # Shapes
/// - `glimpse_keys`, `glimpse_values`: `[B, N, H, dk]`, `logit_keys`: `[B, N, d]`,
///   `by_feature`: as [`fused_step`]'s, `compat_tables`: [`compat_tables`] of them
/// - `loads`: `[R, N]` and `[R, 1]`, R = B × S; `noise`: `[R, T']` for a sampled decode
/// - output: `[R, T]` actions in the device's int type, `[R]` log-likelihoods
pub(crate) fn decode_on_flex(
    (glimpse_keys, glimpse_values, logit_keys): (Tensor<4>, Tensor<4>, Tensor<3>),
    (by_feature, compat_tables): (Tensor<3>, Tensor<3>),
    loads: crate::ops::state_step::Loads,
    noise: Option<Tensor<2>>,
    plan: FlexDecodePlan,
) -> (Tensor<2, burn::tensor::Int>, Tensor<1>) {
    #[cfg(feature = "flex")]
    {
        use burn::backend::Dispatch;
        let device = loads.demands.device();
        let ints = device.settings().int_dtype;
        let sample = noise.is_some();
        // Greedy reads no noise: any float tensor stands in.
        let noise = noise.unwrap_or_else(|| loads.capacity.clone());
        let (actions, log_likelihood) = <Dispatch as DecodeOnFlexBackend>::decode_on_flex(
            glimpse_keys.into_dispatch(),
            glimpse_values.into_dispatch(),
            logit_keys.into_dispatch(),
            by_feature.into_dispatch(),
            compat_tables.into_dispatch(),
            loads.demands.into_dispatch(),
            loads.capacity.into_dispatch(),
            noise.without_autodiff().into_dispatch(),
            (loads.tolerance, sample),
            (plan.max_steps, plan.checks.0, plan.checks.1),
            plan.log_likelihood,
            (plan.tanh_clipping as f32, plan.temperature as f32),
        );
        let actions: Tensor<2, burn::tensor::Int> = Tensor::from_dispatch(actions);
        let actions = match ints {
            burn::tensor::IntDType::I64 => actions,
            other => actions.cast(other),
        };
        (actions, Tensor::from_dispatch(log_likelihood))
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (
            glimpse_keys,
            glimpse_values,
            logit_keys,
            by_feature,
            compat_tables,
        );
        let _ = (loads, noise, plan);
        unreachable!("flex is not compiled in; check the route first")
    }
}

/// Decode steps taken by [`decode_on_flex`]'s decodes, as the step-by-step decodes count
/// theirs, for a progress display.
pub(crate) fn decode_on_flex_steps() -> usize {
    #[cfg(feature = "flex")]
    return flex_decode::steps_taken();
    #[cfg(not(feature = "flex"))]
    0
}

#[cfg(any(feature = "flex", feature = "cube"))]
pub use extension::DecoderStepBackend;

#[cfg(any(feature = "flex", feature = "cube"))]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::{BoolTensor, FloatTensor};
    #[allow(unused_imports)] // in the Fusion metadata, when a CubeCL backend is compiled in
    use burn::tensor::Shape;

    /// The decoder step as a backend operation.
    #[backend_extension(
        Autodiff: cfg(feature = "autodiff"),
        Flex: cfg(feature = "flex"),
        Cube: cfg(feature = "cube"),
        Fusion: cfg(feature = "cube")
    )]
    pub trait DecoderStepBackend: burn::backend::Backend {
        /// See [`super::fused_step`].
        #[allow(clippy::too_many_arguments)]
        #[fusion(dtype = query, shape = Shape::new([query[0] * query[1], glimpse_keys[1]]))]
        fn decoder_step(
            query: FloatTensor<Self>,
            glimpse_keys: FloatTensor<Self>,
            glimpse_values: FloatTensor<Self>,
            logit_keys: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            mask: BoolTensor<Self>,
            tanh_clipping: f32,
            temperature: f32,
        ) -> FloatTensor<Self>;
    }
}

#[cfg(feature = "flex")]
pub use context_extension::ContextStepBackend;

#[cfg(feature = "flex")]
mod context_extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};

    /// The decoder step from each row's context on flex, with a backward: each row's query
    /// (the fixed context + its node's context row + its remaining capacity fraction · the
    /// capacity's weight row) made inside the operation, and the gradients of those three
    /// tensors summed inside its backward, where Burn's operations took a `select`, a
    /// product, two sums and their backward a step (`flex_context`).
    #[backend_extension(Autodiff: cfg(feature = "autodiff"), Flex: cfg(feature = "flex"))]
    pub trait ContextStepBackend: burn::backend::Backend {
        /// See [`super::fused_step_on_flex_from_context`].
        #[allow(clippy::too_many_arguments)]
        fn decoder_step_from_context(
            fixed_context: FloatTensor<Self>,
            last_node_context: FloatTensor<Self>,
            capacity_context: FloatTensor<Self>,
            last_node: IntTensor<Self>,
            remaining: FloatTensor<Self>,
            glimpse_keys: FloatTensor<Self>,
            glimpse_values: FloatTensor<Self>,
            logit_keys: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            mask: BoolTensor<Self>,
            compat_tables: FloatTensor<Self>,
            tanh_clipping: f32,
            temperature: f32,
        ) -> FloatTensor<Self>;
    }
}

#[cfg(feature = "flex")]
pub use decode_extension::DecodeOnFlexBackend;

#[cfg(feature = "flex")]
mod decode_extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::{FloatTensor, IntTensor};

    /// A multi-start decode from compatibility tables on flex, with a backward.
    #[backend_extension(Autodiff: cfg(feature = "autodiff"), Flex: cfg(feature = "flex"))]
    pub trait DecodeOnFlexBackend: burn::backend::Backend {
        /// See [`super::decode_on_flex`]: `(tolerance, sample)`, `(max_steps, checks from,
        /// checks every)`, `(tanh_clipping, temperature)`; the actions as i64.
        #[allow(clippy::too_many_arguments)]
        fn decode_on_flex(
            glimpse_keys: FloatTensor<Self>,
            glimpse_values: FloatTensor<Self>,
            logit_keys: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            compat_tables: FloatTensor<Self>,
            demands: FloatTensor<Self>,
            capacity: FloatTensor<Self>,
            noise: FloatTensor<Self>,
            loads: (f32, bool),
            steps: (usize, usize, usize),
            log_likelihood: bool,
            scale: (f32, f32),
        ) -> (IntTensor<Self>, FloatTensor<Self>);
    }
}

#[cfg(feature = "cube")]
pub use cube::DecoderStepFromContextBackend;

#[cfg(feature = "cube")]
mod cube;

#[cfg(feature = "flex")]
mod flex;
