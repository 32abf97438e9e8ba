use burn::backend::autodiff::checkpoint::{base::Checkpointer, strategy::CheckpointStrategy};
use burn::backend::autodiff::grads::Gradients;
use burn::backend::autodiff::ops::{Backward, Ops, OpsKind};
use burn::backend::autodiff::Autodiff;
use burn::backend::tensor::{BoolTensor, FloatTensor, IntTensor};
use burn::backend::Flex;
use burn_flex::FlexTensor;

use super::flex_context::{self, ContextDims, ContextIn};
use super::flex_decode;
use super::flex_kernel::{self, CompatTables, Dims, Inputs, Saved, Scale};
use super::{ContextStepBackend, DecodeOnFlexBackend, DecoderStepBackend};
use crate::ops::row_kernels::{floats, node_indices, tensor};

/// The step's inputs as contiguous flex tensors, kept for the backward pass.
#[derive(Debug, Clone)]
pub struct StepTensors {
    query: FlexTensor,
    glimpse_keys: FlexTensor,
    glimpse_values: FlexTensor,
    logit_keys: FlexTensor,
    by_feature: FlexTensor,
    mask: FlexTensor,
    /// Where the step is made from the context with compatibility tables: the tables
    /// `[B, (N + 1)·H, Np]` and each row's node and remaining capacity fraction.
    compat: Option<(FlexTensor, RowContexts)>,
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
            compat: None,
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
            compat: self.compat.as_ref().map(|(tables, rows)| CompatTables {
                tables: floats(tables),
                last_node: &rows.last_node,
                remaining: &rows.remaining,
            }),
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
    /// The inputs and the forward pass's intermediates.
    type State = (StepTensors, Saved);

    fn backward(
        self,
        ops: Ops<Self::State, 4>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let (step, saved) = ops.state;
        let grad_out = grads.consume::<Flex>(&ops.node).to_contiguous();
        let g = flex_kernel::backward(
            step.dims,
            step.scale,
            &step.inputs(),
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
                prep.finish((step, saved), log_probs)
            }
            OpsKind::UnTracked(prep) => prep.finish(step.log_probs()),
        }
    }
}

/// Each row's context, kept for the backward pass: the node it stands at and its
/// remaining capacity fraction, and the step's sizes.
#[derive(Debug, Clone)]
pub struct RowContexts {
    last_node: Vec<usize>,
    remaining: Vec<f32>,
    dims: ContextDims,
}

impl RowContexts {
    /// From `last_node` and `remaining` (`[R, 1]` each) and `last_node_context`'s `[B, N, d]`.
    fn new(last_node: FlexTensor, remaining: FlexTensor, nodes: &FlexTensor) -> Self {
        let [b, n, d] = dims3(nodes);
        let last_node = node_indices(&last_node.to_contiguous());
        let remaining = floats(&remaining.to_contiguous()).to_vec();
        let dims = ContextDims {
            instances: b,
            starts: last_node.len() / b.max(1),
            nodes: n,
            embed: d,
        };
        Self {
            last_node,
            remaining,
            dims,
        }
    }

    /// The rows' queries `[B, S, d]` from `[fixed, node rows, capacity row]`.
    fn queries(&self, [fixed, nodes, capacity]: [&FlexTensor; 3]) -> FlexTensor {
        let [fixed, nodes, capacity] = [fixed, nodes, capacity].map(|t| t.to_contiguous());
        let x = ContextIn {
            fixed: floats(&fixed),
            nodes: floats(&nodes),
            capacity: floats(&capacity),
            last_node: &self.last_node,
            remaining: &self.remaining,
        };
        let ContextDims {
            instances,
            starts,
            embed,
            ..
        } = self.dims;
        tensor(
            flex_context::queries(self.dims, &x),
            [instances, starts, embed],
        )
    }

    /// No queries, `[B, S, 0]`: what a step with compatibility tables reads of them.
    fn no_queries(&self) -> FlexTensor {
        tensor(Vec::new(), [self.dims.instances, self.dims.starts, 0])
    }

    /// Gradients `[fixed [B, 1, d], node rows [B, N, d], capacity row [1, 1, d]]` from the
    /// queries' `[R, d]`.
    fn grads(&self, d_query: &[f32]) -> [FlexTensor; 3] {
        let rows = (&self.last_node[..], &self.remaining[..]);
        let g = flex_context::context_grads(self.dims, rows, d_query);
        let ContextDims {
            instances: b,
            nodes: n,
            embed: d,
            ..
        } = self.dims;
        [
            tensor(g.fixed, [b, 1, d]),
            tensor(g.nodes, [b, n, d]),
            tensor(g.capacity, [1, 1, d]),
        ]
    }
}

/// The step's tensors from the context: its queries made, then as [`StepTensors`].
///
/// `compat_tables` (`[B, (N + 1)·H, Np]`, or `[B, 0, ·]` where the decode has none) are
/// the compatibilities the forward pass reads instead of the queries' products with the
/// keys ([`CompatTables`]), and then the backward pass gives their gradient in place of
/// the context's and the keys'. With them no query is made: nothing reads one (made, the
/// queries were ~3 MB written a CVRP100 step, in a training decode and an evaluation's).
fn context_step(
    [fixed, nodes, capacity]: [FlexTensor; 3],
    (last_node, remaining): (FlexTensor, FlexTensor),
    tables: [FlexTensor; 3],
    [by_feature, mask, compat_tables]: [FlexTensor; 3],
    scale: Scale,
) -> (StepTensors, RowContexts) {
    let rows = RowContexts::new(last_node, remaining, &nodes);
    let with_tables = compat_tables.layout().shape()[1] > 0;
    let query = match with_tables {
        true => rows.no_queries(),
        false => rows.queries([&fixed, &nodes, &capacity]),
    };
    let [keys, values, logit_keys] = tables;
    let mut step = StepTensors::new([query, keys, values, logit_keys], [by_feature, mask], scale);
    if with_tables {
        step.compat = Some((compat_tables.to_contiguous(), rows.clone()));
    }
    (step, rows)
}

impl ContextStepBackend for Flex {
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
    ) -> FloatTensor<Self> {
        let (step, _) = context_step(
            [fixed_context, last_node_context, capacity_context],
            (last_node, remaining),
            [glimpse_keys, glimpse_values, logit_keys],
            [by_feature, mask, compat_tables],
            Scale::new(tanh_clipping, temperature),
        );
        step.log_probs()
    }
}

#[derive(Debug)]
struct ContextStepBackward;

/// A tracked input's tensor, kept so that the backward pass can take out the gradient
/// summed for it so far ([`Gradients::remove`] asks for the tensor).
type Tracked = FloatTensor<Autodiff<Flex>>;

/// The inputs a decode's steps share whose gradients each step adds to in place
/// ([`flex_kernel::StepSums`]): the glimpse keys (where the step has no compatibility
/// tables), values, logit keys, and the tables.
type Shared = [Option<Tracked>; 4];

impl Backward<Flex, 7> for ContextStepBackward {
    /// The step's tensors, the rows' contexts, the forward pass's intermediates and the
    /// shared inputs.
    type State = (StepTensors, RowContexts, Saved, Shared);

    fn backward(
        self,
        ops: Ops<Self::State, 7>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let (step, rows, saved, shared) = ops.state;
        let grad_out = grads.consume::<Flex>(&ops.node).to_contiguous();
        let mut sums = shared.map(|input| sum_so_far(input?, grads));
        let g = {
            let mut slices = sums.iter_mut().map(|sum| sum.as_mut().and_then(own_floats));
            let mut next = || slices.next().expect("four");
            let sums = flex_kernel::StepSums {
                glimpse_keys: next(),
                glimpse_values: next(),
                logit_keys: next(),
                compat_tables: next(),
            };
            let saved = (&step.inputs(), &saved);
            flex_kernel::backward_adding(step.dims, step.scale, saved, floats(&grad_out), sums)
        };
        let shape = |t: &FlexTensor| t.layout().shape().clone();
        let [keys_sum, values_sum, logit_keys_sum, tables_sum] = sums;
        let values =
            values_sum.or_else(|| Some(tensor(g.glimpse_values, shape(&step.glimpse_values))));
        let logit_keys =
            logit_keys_sum.or_else(|| Some(tensor(g.logit_keys, shape(&step.logit_keys))));
        // With compatibility tables the context and the keys reach this step only through
        // them: their gradients are the tables' (once a decode, by autodiff), not these.
        let [fixed, nodes, capacity, keys] = match &step.compat {
            Some(_) => [None, None, None, None],
            None => {
                let [fixed, nodes, capacity] = rows.grads(&g.query);
                let keys =
                    keys_sum.unwrap_or_else(|| tensor(g.glimpse_keys, shape(&step.glimpse_keys)));
                [Some(fixed), Some(nodes), Some(capacity), Some(keys)]
            }
        };
        let compat_tables = step.compat.as_ref().map(|(tables, _)| {
            tables_sum.unwrap_or_else(|| tensor(g.compat_tables, shape(tables)))
        });
        let values = [
            fixed,
            nodes,
            capacity,
            keys,
            values,
            logit_keys,
            compat_tables,
        ];
        for (parent, grad) in ops.parents.into_iter().zip(values) {
            if let (Some(node), Some(grad)) = (parent, grad) {
                grads.register::<Flex>(node.id, grad);
            }
        }
    }
}

/// The gradient summed for `input` so far, taken out of `grads` where there is one that
/// this step can add to in place; one it cannot is left there (autodiff adds to it).
fn sum_so_far(input: Tracked, grads: &mut Gradients) -> Option<FlexTensor> {
    let mut sum = grads.remove::<Flex>(&input)?;
    if own_floats(&mut sum).is_some() {
        Some(sum)
    } else {
        grads.register::<Flex>(input.id(), sum);
        None
    }
}

/// A tensor's floats, where it owns them alone, whole and in order.
fn own_floats(t: &mut FlexTensor) -> Option<&mut [f32]> {
    let len = t.layout().shape().num_elements();
    let whole = t.layout().contiguous_offsets() == Some((0, len));
    if t.dtype() != burn::backend::DType::F32 || !whole {
        return None;
    }
    t.try_storage_mut::<f32>()
        .filter(|floats| floats.len() == len)
}

impl<C: CheckpointStrategy> ContextStepBackend for Autodiff<Flex, C> {
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
    ) -> FloatTensor<Self> {
        // `remaining` comes from the state and `by_feature` is a detached copy of the
        // tables: no gradient of their own.
        let with_tables = compat_tables.primitive().layout().shape()[1] > 0;
        let shared: Shared = [
            (!with_tables).then(|| glimpse_keys.clone()),
            Some(glimpse_values.clone()),
            Some(logit_keys.clone()),
            with_tables.then(|| compat_tables.clone()),
        ];
        let nodes = [
            fixed_context.node(),
            last_node_context.node(),
            capacity_context.node(),
            glimpse_keys.node(),
            glimpse_values.node(),
            logit_keys.node(),
            compat_tables.node(),
        ];
        let (step, rows) = context_step(
            [
                fixed_context.into_primitive(),
                last_node_context.into_primitive(),
                capacity_context.into_primitive(),
            ],
            (last_node, remaining.into_primitive()),
            [
                glimpse_keys.into_primitive(),
                glimpse_values.into_primitive(),
                logit_keys.into_primitive(),
            ],
            [
                by_feature.into_primitive(),
                mask,
                compat_tables.into_primitive(),
            ],
            Scale::new(tanh_clipping, temperature),
        );
        match ContextStepBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (log_probs, saved) = step.forward();
                prep.finish((step, rows, saved, shared), log_probs)
            }
            OpsKind::UnTracked(prep) => prep.finish(step.log_probs()),
        }
    }
}

/// A decode's inputs as contiguous flex tensors, kept for the backward pass.
#[derive(Debug)]
struct DecodeTensors {
    /// Glimpse keys, values, logit keys, by feature, compatibility tables.
    tables: [FlexTensor; 5],
    /// Demands `[R, N]`, capacity `[R, 1]`, noise `[R, T']`.
    loads: [FlexTensor; 3],
    tolerance: f32,
    sample: bool,
    plan: flex_decode::Plan,
}

/// [`DecodeOnFlexBackend::decode_on_flex`]'s arguments past the tensors.
type DecodeScalars = ((f32, bool), (usize, usize, usize), bool, (f32, f32));

impl DecodeTensors {
    fn new(tables: [FlexTensor; 5], loads: [FlexTensor; 3], scalars: DecodeScalars) -> Self {
        let ((tolerance, sample), (max_steps, from, every), log_likelihood, scale) = scalars;
        Self {
            tables: tables.map(|t| t.to_contiguous()),
            loads: loads.map(|t| t.to_contiguous()),
            tolerance,
            sample,
            plan: flex_decode::Plan {
                scale: Scale::new(scale.0, scale.1),
                max_steps,
                checks: (from, every),
                log_likelihood,
            },
        }
    }

    fn batch(&self) -> flex_decode::Batch<'_> {
        let [keys, values, logit_keys, by_feature, tables] = &self.tables;
        let [demands, capacity, noise] = &self.loads;
        let shape = keys.layout().shape();
        let (b, n, heads, head_dim) = (shape[0], shape[1], shape[2], shape[3]);
        let rows = capacity.layout().shape()[0];
        flex_decode::Batch {
            dims: Dims {
                instances: b,
                starts: rows / b.max(1),
                nodes: n,
                heads,
                head_dim,
            },
            glimpse_keys: floats(keys),
            glimpse_values: floats(values),
            logit_keys: floats(logit_keys),
            by_feature: floats(by_feature),
            tables: floats(tables),
            demands: floats(demands),
            capacity: floats(capacity),
            tolerance: self.tolerance,
            noise: self
                .sample
                .then(|| (floats(noise), noise.layout().shape()[1])),
        }
    }

    /// The decode, keeping what its backward pass needs where `keep`; its actions and
    /// log-likelihoods as tensors.
    fn decode(&self, keep: bool) -> (flex_decode::DecodeRun, FlexTensor, FlexTensor) {
        let run = flex_decode::decode(&self.batch(), &self.plan, keep);
        let rows = self.loads[1].layout().shape()[0];
        let (actions, log_likelihood) = run.outputs(rows);
        let actions = FlexTensor::new(
            burn::backend::Bytes::from_elems(actions),
            burn_flex::Layout::contiguous([rows, run.length].into()),
            burn::backend::DType::I64,
        );
        (run, actions, tensor(log_likelihood, [rows]))
    }
}

impl DecodeOnFlexBackend for Flex {
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
    ) -> (IntTensor<Self>, FloatTensor<Self>) {
        let tables = [
            glimpse_keys,
            glimpse_values,
            logit_keys,
            by_feature,
            compat_tables,
        ];
        let scalars = (loads, steps, log_likelihood, scale);
        let decode = DecodeTensors::new(tables, [demands, capacity, noise], scalars);
        let (_, actions, log_likelihood) = decode.decode(false);
        (actions, log_likelihood)
    }
}

/// A decode with gradients' inputs and runs, for its backward pass.
struct TrackedDecode {
    tensors: DecodeTensors,
    run: flex_decode::DecodeRun,
}

impl std::fmt::Debug for TrackedDecode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (f.debug_struct("TrackedDecode"))
            .field("tensors", &self.tensors)
            .field("length", &self.run.length)
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct DecodeBackward;

impl Backward<Flex, 3> for DecodeBackward {
    /// The decode's inputs and what its steps kept (shared: the state is cloned where
    /// autodiff needs a copy, and is ~1 GB at CVRP100).
    type State = std::sync::Arc<TrackedDecode>;

    fn backward(
        self,
        ops: Ops<Self::State, 3>,
        grads: &mut Gradients,
        _checkpointer: &mut Checkpointer,
    ) {
        let decode = ops.state;
        let grad = grads.consume::<Flex>(&ops.node).to_contiguous();
        let batch = decode.tensors.batch();
        let grads_of = decode
            .run
            .backward(&batch, decode.tensors.plan.scale, floats(&grad));
        let [_, values, logit_keys, _, tables] = &decode.tensors.tables;
        let shapes = [values, logit_keys, tables].map(|t| t.layout().shape().clone());
        for ((parent, g), shape) in ops.parents.into_iter().zip(grads_of).zip(shapes) {
            if let Some(node) = parent {
                grads.register::<Flex>(node.id, tensor(g, shape));
            }
        }
    }
}

impl<C: CheckpointStrategy> DecodeOnFlexBackend for Autodiff<Flex, C> {
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
    ) -> (IntTensor<Self>, FloatTensor<Self>) {
        // The keys reach the decode only through the tables; `by_feature` is a detached
        // copy, and the loads and noise come from the state: no gradients of their own.
        let nodes = [
            glimpse_values.node(),
            logit_keys.node(),
            compat_tables.node(),
        ];
        let tables = [
            glimpse_keys.into_primitive(),
            glimpse_values.into_primitive(),
            logit_keys.into_primitive(),
            by_feature.into_primitive(),
            compat_tables.into_primitive(),
        ];
        let loads_in = [demands, capacity, noise].map(|t| t.into_primitive());
        let scalars = (loads, steps, log_likelihood, scale);
        let tensors = DecodeTensors::new(tables, loads_in, scalars);
        match DecodeBackward
            .prepare::<C>(nodes)
            .compute_bound()
            .stateful()
        {
            OpsKind::Tracked(prep) => {
                let (run, actions, log_likelihood) = tensors.decode(true);
                let state = std::sync::Arc::new(TrackedDecode { tensors, run });
                (actions, prep.finish(state, log_likelihood))
            }
            OpsKind::UnTracked(prep) => {
                let (_, actions, log_likelihood) = tensors.decode(false);
                (actions, prep.finish(log_likelihood))
            }
        }
    }
}
