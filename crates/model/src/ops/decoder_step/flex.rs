use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::tensor::{BoolTensor, FloatTensor};
use burn::backend::Flex;
use burn_flex::FlexTensor;

use super::flex_kernel::{self, Dims, Inputs, Saved, Scale};
use super::DecoderStepBackend;
use crate::ops::row_kernels::{floats, tensor};

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

    /// Log-probabilities `[R, N]` alone: a step no backward pass will read.
    fn log_probs(&self) -> FlexTensor {
        let log_probs = flex_kernel::log_probs(self.dims, self.scale, &self.inputs());
        let rows = self.dims.instances * self.dims.starts;
        tensor(log_probs, [rows, self.dims.nodes])
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
        StepTensors::new(inputs, [by_feature, mask], scale).log_probs()
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
            OpsKind::UnTracked(prep) => prep.finish(step.log_probs()),
        }
    }
}
