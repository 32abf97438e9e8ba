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
    use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
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
