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
//! ([`DecoderStepGradsBackend`]) so that Fusion can queue it. Elsewhere (ndarray) the
//! op-by-op form in `AttentionModel` runs; it stays the reference the tests compare
//! against.

mod by_feature;
#[cfg(any(feature = "cuda", feature = "cpu"))]
mod cube_decode;
#[cfg(any(feature = "cuda", feature = "cpu"))]
mod cube_kernel;
#[cfg(feature = "flex")]
mod flex_kernel;

pub(crate) use by_feature::keys_by_feature;

use burn::tensor::{Bool, Device, Tensor};

/// Which form a fused operation runs in: the decoder step (`model.decoder_step` in a
/// config) and the encoder's attention core (`model.encoder_attention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepKernel {
    /// The fused operation where the device's backend has one, else the op-by-op form.
    #[default]
    Fused,
    /// Burn's tensor operations, one by one (the reference).
    OpByOp,
}

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
            #[cfg(any(feature = "cuda", feature = "cpu"))]
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
#[cfg(any(feature = "flex", feature = "cuda", feature = "cpu"))]
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

#[cfg(not(any(feature = "flex", feature = "cuda", feature = "cpu")))]
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
/// [`DecoderStepFromContextBackend`]); call it only where [`crate::backend::steps_from_context`]
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
    #[cfg(any(feature = "cuda", feature = "cpu"))]
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
    #[cfg(not(any(feature = "cuda", feature = "cpu")))]
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
/// only where `crate::backend::steps_from_context` holds.
pub(crate) fn fused_decode(
    [fixed_context, last_node_context, capacity_context]: [Tensor<3>; 3],
    by_feature: Tensor<3>,
    loads: crate::state::Loads,
    noise: Option<Tensor<2>>,
    span: DecodeSpan,
    heads: usize,
    (tanh_clipping, temperature): (f64, f64),
) -> WholeDecode {
    #[cfg(any(feature = "cuda", feature = "cpu"))]
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
    #[cfg(not(any(feature = "cuda", feature = "cpu")))]
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

#[cfg(any(feature = "flex", feature = "cuda", feature = "cpu"))]
pub use extension::DecoderStepBackend;

#[cfg(any(feature = "flex", feature = "cuda", feature = "cpu"))]
mod extension {
    use burn::backend::backend_extension;
    use burn::backend::tensor::{BoolTensor, FloatTensor};
    #[allow(unused_imports)] // in the Fusion metadata, when a CubeCL backend is compiled in
    use burn::tensor::Shape;

    /// The decoder step as a backend operation.
    #[backend_extension(
        Autodiff: cfg(feature = "autodiff"),
        Flex: cfg(feature = "flex"),
        Cube: cfg(any(feature = "cuda", feature = "cpu")),
        Fusion: cfg(any(feature = "cuda", feature = "cpu"))
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

#[cfg(any(feature = "cuda", feature = "cpu"))]
pub use cube_impl::{DecoderStepFromContextBackend, DecoderStepGradsBackend};

#[cfg(any(feature = "cuda", feature = "cpu"))]
mod cube_impl {
    use burn::backend::backend_extension;
    use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};
    use burn::backend::TensorMetadata;
    #[allow(unused_imports)] // in the Fusion metadata
    use burn::tensor::Shape;
    use burn_cubecl::CubeBackend;

    use super::{cube_decode, cube_kernel, DecoderStepBackend};

    /// The step's backward pass on CubeCL, as its own operation: what the autodiff
    /// backward of [`DecoderStepBackend::decoder_step`] runs there.
    #[backend_extension(Cube, Fusion)]
    pub trait DecoderStepGradsBackend: burn::backend::Backend {
        /// The gradients of the query `[B, S, d]`, glimpse keys, glimpse values and logit
        /// keys (node-major, `[B, N, d]`) from the log-probabilities' gradient `grad_out`.
        #[allow(clippy::too_many_arguments, clippy::type_complexity)]
        #[fusion(meta = grads_metadata)]
        fn decoder_step_grads(
            query: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            mask: BoolTensor<Self>,
            log_probs: FloatTensor<Self>,
            grad_out: FloatTensor<Self>,
            heads: usize,
            nodes: usize,
            tanh_clipping: f32,
            temperature: f32,
        ) -> (
            FloatTensor<Self>,
            FloatTensor<Self>,
            FloatTensor<Self>,
            FloatTensor<Self>,
        );
    }

    /// The step's forward pass with each row's query made from its context inside the
    /// kernel: what a decode without gradients runs on CubeCL devices (the context's
    /// select, product and sums would be launches of their own).
    #[backend_extension(Cube, Fusion)]
    pub trait DecoderStepFromContextBackend: burn::backend::Backend {
        /// The log-probabilities `[B × S, N]` of [`DecoderStepBackend::decoder_step`] on
        /// the query `fixed_context` `[B, 1, d]` + (`last_node_context` `[B, N, d]` at each
        /// row's `last_node` `[B × S, 1]` + `remaining` `[B × S, 1]` · `capacity_context`
        /// `[1, 1, d]`).
        #[allow(clippy::too_many_arguments)]
        #[fusion(dtype = last_node_context, shape = Shape::new([mask[0], mask[1]]))]
        fn decoder_step_from_context(
            fixed_context: FloatTensor<Self>,
            last_node_context: FloatTensor<Self>,
            capacity_context: FloatTensor<Self>,
            last_node: IntTensor<Self>,
            remaining: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            mask: BoolTensor<Self>,
            heads: usize,
            tanh_clipping: f32,
            temperature: f32,
        ) -> FloatTensor<Self>;

        /// A whole decode without gradients in one kernel (`cube_decode::decode`): from the
        /// state kernel's start (its step to the depot, and with `first` = 1 POMO's forced
        /// step), steps `first..first + steps`, each the decoder step from its context, the
        /// choice (with `sample`, at the noise's column of the step) and the state's step,
        /// loads compared with `demands` `[B × S, N]` and `capacity` `[B × S, 1]`; the
        /// actions take `int_like`'s type and the masks `bool_like`'s. Returns the actions
        /// `[B × S, first + steps]`, the log-likelihood
        /// `[B × S]` (zeros unless `log_likelihood`), and with `record_seen` the mask
        /// `[B × S, steps, N]`, remaining capacity fraction and context row
        /// `[B × S, steps]` each step met (`super::SeenSteps`).
        #[allow(clippy::too_many_arguments, clippy::type_complexity)]
        #[fusion(meta = decode_metadata)]
        fn decode_from_context(
            fixed_context: FloatTensor<Self>,
            last_node_context: FloatTensor<Self>,
            capacity_context: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            demands: FloatTensor<Self>,
            capacity: FloatTensor<Self>,
            noise: FloatTensor<Self>,
            int_like: IntTensor<Self>,
            bool_like: BoolTensor<Self>,
            heads: usize,
            tanh_clipping: f32,
            temperature: f32,
            tolerance: f32,
            sample: bool,
            first: usize,
            steps: usize,
            log_likelihood: bool,
            record_seen: bool,
        ) -> (
            IntTensor<Self>,
            FloatTensor<Self>,
            BoolTensor<Self>,
            FloatTensor<Self>,
            IntTensor<Self>,
        );
    }

    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn decode_metadata(
        _fixed_context: &burn::backend::fusion::custom::TensorSpec,
        last_node_context: &burn::backend::fusion::custom::TensorSpec,
        _capacity_context: &burn::backend::fusion::custom::TensorSpec,
        _by_feature: &burn::backend::fusion::custom::TensorSpec,
        demands: &burn::backend::fusion::custom::TensorSpec,
        _capacity: &burn::backend::fusion::custom::TensorSpec,
        _noise: &burn::backend::fusion::custom::TensorSpec,
        int_like: &burn::backend::fusion::custom::TensorSpec,
        bool_like: &burn::backend::fusion::custom::TensorSpec,
        _heads: &usize,
        _tanh_clipping: &f32,
        _temperature: &f32,
        _tolerance: &f32,
        _sample: &bool,
        first: &usize,
        steps: &usize,
        log_likelihood: &bool,
        record_seen: &bool,
    ) -> (
        burn::backend::fusion::custom::TensorSpec,
        burn::backend::fusion::custom::TensorSpec,
        burn::backend::fusion::custom::TensorSpec,
        burn::backend::fusion::custom::TensorSpec,
        burn::backend::fusion::custom::TensorSpec,
    ) {
        use burn::backend::fusion::custom::TensorSpec;
        let [rows, nodes] = demands.shape.dims::<2>();
        let span = super::DecodeSpan {
            first: *first,
            steps: *steps,
            log_likelihood: *log_likelihood,
            record_seen: *record_seen,
        };
        let [actions, log_likelihood, seen_mask, seen_remaining, seen_rows] =
            super::cube_decode::output_shapes(&span, rows, nodes);
        let float = last_node_context.dtype;
        (
            TensorSpec::new(actions, int_like.dtype),
            TensorSpec::new(log_likelihood, float),
            TensorSpec::new(seen_mask, bool_like.dtype),
            TensorSpec::new(seen_remaining, float),
            TensorSpec::new(seen_rows, int_like.dtype),
        )
    }

    impl DecoderStepFromContextBackend for CubeBackend {
        fn decoder_step_from_context(
            fixed_context: FloatTensor<Self>,
            last_node_context: FloatTensor<Self>,
            capacity_context: FloatTensor<Self>,
            last_node: IntTensor<Self>,
            remaining: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            mask: BoolTensor<Self>,
            heads: usize,
            tanh_clipping: f32,
            temperature: f32,
        ) -> FloatTensor<Self> {
            let context = [
                fixed_context,
                last_node_context,
                capacity_context,
                remaining,
            ];
            let scale = (tanh_clipping, temperature);
            cube_kernel::forward_from_context(context, last_node, by_feature, mask, heads, scale)
        }

        fn decode_from_context(
            fixed_context: FloatTensor<Self>,
            last_node_context: FloatTensor<Self>,
            capacity_context: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            demands: FloatTensor<Self>,
            capacity: FloatTensor<Self>,
            noise: FloatTensor<Self>,
            int_like: IntTensor<Self>,
            bool_like: BoolTensor<Self>,
            heads: usize,
            tanh_clipping: f32,
            temperature: f32,
            tolerance: f32,
            sample: bool,
            first: usize,
            steps: usize,
            log_likelihood: bool,
            record_seen: bool,
        ) -> (
            IntTensor<Self>,
            FloatTensor<Self>,
            BoolTensor<Self>,
            FloatTensor<Self>,
            IntTensor<Self>,
        ) {
            let start = cube_decode::DecodeStart {
                demands,
                capacity,
                tolerance,
                noise,
                sample,
                int_like,
                bool_like,
            };
            let span = super::DecodeSpan {
                first,
                steps,
                log_likelihood,
                record_seen,
            };
            let context = [fixed_context, last_node_context, capacity_context];
            let scale = (tanh_clipping, temperature);
            let [actions, log_likelihood, seen_mask, seen_remaining, seen_rows] =
                cube_decode::decode(context, by_feature, start, span, heads, scale);
            (
                actions,
                log_likelihood,
                seen_mask,
                seen_remaining,
                seen_rows,
            )
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn grads_metadata(
        query: &burn::backend::fusion::custom::TensorSpec,
        _by_feature: &burn::backend::fusion::custom::TensorSpec,
        _mask: &burn::backend::fusion::custom::TensorSpec,
        _log_probs: &burn::backend::fusion::custom::TensorSpec,
        _grad_out: &burn::backend::fusion::custom::TensorSpec,
        _heads: &usize,
        nodes: &usize,
        _tanh_clipping: &f32,
        _temperature: &f32,
    ) -> (
        burn::backend::fusion::custom::TensorSpec,
        burn::backend::fusion::custom::TensorSpec,
        burn::backend::fusion::custom::TensorSpec,
        burn::backend::fusion::custom::TensorSpec,
    ) {
        use burn::backend::fusion::custom::TensorSpec;
        let [b, _, d] = query.shape.dims::<3>();
        let node_major = || TensorSpec::new(Shape::new([b, *nodes, d]), query.dtype);
        let query = TensorSpec::new(query.shape.clone(), query.dtype);
        (query, node_major(), node_major(), node_major())
    }

    impl DecoderStepBackend for CubeBackend {
        fn decoder_step(
            query: FloatTensor<Self>,
            glimpse_keys: FloatTensor<Self>,
            _glimpse_values: FloatTensor<Self>,
            _logit_keys: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            mask: BoolTensor<Self>,
            tanh_clipping: f32,
            temperature: f32,
        ) -> FloatTensor<Self> {
            let [_, nodes, heads, _] = glimpse_keys.shape().dims::<4>();
            let sizes = (heads, nodes);
            cube_kernel::forward(query, by_feature, mask, sizes, (tanh_clipping, temperature))
        }
    }

    impl DecoderStepGradsBackend for CubeBackend {
        fn decoder_step_grads(
            query: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            mask: BoolTensor<Self>,
            log_probs: FloatTensor<Self>,
            grad_out: FloatTensor<Self>,
            heads: usize,
            nodes: usize,
            tanh_clipping: f32,
            temperature: f32,
        ) -> (
            FloatTensor<Self>,
            FloatTensor<Self>,
            FloatTensor<Self>,
            FloatTensor<Self>,
        ) {
            let inputs = [query, by_feature, mask, log_probs, grad_out];
            let scale = (tanh_clipping, temperature);
            let [q, k, v, l] = cube_kernel::backward(inputs, (heads, nodes), scale);
            (q, k, v, l)
        }
    }

    #[cfg(feature = "autodiff")]
    mod autodiff {
        use burn::backend::autodiff::checkpoint::{
            base::Checkpointer, strategy::CheckpointStrategy,
        };
        use burn::backend::autodiff::grads::Gradients;
        use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
        use burn::backend::autodiff::Autodiff;
        use burn::backend::ops::FloatTensorOps;
        use burn::backend::tensor::{BoolTensor, FloatTensor};
        use burn::backend::{Cube, TensorMetadata};
        use burn::tensor::Shape;

        use super::{DecoderStepBackend, DecoderStepGradsBackend};

        /// What the backward pass reads: the query, the keys by feature, the mask, the
        /// output, the four float inputs' shapes and `(tanh_clipping, temperature)`.
        type State = (
            [FloatTensor<Cube>; 3],
            BoolTensor<Cube>,
            [Shape; 4],
            (f32, f32),
        );

        #[derive(Debug)]
        struct CubeStepBackward;

        impl Backward<Cube, 4> for CubeStepBackward {
            type State = State;

            fn backward(
                self,
                ops: Ops<Self::State, 4>,
                grads: &mut Gradients,
                _checkpointer: &mut Checkpointer,
            ) {
                let ([query, by_feature, log_probs], mask, shapes, (clip, temperature)) = ops.state;
                let grad_out = grads.consume::<Cube>(&ops.node);
                let [_, nodes, heads, _] = shapes[1].dims::<4>();
                let (q, k, v, l) = Cube::decoder_step_grads(
                    query,
                    by_feature,
                    mask,
                    log_probs,
                    grad_out,
                    heads,
                    nodes,
                    clip,
                    temperature,
                );
                let values = [q, k, v, l];
                for ((parent, grad), shape) in ops.parents.into_iter().zip(values).zip(shapes) {
                    if let Some(node) = parent {
                        grads.register::<Cube>(node.id, Cube::float_reshape(grad, shape));
                    }
                }
            }
        }

        impl<C: CheckpointStrategy> DecoderStepBackend for Autodiff<Cube, C> {
            fn decoder_step(
                query: FloatTensor<Self>,
                glimpse_keys: FloatTensor<Self>,
                glimpse_values: FloatTensor<Self>,
                logit_keys: FloatTensor<Self>,
                by_feature: FloatTensor<Self>,
                mask: BoolTensor<Self>,
                tanh_clipping: f32,
                temperature: f32,
            ) -> FloatTensor<Self> {
                let shapes = [
                    query.shape(),
                    glimpse_keys.shape(),
                    glimpse_values.shape(),
                    logit_keys.shape(),
                ];
                let nodes = [
                    query.node(),
                    glimpse_keys.node(),
                    glimpse_values.node(),
                    logit_keys.node(),
                ];
                let query = query.into_primitive();
                let by_feature = by_feature.into_primitive();
                let log_probs = Cube::decoder_step(
                    query.clone(),
                    glimpse_keys.into_primitive(),
                    glimpse_values.into_primitive(),
                    logit_keys.into_primitive(),
                    by_feature.clone(),
                    mask.clone(),
                    tanh_clipping,
                    temperature,
                );
                match CubeStepBackward
                    .prepare::<C>(nodes)
                    .compute_bound()
                    .stateful()
                {
                    OpsKind::Tracked(prep) => {
                        let state = (
                            [query, by_feature, log_probs.clone()],
                            mask,
                            shapes,
                            (tanh_clipping, temperature),
                        );
                        prep.finish(state, log_probs)
                    }
                    OpsKind::UnTracked(prep) => prep.finish(log_probs),
                }
            }
        }
    }
}

#[cfg(feature = "flex")]
mod flex_impl {
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
    use burn::backend::autodiff::grads::Gradients;
    use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
    use burn::backend::autodiff::Autodiff;
    use burn::backend::tensor::{BoolTensor, FloatTensor};
    use burn::backend::Flex;
    use burn_flex::FlexTensor;

    use super::flex_kernel::{self, Dims, Inputs, Saved, Scale};
    use super::DecoderStepBackend;
    use crate::row_kernels::{floats, tensor};

    /// The step's inputs as contiguous flex tensors, kept for the backward pass.
    #[derive(Debug, Clone)]
    pub struct StepTensors {
        query: FlexTensor,
        glimpse_keys: FlexTensor,
        glimpse_values: FlexTensor,
        logit_keys: FlexTensor,
        by_feature: FlexTensor,
        mask: FlexTensor,
        dims: Dims,
        scale: Scale,
    }

    impl StepTensors {
        fn new(
            [query, glimpse_keys, glimpse_values, logit_keys]: [FlexTensor; 4],
            [by_feature, mask]: [FlexTensor; 2],
            scale: Scale,
        ) -> Self {
            let [b, s, _] = dims3(&query);
            let shape = glimpse_keys.layout().shape();
            let (n, heads, head_dim) = (shape[1], shape[2], shape[3]);
            let contiguous = |t: FlexTensor| t.to_contiguous();
            Self {
                query: contiguous(query),
                glimpse_keys: contiguous(glimpse_keys),
                glimpse_values: contiguous(glimpse_values),
                logit_keys: contiguous(logit_keys),
                by_feature: contiguous(by_feature),
                mask: contiguous(mask),
                dims: Dims {
                    instances: b,
                    starts: s,
                    nodes: n,
                    heads,
                    head_dim,
                },
                scale,
            }
        }

        fn inputs(&self) -> Inputs<'_> {
            let mask_bytes = self.mask.layout().contiguous_offsets().expect("contiguous");
            Inputs {
                query: floats(&self.query),
                glimpse_keys: floats(&self.glimpse_keys),
                glimpse_values: floats(&self.glimpse_values),
                logit_keys: floats(&self.logit_keys),
                by_feature: floats(&self.by_feature),
                mask: &self.mask.storage::<u8>()[mask_bytes.0..mask_bytes.1],
            }
        }

        /// Log-probabilities `[R, N]` and what the backward pass needs.
        fn forward(&self) -> (FlexTensor, Saved) {
            let (log_probs, saved) = flex_kernel::forward(self.dims, self.scale, &self.inputs());
            let rows = self.dims.instances * self.dims.starts;
            (tensor(log_probs, [rows, self.dims.nodes]), saved)
        }
    }

    fn dims3(t: &FlexTensor) -> [usize; 3] {
        let s = t.layout().shape();
        [s[0], s[1], s[2]]
    }

    impl DecoderStepBackend for Flex {
        fn decoder_step(
            query: FloatTensor<Self>,
            glimpse_keys: FloatTensor<Self>,
            glimpse_values: FloatTensor<Self>,
            logit_keys: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            mask: BoolTensor<Self>,
            tanh_clipping: f32,
            temperature: f32,
        ) -> FloatTensor<Self> {
            let scale = Scale::new(tanh_clipping, temperature);
            let inputs = [query, glimpse_keys, glimpse_values, logit_keys];
            StepTensors::new(inputs, [by_feature, mask], scale)
                .forward()
                .0
        }
    }

    #[derive(Debug)]
    struct DecoderStepBackward;

    impl Backward<Flex, 4> for DecoderStepBackward {
        /// The inputs, the output and the forward pass's intermediates.
        type State = (StepTensors, FlexTensor, Saved);

        fn backward(
            self,
            ops: Ops<Self::State, 4>,
            grads: &mut Gradients,
            _checkpointer: &mut Checkpointer,
        ) {
            let (step, log_probs, saved) = ops.state;
            let grad_out = grads.consume::<Flex>(&ops.node).to_contiguous();
            let g = flex_kernel::backward(
                step.dims,
                step.scale,
                &step.inputs(),
                floats(&log_probs),
                &saved,
                floats(&grad_out),
            );
            let shapes = [
                step.query.layout().shape().clone(),
                step.glimpse_keys.layout().shape().clone(),
                step.glimpse_values.layout().shape().clone(),
                step.logit_keys.layout().shape().clone(),
            ];
            let values = [g.query, g.glimpse_keys, g.glimpse_values, g.logit_keys];
            for ((parent, grad), shape) in ops.parents.into_iter().zip(values).zip(shapes) {
                if let Some(node) = parent {
                    let t = tensor(grad, shape);
                    grads.register::<Flex>(node.id, t);
                }
            }
        }
    }

    impl<C: CheckpointStrategy> DecoderStepBackend for Autodiff<Flex, C> {
        fn decoder_step(
            query: FloatTensor<Self>,
            glimpse_keys: FloatTensor<Self>,
            glimpse_values: FloatTensor<Self>,
            logit_keys: FloatTensor<Self>,
            by_feature: FloatTensor<Self>,
            mask: BoolTensor<Self>,
            tanh_clipping: f32,
            temperature: f32,
        ) -> FloatTensor<Self> {
            let scale = Scale::new(tanh_clipping, temperature);
            // `by_feature` is detached (a copy of three of the inputs): no gradient of
            // its own.
            let nodes = [
                query.node(),
                glimpse_keys.node(),
                glimpse_values.node(),
                logit_keys.node(),
            ];
            let inputs = [
                query.into_primitive(),
                glimpse_keys.into_primitive(),
                glimpse_values.into_primitive(),
                logit_keys.into_primitive(),
            ];
            let step = StepTensors::new(inputs, [by_feature.into_primitive(), mask], scale);
            match DecoderStepBackward
                .prepare::<C>(nodes)
                .compute_bound()
                .stateful()
            {
                OpsKind::Tracked(prep) => {
                    let (log_probs, saved) = step.forward();
                    prep.finish((step, log_probs.clone(), saved), log_probs)
                }
                OpsKind::UnTracked(prep) => prep.finish(step.forward().0),
            }
        }
    }
}
