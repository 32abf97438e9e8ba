//! The attention model of Kool, van Hoof & Welling (2019), "Attention, Learn to Solve
//! Routing Problems!": the graph-transformer encoder and the pointer decoder, whole, in the
//! order a decode runs.
//!
//! 1. Encode the nodes once; precompute the glimpse keys and values, the logit keys and the
//!    projected graph embedding.
//! 2. Each step: context = graph projection + `Linear(d+1, d)` on [last node's embedding,
//!    remaining capacity]; an 8-head glimpse over the unmasked nodes; single-head logits
//!    clipped to C·tanh(q·k/√d); masked log-softmax; pick a node; update the CVRP state.
//!
//! The step loop itself (state, selection, completion checks, host syncs) is shared with
//! the pointer network: see `decode::rollout`.

use std::sync::OnceLock;

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::{Device, Int, Tensor};

use crate::model::decode::{
    cat_columns, repeat_rows, rollout, sampling_noise, DecodeOptions, DecodeOutput, Policy,
};
use crate::model::encoder::{GraphEncoder, GraphEncoderConfig};
use crate::model::problem::{max_decode_steps, DeviceBatch};
use crate::model::state::{CvrpState, LoadArithmetic};
use crate::ops::decoder_step::fused_on;
use crate::ops::decoder_step::{
    compat_tables, decode_on_flex, fused_decode, fused_step, fused_step_from_context,
    fused_step_on_flex_from_context, keys_by_feature, op_by_op, DecodeSpan, FlexDecodePlan,
    SeenSteps,
};
use crate::ops::linear::matmul_rows;
use crate::ops::linear::per_node;
use crate::ops::matmul::MatmulPrecision;
use crate::ops::state_step::Loads;
use crate::ops::StepKernel;
use crate::runtime::device::{steps_from_context, trains_through_cubecl};

#[derive(Config, Debug)]
pub struct AttentionModelConfig {
    #[config(default = "GraphEncoderConfig::new()")]
    pub encoder: GraphEncoderConfig,
    /// C in the logit clipping C·tanh(·).
    #[config(default = 10.0)]
    pub tanh_clipping: f64,
    /// How loads meet the capacity in the masks (Kool's published models: `Float32`).
    #[config(default = "LoadArithmetic::Exact")]
    pub load_arithmetic: LoadArithmetic,
    /// The fused decoder step where the backend has one, or Burn's ops one by one.
    #[config(default = "StepKernel::Fused")]
    pub decoder_step: StepKernel,
    /// The device's own matrix products (TF32 on CUDA's tensor cores), or f32 accuracy
    /// everywhere (three TF32 products each on CUDA).
    #[config(default = "MatmulPrecision::High")]
    pub matmul_precision: MatmulPrecision,
    /// How a decode with gradients runs on CubeCL devices.
    #[config(default = "GradientDecode::SampleThenScore")]
    pub gradient_decode: GradientDecode,
}

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
    /// Step by step, each step one fused operation: on flex (with or without gradients)
    /// from each row's context, the query made inside the operation; on CubeCL devices
    /// that record gradients step by step, from its query.
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
    /// Flex's fused step from the context, with or without gradients.
    FusedFromContextOnFlex,
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
            Self::FusedSteps { on_cubecl: false } => StepForm::FusedFromContextOnFlex,
            Self::FusedSteps { on_cubecl: true } | Self::SampleThenScore => StepForm::Fused,
            Self::FusedStepsFromContext | Self::OneLaunch => StepForm::FusedFromContext,
        }
    }
}

/// A decode's compatibility tables at most: 512 MiB (a batch of 64 CVRP100 instances'
/// are 21 MB; one CVRP1000 instance's 32 MB).
const COMPAT_TABLE_BYTES: usize = 512 << 20;

/// Whether a decode of `starts` rollouts per instance on `route` steps from compatibility
/// tables ([`compat_tables`]): on flex's step from the context, for a multi-start decode
/// (each instance's table, N² · d multiply-adds, is then paid back by its first two
/// steps), where the batch's tables fit [`COMPAT_TABLE_BYTES`].
fn uses_compat_tables(route: DecodeRoute, [b, n, heads]: [usize; 3], starts: usize) -> bool {
    let bytes = b * (n + 1) * heads * n.div_ceil(8) * 8 * 4;
    route.step() == StepForm::FusedFromContextOnFlex && starts > 1 && bytes <= COMPAT_TABLE_BYTES
}

impl AttentionModelConfig {
    pub fn init(&self, device: &Device) -> AttentionModel {
        let d = self.encoder.embed_dim;
        let no_bias = |i, o| LinearConfig::new(i, o).with_bias(false).init(device);
        AttentionModel {
            encoder: self.encoder.init(device),
            project_node_embeddings: no_bias(d, 3 * d),
            project_fixed_context: no_bias(d, d),
            project_step_context: no_bias(d + 1, d),
            project_out: no_bias(d, d),
            num_heads: self.encoder.num_heads,
            tanh_clipping: self.tanh_clipping,
            load_arithmetic: self.load_arithmetic,
            step_kernel: self.decoder_step,
            matmul_precision: self.matmul_precision,
            gradient_decode: self.gradient_decode,
        }
    }
}

#[derive(Module, Debug)]
pub struct AttentionModel {
    encoder: GraphEncoder,
    /// Glimpse keys, glimpse values and logit keys from each node embedding.
    project_node_embeddings: Linear,
    /// The graph embedding's part of the query.
    project_fixed_context: Linear,
    /// [last node's embedding, remaining capacity] → the step's part of the query.
    project_step_context: Linear,
    /// Output projection of the multi-head glimpse.
    project_out: Linear,
    num_heads: usize,
    tanh_clipping: f64,
    #[module(skip)]
    load_arithmetic: LoadArithmetic,
    /// The fused decoder step where the backend has one (not saved: a run's numbers do
    /// not depend on it beyond float rounding).
    #[module(skip)]
    step_kernel: StepKernel,
    /// How the encoder's and the precomputation's products run where the device's
    /// matmuls round ([`MatmulPrecision::on`]; not saved, as above).
    #[module(skip)]
    matmul_precision: MatmulPrecision,
    /// How a decode with gradients runs on CubeCL devices (not saved, as above).
    #[module(skip)]
    gradient_decode: GradientDecode,
}

/// Everything the decoder reuses at every step, computed once per batch.
///
/// It is kept per instance, not per rollout: a multi-start decode's S rollouts of an
/// instance share it, and the step reads it as `[B, S, ·]` groups. The step's two linear
/// maps are folded in here, so a step runs no `[R, d] × [d, d]` product: the step context's
/// node part is projected for every node (a step gathers the row of the node it stands
/// at), and the glimpse's output projection is folded into the logit keys.
#[derive(Debug, Clone)]
pub struct Precomputed {
    /// `[B, 1, d]` projected graph embedding.
    fixed_context: Tensor<3>,
    /// `[B, N, d]` each node's part of the step context: `project_step_context` on its
    /// embedding, as if the vehicle stood there.
    last_node_context: Tensor<3>,
    /// `[1, 1, d]` the remaining capacity's part of the step context (its weight row).
    capacity_context: Tensor<3>,
    /// `[B, N, H, dk]` glimpse keys, already divided by √dk.
    glimpse_keys: Tensor<4>,
    /// `[B, N, H, dk]` glimpse values.
    glimpse_values: Tensor<4>,
    /// `[B, N, d]` logit keys, divided by √d and taken back through `project_out`: the
    /// logits are the heads' concatenated outputs against these.
    logit_keys: Tensor<3>,
    /// `[B, 3d, Np]` the three above by feature, for the fused step (where the route
    /// runs it).
    by_feature: Option<Tensor<3>>,
    /// `[B, (N + 1)·H, Np]` every compatibility a multi-start decode on flex can meet
    /// ([`compat_tables`]), where [`uses_compat_tables`] says.
    compat_tables: Option<Tensor<3>>,
    /// How the decode runs, decided once with the precomputation.
    route: DecodeRoute,
    /// Rollouts per instance: S = n for a multi-start decode (or its fewer starts), else 1.
    starts: usize,
    /// The products' precision on this device, for the op-by-op multi-start step.
    precision: MatmulPrecision,
    /// `[B × S]` the first flattened node row of each rollout's instance (i · N): a step
    /// picks its last node's context row by `select`, a contiguous row copy, where a
    /// `gather` of `[B, S, d]` indices reads one index per float. Made at the first
    /// [`Precomputed::query`]: a decode that steps from its context never reads it, and
    /// on CubeCL an arange is three launches.
    row_offsets: OnceLock<Tensor<1, Int>>,
}

impl Precomputed {
    /// The queries of rows standing at `last` (each instance's S rollouts, K steps each):
    /// the fixed context + (the node's context row + the remaining capacity fraction · the
    /// capacity's weight row).
    ///
    /// # Shapes
    /// - `last`: `[R, K]` node indices, R = B × S; `remaining`: `[B, S·K, 1]`
    /// - output: `[B, S·K, d]`, row s·K + k of instance b for rollout s at step k
    fn query(&self, last: Tensor<2, Int>, remaining: Tensor<3>) -> Tensor<3> {
        self.query_at(self.context_rows(last), remaining)
    }

    /// Where the contexts of rows standing at `last` are read in the instances' node rows
    /// `[B × N, d]`: i · N + the node, for instance i.
    ///
    /// # Shapes
    /// - `last`: `[R, K]` node indices → `[R, K]`
    fn context_rows(&self, last: Tensor<2, Int>) -> Tensor<2, Int> {
        let [_, n, _] = self.last_node_context.dims();
        let [rows, _] = last.dims();
        let row_offsets = self.row_offsets.get_or_init(|| {
            Tensor::<1, Int>::arange(0..rows as i64, &last.device())
                .div_scalar(self.starts as i64)
                .mul_scalar(n as i64)
        }); // [R]
        last + row_offsets.clone().reshape([rows, 1])
    }

    /// [`Self::query`] from the rows ([`Self::context_rows`]) the contexts are read at.
    ///
    /// # Shapes
    /// - `context_rows`: `[R, K]`; `remaining`: `[B, S·K, 1]` → `[B, S·K, d]`
    fn query_at(&self, context_rows: Tensor<2, Int>, remaining: Tensor<3>) -> Tensor<3> {
        let [b, n, d] = self.last_node_context.dims();
        let [rows, k] = context_rows.dims();
        let last_context = self
            .last_node_context
            .clone()
            .reshape([b * n, d])
            .select(0, context_rows.reshape([rows * k]))
            .reshape([b, self.starts * k, d]); // [B, S·K, d]
        let step_context = last_context + remaining * self.capacity_context.clone(); // [B, S·K, d]
        self.fixed_context.clone() + step_context
    }

    /// `[fixed, last node, capacity]` contexts: what a step's query is made from.
    fn context(&self) -> [Tensor<3>; 3] {
        [
            self.fixed_context.clone(),
            self.last_node_context.clone(),
            self.capacity_context.clone(),
        ]
    }

    /// The same tensors outside autodiff: what a decode that records no gradient reads.
    fn without_autodiff(&self) -> Self {
        Self {
            fixed_context: self.fixed_context.clone().without_autodiff(),
            last_node_context: self.last_node_context.clone().without_autodiff(),
            capacity_context: self.capacity_context.clone().without_autodiff(),
            glimpse_keys: self.glimpse_keys.clone().without_autodiff(),
            glimpse_values: self.glimpse_values.clone().without_autodiff(),
            logit_keys: self.logit_keys.clone().without_autodiff(),
            by_feature: self.by_feature.clone().map(|t| t.without_autodiff()),
            compat_tables: self.compat_tables.clone().map(|t| t.without_autodiff()),
            route: self.route,
            starts: self.starts,
            precision: self.precision,
            row_offsets: OnceLock::new(),
        }
    }
}

impl AttentionModel {
    /// Encodes the batch and decodes a full solution for every instance (or, with
    /// multi-start, one per instance and first customer).
    ///
    /// # Shapes
    /// - output `actions`: `[R, T]`, `log_likelihood`: `[R]`, R = B × rows per instance
    pub fn decode(&self, problem: &DeviceBatch, options: &DecodeOptions) -> DecodeOutput {
        self.decode_following(problem, options, None)
    }

    /// Scores given tours: the decode takes each instance's tour (node indices as
    /// [`DecodeOutput::actions`], depot-padded) instead of choosing, and returns their
    /// log-likelihoods. Two backends compared on the same tours differ only by their
    /// arithmetic, however a near-tie turns their greedy choices.
    ///
    /// # Shapes
    /// - `tours`: `[B, T']` → output `actions`: `[B, T]`, `log_likelihood`: `[B]`
    pub fn follow(&self, problem: &DeviceBatch, tours: &Tensor<2, Int>) -> DecodeOutput {
        self.decode_following(problem, &DecodeOptions::greedy(), Some(tours))
    }

    fn decode_following(
        &self,
        problem: &DeviceBatch,
        options: &DecodeOptions,
        tours: Option<&Tensor<2, Int>>,
    ) -> DecodeOutput {
        let precision = self.matmul_precision.on(&problem.coords.device());
        self.decode_at(problem, options, tours, precision)
    }

    /// [`Self::decode_following`] with the products at `precision` whatever the device
    /// (the tests split them on the CPU): encode, precompute, decide the route, decode.
    pub(crate) fn decode_at(
        &self,
        problem: &DeviceBatch,
        options: &DecodeOptions,
        tours: Option<&Tensor<2, Int>>,
        precision: MatmulPrecision,
    ) -> DecodeOutput {
        let n = problem.num_nodes() - 1;
        let (demands, capacity) = (problem.demands.clone(), problem.capacity.clone());
        let node_embeddings =
            self.encoder
                .forward(problem.coords.clone(), demands, capacity, precision); // [B, N, d]
        let route = self.route(&node_embeddings, tours.is_some());
        let starts = options.rows_per_instance(n);
        let pre = self.precompute_on(node_embeddings, starts, precision, route);
        match route {
            DecodeRoute::SampleThenScore => self.sample_then_score(problem, options, &pre),
            DecodeRoute::OneLaunch => self.decode_in_one_launch(problem, options, &pre, false).0,
            // Flex's steps from compatibility tables (a multi-start decode): all of them
            // in one operation, instance by instance.
            _ if pre.compat_tables.is_some() && tours.is_none() => {
                self.decode_on_flex(problem, options, &pre)
            }
            _ => rollout(problem, options, self.load_arithmetic, tours, |state| {
                self.step_log_probs(&pre, state, options.temperature())
            }),
        }
    }

    /// The route of a decode from these node embeddings (`[B, N, d]`) on their device.
    fn route(&self, node_embeddings: &Tensor<3>, following: bool) -> DecodeRoute {
        let [_, nodes, d] = node_embeddings.dims();
        let inputs = RouteInputs {
            step_kernel: self.step_kernel,
            gradient_decode: self.gradient_decode,
            size: [nodes, self.num_heads, d],
            following,
        };
        DecodeRoute::decide(&node_embeddings.device(), inputs)
    }

    /// A decode with gradients on a CubeCL device: the tours sampled outside autodiff, then
    /// their log-likelihood as one differentiable decoder step over every step's rows.
    ///
    /// Step by step, each decode step was a dozen tracked operations and as many again in
    /// the backward (the context's select and the chosen log-probability's gather each
    /// scatter into zeros; every use of a precomputed tensor adds a gradient), and on a
    /// GPU every one is a launch. Once the tours are known, every step's context, mask and
    /// chosen node are too, and the steps' rows are independent: one decoder step over
    /// them all gives the same log-probabilities, and its backward runs once. The sampling
    /// pass costs one more forward decoder step per step, which a GPU does in a launch it
    /// would have paid anyway.
    fn sample_then_score(
        &self,
        problem: &DeviceBatch,
        options: &DecodeOptions,
        pre: &Precomputed,
    ) -> DecodeOutput {
        let temperature = options.temperature();
        let frozen = pre.without_autodiff();
        let (problem, options) = (problem.without_autodiff(), options.without_log_likelihood());
        let (sampled, seen) = match pre.route {
            DecodeRoute::SampleThenScore => {
                let (sampled, seen) = self.decode_in_one_launch(&problem, &options, &frozen, true);
                (sampled, seen.expect("a decode that records what it met"))
            }
            // Step by step, recording what each step met: the same tours and records where
            // no one-launch decode runs (the tests score flex's fused step this way).
            _ => self.sample_step_by_step(&problem, &options, (pre, &frozen)),
        };
        let log_likelihood = self.score_steps(pre, &sampled.actions, seen, temperature);
        DecodeOutput {
            log_likelihood,
            ..sampled
        }
    }

    /// A decode without gradients (on `frozen`, `pre` outside autodiff) step by step that
    /// records what each of its K steps met (its mask, remaining capacity and context row in
    /// `pre`), as the one-launch decode does.
    fn sample_step_by_step(
        &self,
        problem: &DeviceBatch,
        options: &DecodeOptions,
        (pre, frozen): (&Precomputed, &Precomputed),
    ) -> (DecodeOutput, SeenSteps) {
        let mut seen = Vec::new();
        let sampled = rollout(problem, options, self.load_arithmetic, None, |state| {
            seen.push((state.mask(), state.remaining_capacity_fraction()));
            self.step_log_probs(frozen, state, options.temperature())
        });
        let [rows, n] = seen[0].0.dims();
        let (masks, remaining): (Vec<_>, Vec<_>) = seen.into_iter().unzip();
        let k = masks.len();
        let seen = SeenSteps {
            mask: cat_columns(masks).reshape([rows, k, n]),
            remaining: cat_columns(remaining),
            context_rows: pre.context_rows(left_from(&sampled.actions, k)),
        };
        (sampled, seen)
    }

    /// A decode without gradients as one kernel (`fused_decode`, on the routes that run
    /// it: CubeCL devices): the tours and log-likelihoods of the decode one step at a time,
    /// which was a launch a step. With `record_seen`, also what each of its K chosen steps
    /// met.
    fn decode_in_one_launch(
        &self,
        problem: &DeviceBatch,
        options: &DecodeOptions,
        pre: &Precomputed,
        record_seen: bool,
    ) -> (DecodeOutput, Option<SeenSteps>) {
        let by_feature = pre.by_feature.clone().expect("a fused route");
        let n = problem.num_nodes() - 1;
        let starts = options.rows_per_instance(n);
        let loads = Loads::new(
            repeat_rows(problem.demands.clone(), starts),
            repeat_rows(problem.capacity.clone(), starts),
            self.load_arithmetic,
        );
        // POMO's forced first step is the kernel's own.
        let first = usize::from(options.multi_start);
        let span = DecodeSpan {
            first,
            steps: max_decode_steps(n) - first,
            log_likelihood: options.log_likelihood,
            record_seen,
        };
        let context = pre.context();
        let decoded = fused_decode(
            context,
            by_feature,
            loads,
            sampling_noise(problem, options),
            span,
            self.num_heads,
            (self.tanh_clipping, options.temperature()),
        );
        let output = DecodeOutput {
            actions: decoded.actions,
            log_likelihood: decoded.log_likelihood,
            rows_per_instance: pre.starts,
        };
        (output, decoded.seen)
    }

    /// A multi-start decode from compatibility tables on flex (`pre` has them), with or
    /// without gradients, as one operation ([`decode_on_flex`]): the step-by-step decode's
    /// tours and log-likelihoods, bit for bit.
    fn decode_on_flex(
        &self,
        problem: &DeviceBatch,
        options: &DecodeOptions,
        pre: &Precomputed,
    ) -> DecodeOutput {
        let n = problem.num_nodes() - 1;
        let loads = Loads::new(
            repeat_rows(problem.demands.clone(), pre.starts),
            repeat_rows(problem.capacity.clone(), pre.starts),
            self.load_arithmetic,
        );
        let plan = FlexDecodePlan {
            max_steps: max_decode_steps(n),
            checks: (problem.min_steps.max(1), options.check_every.max(1)),
            log_likelihood: options.log_likelihood,
            tanh_clipping: self.tanh_clipping,
            temperature: options.temperature(),
        };
        let keys = (
            pre.glimpse_keys.clone(),
            pre.glimpse_values.clone(),
            pre.logit_keys.clone(),
        );
        let tables = (
            pre.by_feature.clone().expect("a fused route"),
            pre.compat_tables.clone().expect("compatibility tables"),
        );
        let noise = sampling_noise(problem, options);
        let (actions, log_likelihood) = decode_on_flex(keys, tables, loads, noise, plan);
        DecodeOutput {
            actions,
            log_likelihood,
            rows_per_instance: pre.starts,
        }
    }

    /// The log-likelihood of decoded tours from what the decode met at each step: one fused
    /// decoder step over the rows of all of them (an instance's S rollouts times K steps).
    /// The context is the step's own arithmetic, in the same order.
    ///
    /// # Shapes
    /// - `actions`: `[R, T]`; `seen`: what each of the last K steps met (POMO's forced
    ///   first step is not scored)
    /// - output: `[R]`
    fn score_steps(
        &self,
        pre: &Precomputed,
        actions: &Tensor<2, Int>,
        seen: SeenSteps,
        temperature: f64,
    ) -> Tensor<1> {
        let [b, n, _] = pre.last_node_context.dims();
        let [rows, t] = actions.dims();
        let [_, k, _] = seen.mask.dims();
        let first = t - k;
        // Row (r, step) of the step's rows is r · K + step: an instance's S·K rows together.
        let mask = seen.mask.reshape([rows * k, n]); // [R·K, N]
        let remaining = seen.remaining.reshape([b, pre.starts * k, 1]); // [B, S·K, 1]
        let query = pre.query_at(seen.context_rows, remaining); // [B, S·K, d]
        let by_feature = pre.by_feature.clone().expect("scored with the fused step");
        let log_p = fused_step(
            query,
            pre.glimpse_keys.clone(),
            pre.glimpse_values.clone(),
            pre.logit_keys.clone(),
            by_feature,
            mask,
            self.tanh_clipping,
            temperature,
        ); // [R·K, N]
        let chosen = actions
            .clone()
            .slice_dim(1, first..t)
            .reshape([rows * k, 1]); // [R·K, 1]
        log_p
            .gather(1, chosen)
            .reshape([rows, k])
            .sum_dim(1)
            .reshape([rows]) // [R]
    }

    /// The encoder alone: node embeddings of the batch.
    ///
    /// # Shapes
    /// - output: `[B, N, d]`
    pub fn encode(&self, problem: &DeviceBatch) -> Tensor<3> {
        let precision = self.matmul_precision.on(&problem.coords.device());
        let (demands, capacity) = (problem.demands.clone(), problem.capacity.clone());
        self.encoder
            .forward(problem.coords.clone(), demands, capacity, precision)
    }

    /// The decoder's per-batch work, done once before the first step, for `starts`
    /// rollouts per instance.
    ///
    /// # Shapes
    /// - `node_embeddings`: `[B, N, d]`
    pub fn precompute(&self, node_embeddings: Tensor<3>, starts: usize) -> Precomputed {
        let precision = self.matmul_precision.on(&node_embeddings.device());
        let route = self.route(&node_embeddings, false);
        self.precompute_on(node_embeddings, starts, precision, route)
    }

    /// [`Self::precompute`] with the products at `p` whatever the device, for a decode on
    /// `route`.
    fn precompute_on(
        &self,
        node_embeddings: Tensor<3>,
        starts: usize,
        p: MatmulPrecision,
        route: DecodeRoute,
    ) -> Precomputed {
        let [b, n, d] = node_embeddings.dims();
        let heads = self.num_heads;
        let dk = d / heads;
        let graph_embedding = node_embeddings.clone().mean_dim(1).reshape([b, d]); // [B, d]
        let fixed_context =
            crate::ops::linear::forward(&self.project_fixed_context, graph_embedding, p)
                .reshape([b, 1, d]); // [B, 1, d]
        let projected = per_node(&self.project_node_embeddings, node_embeddings.clone(), p); // [B, N, 3d]

        // The keys are scaled here once rather than the compatibilities at every step.
        let glimpse_keys = projected
            .clone()
            .slice_dim(2, 0..d)
            .reshape([b, n, heads, dk])
            / (dk as f64).sqrt(); // [B, N, H, dk]

        let glimpse_values = projected
            .clone()
            .slice_dim(2, d..2 * d)
            .reshape([b, n, heads, dk]); // [B, N, H, dk]

        // `* 1.0` (exact) makes the slice of `projected` a contiguous tensor once here: as
        // a strided view, flex's fused step copied it whole at every decode step. CubeCL's
        // fused step reads only `by_feature`, whose kernel reads the view: there the copy
        // would be a launch for nothing.
        let glimpse_values = match route.reads_keys_by_feature_only() {
            true => glimpse_values,
            false => glimpse_values * 1.0,
        };

        // Linear layers here have no bias (Kool's too), so both folds are exact algebra.
        let step_weight = self.project_step_context.weight.val(); // [d + 1, d]
        let last_node_context = matmul_rows(
            node_embeddings.reshape([b * n, d]),
            step_weight.clone().slice_dim(0, 0..d),
            p,
        )
        .reshape([b, n, d]); // [B, N, d]
        let capacity_context = step_weight.slice_dim(0, d..d + 1).reshape([1, 1, d]); // [1, 1, d]
        let out_weight_t = self.project_out.weight.val().transpose(); // [d, d]
        let logit_keys = matmul_rows(
            (projected.slice_dim(2, 2 * d..3 * d) / (d as f64).sqrt()).reshape([b * n, d]),
            out_weight_t,
            p,
        )
        .reshape([b, n, d]); // [B, N, d]
        let by_feature = route
            .is_fused()
            .then(|| keys_by_feature(&glimpse_keys, &glimpse_values, &logit_keys));
        let compat_tables = uses_compat_tables(route, [b, n, heads], starts).then(|| {
            let contexts = [&fixed_context, &last_node_context, &capacity_context];
            compat_tables(contexts.map(Tensor::clone), &glimpse_keys)
        });
        Precomputed {
            fixed_context,
            last_node_context,
            capacity_context,
            glimpse_keys,
            glimpse_values,
            logit_keys,
            by_feature,
            compat_tables,
            route,
            starts,
            precision: p,
            row_offsets: OnceLock::new(),
        }
    }

    /// The model with its decoder step run in `kernel`'s form.
    pub fn with_step_kernel(mut self, kernel: StepKernel) -> Self {
        self.step_kernel = kernel;
        self
    }

    /// The model with its encoder's attention core run in `kernel`'s form.
    pub fn with_encoder_attention(mut self, kernel: StepKernel) -> Self {
        self.encoder = self.encoder.with_attention_kernel(kernel);
        self
    }

    /// The model with its decodes with gradients run as `how` on CubeCL devices.
    pub fn with_gradient_decode(mut self, how: GradientDecode) -> Self {
        self.gradient_decode = how;
        self
    }

    /// The model with its matrix products run at `precision`.
    pub fn with_matmul_precision(mut self, precision: MatmulPrecision) -> Self {
        self.matmul_precision = precision;
        self
    }

    /// Log-probabilities of the next node for every row (row `i * S + s` is instance i's
    /// rollout s), in the form the decode's route gives its steps.
    ///
    /// # Shapes
    /// - output: `[R, N]`, R = B × S, −∞ at masked nodes
    pub fn step_log_probs(
        &self,
        pre: &Precomputed,
        state: &CvrpState,
        temperature: f64,
    ) -> Tensor<2> {
        let [b, _, _] = pre.last_node_context.dims();
        let mask = state.mask(); // [R, N]
        let by_feature = || pre.by_feature.clone().expect("a fused route");
        if pre.route.step() == StepForm::FusedFromContext {
            let context = pre.context();
            return fused_step_from_context(
                context,
                state.last_node(),
                state.remaining_capacity_fraction(),
                by_feature(),
                mask,
                self.num_heads,
                self.tanh_clipping,
                temperature,
            );
        }
        if pre.route.step() == StepForm::FusedFromContextOnFlex {
            let context = pre.context();
            let rows = b * pre.starts;
            let remaining = state.remaining_capacity_fraction().reshape([rows, 1]);
            let tables = (
                pre.glimpse_keys.clone(),
                pre.glimpse_values.clone(),
                pre.logit_keys.clone(),
            );
            return fused_step_on_flex_from_context(
                context,
                (state.last_node(), remaining),
                tables,
                by_feature(),
                mask,
                pre.compat_tables.clone(),
                self.tanh_clipping,
                temperature,
            );
        }
        let remaining = state
            .remaining_capacity_fraction()
            .reshape([b, pre.starts, 1]); // [B, S, 1]
        let query = pre.query(state.last_node(), remaining); // [B, S, d]
        let (keys, values) = (pre.glimpse_keys.clone(), pre.glimpse_values.clone());
        let logit_keys = pre.logit_keys.clone();
        let clipping = self.tanh_clipping;
        match pre.route.step() {
            StepForm::Fused => fused_step(
                query,
                keys,
                values,
                logit_keys,
                by_feature(),
                mask,
                clipping,
                temperature,
            ),
            _ => op_by_op(
                query,
                keys,
                values,
                logit_keys,
                mask,
                clipping,
                temperature,
                pre.precision,
            ),
        }
    }
}

/// The node each of a decode's last K steps left from: the node chosen at the step before,
/// the depot at the first.
///
/// # Shapes
/// - `actions`: `[R, T]` → `[R, K]`
fn left_from(actions: &Tensor<2, Int>, k: usize) -> Tensor<2, Int> {
    let [rows, t] = actions.dims();
    match t - k {
        0 => Tensor::cat(
            vec![
                Tensor::zeros([rows, 1], &actions.device()),
                actions.clone().slice_dim(1, 0..t - 1),
            ],
            1,
        ),
        first => actions.clone().slice_dim(1, first - 1..t - 1),
    }
}

impl Policy for AttentionModel {
    fn decode(&self, problem: &DeviceBatch, options: &DecodeOptions) -> DecodeOutput {
        AttentionModel::decode(self, problem, options)
    }
}

#[cfg(test)]
mod tests {
    // A test that needs a backend not compiled in (flex, CubeCL's CPU runtime) returns
    // at its start: `testing::device_of` gives no device.
    use burn::tensor::activation::{log_softmax, softmax};
    use burn::tensor::TensorData;

    use super::*;
    use crate::model::decode::rollout;
    use crate::model::small_model;
    use crate::runtime::backend::Backend;
    use crate::runtime::testing::{self, device_of, one_cube_test_at_a_time};
    use crate::test_support::{read, read_ints};

    /// Kool's decoder step written as he does, with matmuls on transposed keys: the
    /// reference for the broadcast-and-sum form the model uses.
    fn reference_step(
        model: &AttentionModel,
        embeddings: Tensor<3>,
        state: &CvrpState,
    ) -> Tensor<2> {
        let [r, n, d] = embeddings.dims();
        let (heads, dk) = (model.num_heads, d / model.num_heads);
        let projected = model.project_node_embeddings.forward(embeddings.clone()); // [R, N, 3d]
        let keys_t = projected
            .clone()
            .slice_dim(2, 0..d)
            .reshape([r, n, heads, dk])
            .permute([0, 2, 3, 1]); // [R, H, dk, N]
        let values = projected
            .clone()
            .slice_dim(2, d..2 * d)
            .reshape([r, n, heads, dk])
            .swap_dims(1, 2); // [R, H, N, dk]
        let logit_keys_t = projected.slice_dim(2, 2 * d..3 * d).swap_dims(1, 2); // [R, d, N]
        let fixed = model
            .project_fixed_context
            .forward(embeddings.clone().mean_dim(1)); // [R, 1, d]
        let last = state.last_node().unsqueeze_dim::<3>(2).expand([r, 1, d]);
        let context = Tensor::cat(
            vec![
                embeddings.gather(1, last),
                state.remaining_capacity_fraction().unsqueeze_dim::<3>(2),
            ],
            2,
        ); // [R, 1, d + 1]
        let query = fixed + model.project_step_context.forward(context); // [R, 1, d]
        let mask = state.mask(); // [R, N]
        let q = query.reshape([r, 1, heads, dk]).swap_dims(1, 2); // [R, H, 1, dk]
        let compatibility = q.matmul(keys_t) / (dk as f64).sqrt(); // [R, H, 1, N]
        let head_mask = mask.clone().reshape([r, 1, 1, n]).expand([r, heads, 1, n]);
        let attention = softmax(compatibility.mask_fill(head_mask, f32::NEG_INFINITY), 3);
        let glimpse = model
            .project_out
            .forward(attention.matmul(values).swap_dims(1, 2).reshape([r, 1, d])); // [R, 1, d]
        let logits = glimpse.matmul(logit_keys_t).reshape([r, n]) / (d as f64).sqrt();
        let clipped = logits.tanh() * model.tanh_clipping;
        log_softmax(clipped.mask_fill(mask, f32::NEG_INFINITY), 1)
    }

    /// d = 16, 4 heads, one encoder layer.
    /// The same masked entries (−∞), and the others within 1e-5; some entry is masked.
    fn assert_log_probs_close(ours: &[f32], reference: &[f32]) {
        assert_eq!(ours.len(), reference.len());
        assert!(ours.iter().any(|x| x.is_infinite()), "some node is masked");
        for (i, (a, b)) in ours.iter().zip(reference).enumerate() {
            if b.is_infinite() {
                assert_eq!(a, b, "entry {i}: masked in the reference");
            } else {
                assert!((a - b).abs() < 1e-5, "entry {i}: {a} vs {b}");
            }
        }
    }

    #[test]
    fn decoder_step_matches_kools_matmul_form() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let model = small_model(&device);
        let (r, n, d) = (3, 6, 16);
        let values: Vec<f32> = (0..r * n * d)
            .map(|i| (i * 37 % 101) as f32 / 50.0 - 1.0)
            .collect();
        let embeddings = Tensor::<3>::from_data(TensorData::new(values, [r, n, d]), &device);
        // Capacity 10; after one step each row stands somewhere else with some load, so the
        // masks differ by row (the depot is open for rows away from it).
        let demands = Tensor::<2>::from_data(
            TensorData::new(
                vec![
                    0.0f32, 3.0, 4.0, 2.0, 9.0, 1.0, //
                    0.0, 8.0, 1.0, 1.0, 1.0, 1.0, //
                    0.0, 2.0, 2.0, 2.0, 2.0, 2.0,
                ],
                [r, n],
            ),
            &device,
        );
        let capacity = Tensor::<2>::from_data(TensorData::new(vec![10.0f32; r], [r, 1]), &device);
        let mut state = CvrpState::new(demands, capacity);
        state.step(Tensor::<2, Int>::from_data(
            TensorData::new(vec![2i64, 1, 5], [r, 1]),
            &device,
        ));

        let pre = model.precompute(embeddings.clone(), 1);
        let ours: Vec<f32> = model
            .step_log_probs(&pre, &state, 1.0)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        let reference: Vec<f32> = reference_step(&model, embeddings, &state)
            .into_data()
            .try_to_vec::<f32>()
            .unwrap();
        assert_log_probs_close(&ours, &reference);
    }

    /// The products split in three (`highest`, made to run on the CPU, whose products are
    /// exact already) decode as plain ones: the same tours, log-likelihoods within f32
    /// rounding. Greedy and multi-start, with the fused step and op by op (where the
    /// multi-start step's own products are split too).
    #[test]
    fn split_products_decode_as_plain_ones() {
        use routeburn_data::{Generator, InstanceRng};
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let batch = Generator::uniform(10).sample_batch(&mut InstanceRng::new(5), 6);
        let problem = DeviceBatch::upload(&batch, None, &device);
        for step in [StepKernel::Fused, StepKernel::OpByOp] {
            let model = small_model(&device).with_step_kernel(step);
            for multi_start in [false, true] {
                let options = DecodeOptions::greedy().with_multi_start(multi_start);
                let plain = model.decode(&problem, &options);
                let split = model.decode_at(&problem, &options, None, MatmulPrecision::Highest);
                let case = format!("{step:?}, multi-start {multi_start}");
                let tours = |o: &DecodeOutput| read_ints(o.actions.clone());
                assert_eq!(tours(&plain), tours(&split), "{case}");
                let (a, b) = (read(plain.log_likelihood), read(split.log_likelihood));
                for (x, y) in a.iter().zip(&b) {
                    assert!(
                        (x - y).abs() <= 1e-5 * x.abs().max(1.0),
                        "{case}: {x} vs {y}"
                    );
                }
            }
        }
    }

    /// `highest` runs where the device's matmuls round (CubeCL), and is `high` elsewhere.
    #[test]
    fn highest_splits_only_on_cubecl_devices() {
        // cuda is compiled in but cannot start without a GPU: skipped then.
        for (backend, device) in Backend::compiled()
            .into_iter()
            .filter_map(|b| b.device().ok().map(|d| (b, d)))
        {
            let expected = match backend {
                Backend::Cuda | Backend::Cpu => MatmulPrecision::Highest,
                Backend::Flex | Backend::Ndarray => MatmulPrecision::High,
            };
            assert_eq!(MatmulPrecision::Highest.on(&device), expected, "{backend}");
            assert_eq!(
                MatmulPrecision::High.on(&device),
                MatmulPrecision::High,
                "{backend}"
            );
        }
    }

    /// On CubeCL's CPU runtime `highest` runs the split products through CubeCL's matmul and
    /// fusion, as on CUDA: flex's plain decode's tours, log-likelihoods within f32 rounding.
    #[test]
    fn cube_decode_at_highest_matches_flex() {
        use burn::module::Module;
        use routeburn_data::{Generator, InstanceRng};
        let (Some(flex), Some(cpu)) = (device_of(Backend::Flex), device_of(Backend::Cpu)) else {
            return;
        };
        let _alone = one_cube_test_at_a_time();
        let batch = Generator::uniform(12).sample_batch(&mut InstanceRng::new(8), 5);
        let model = small_model(&flex);
        let split = model
            .clone()
            .to_device(&cpu)
            .with_matmul_precision(MatmulPrecision::Highest);
        for multi_start in [false, true] {
            let options = DecodeOptions::greedy().with_multi_start(multi_start);
            let plain = model.decode(&DeviceBatch::upload(&batch, None, &flex), &options);
            let ours = split.decode(&DeviceBatch::upload(&batch, None, &cpu), &options);
            // Each row's tour without its depot padding: CubeCL devices run all 2n steps.
            let tours = |o: &DecodeOutput| -> Vec<Vec<i64>> {
                let [_, t] = o.actions.dims();
                let data = o.actions.clone().into_data();
                let actions = data.try_into_vec_as::<i64>().unwrap();
                let trim = |row: &[i64]| {
                    row[..row.iter().rposition(|&a| a != 0).map_or(0, |p| p + 1)].to_vec()
                };
                actions.chunks(t).map(trim).collect()
            };
            assert_eq!(tours(&plain), tours(&ours), "multi-start {multi_start}");
            let (a, b) = (read(plain.log_likelihood), read(ours.log_likelihood));
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{x} vs {y}");
            }
        }
    }

    /// With the node projection zeroed every open node's logit is 0, so each greedy step
    /// is a tie among the open nodes, and the first open one wins (Burn's `argmax`): by
    /// hand, from the depot the lowest customer left, from a customer the depot, so each
    /// customer is a route of its own, in order. On CubeCL's CPU runtime, where the
    /// decoder step's cube chooses (its argmax in parts, joined in node order), and on
    /// flex.
    #[test]
    fn cube_greedy_ties_go_to_the_first_open_node() {
        use burn::module::Param;
        use routeburn_data::{Generator, InstanceRng};
        let (Some(_), Some(_)) = (device_of(Backend::Flex), device_of(Backend::Cpu)) else {
            return;
        };
        let _alone = one_cube_test_at_a_time();
        let n = 7;
        let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(4), 3);
        let mut expected: Vec<i64> = (1..=n as i64).flat_map(|c| [c, 0]).collect();
        expected.pop();
        for backend in [Backend::Flex, Backend::Cpu] {
            let device = backend.device().unwrap();
            let mut model = small_model(&device);
            let projection = &mut model.project_node_embeddings;
            projection.weight = Param::from_tensor(projection.weight.val().zeros_like());
            projection.bias = projection
                .bias
                .take()
                .map(|b| Param::from_tensor(b.val().zeros_like()));
            let output = model.decode(
                &DeviceBatch::upload(&batch, None, &device),
                &DecodeOptions::greedy(),
            );
            let [rows, t] = output.actions.dims();
            let actions = read_ints(output.actions);
            for row in actions.chunks(t) {
                let end = row.iter().rposition(|&a| a != 0).map_or(0, |p| p + 1);
                assert_eq!(row[..end], expected[..], "{backend:?}, {rows} rows");
            }
        }
    }

    /// The decode step by step, whatever the device (the reference `sample_then_score` is
    /// checked against).
    fn step_by_step(
        model: &AttentionModel,
        problem: &DeviceBatch,
        options: &DecodeOptions,
    ) -> DecodeOutput {
        let n = problem.num_nodes() - 1;
        let pre = model.precompute(model.encode(problem), options.rows_per_instance(n));
        rollout(problem, options, model.load_arithmetic, None, |state| {
            model.step_log_probs(&pre, state, options.temperature())
        })
    }

    /// Sampled tours scored in one step after the decode (what CubeCL devices train with)
    /// against the decode that scores each step as it goes: the same tours, the same
    /// log-likelihoods, and the same gradients of every parameter the decoder and encoder
    /// have, single- and multi-start (POMO's forced first step unscored).
    fn assert_scored_at_once_matches_step_by_step(device: &Device, n: usize) {
        use burn::module::Module;
        use routeburn_data::{Generator, InstanceRng};
        let model = small_model(device);
        let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(3), 5);
        for multi_start in [false, true] {
            let options = DecodeOptions::sample(1.0).with_multi_start(multi_start);
            let shape = crate::model::problem::NoiseShape {
                rows_per_instance: options.rows_per_instance(batch.n),
            };
            let upload = || {
                let mut rng = InstanceRng::new(17);
                DeviceBatch::upload(&batch, Some((shape, &mut rng)), device)
            };
            let reference = step_by_step(&model, &upload(), &options);
            let problem = upload();
            let n = problem.num_nodes() - 1;
            let pre = model.precompute(model.encode(&problem), options.rows_per_instance(n));
            assert!(pre.route.is_fused(), "{:?}", pre.route);
            let ours = model.sample_then_score(&problem, &options, &pre);
            let actions = |o: &DecodeOutput| read_ints(o.actions.clone());
            assert_eq!(
                actions(&ours),
                actions(&reference),
                "multi-start {multi_start}"
            );
            let (a, b) = (
                read(ours.log_likelihood.clone()),
                read(reference.log_likelihood.clone()),
            );
            for (x, y) in a.iter().zip(&b) {
                assert!((x - y).abs() <= 1e-5 * y.abs().max(1.0), "{x} vs {y}");
            }
            let grads = |ll: Tensor<1>| {
                let grads = ll.sum().backward();
                let mut all = Vec::new();
                model.visit(&mut crate::test_support::GradsOf::new(&grads, &mut all));
                all
            };
            let (ours, reference) = (grads(ours.log_likelihood), grads(reference.log_likelihood));
            assert!(!reference.is_empty());
            // Within 1e-4 of each tensor's largest entry, or 1e-5 of the largest of all: a
            // gradient that sums to ~0 (a bias before a normalization) is rounding alone.
            let largest = |t: &[f32]| t.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            let global = reference.iter().map(|r| largest(r)).fold(0.0f32, f32::max);
            assert!(global > 0.1, "gradients of {global}");
            for (k, (g, r)) in ours.iter().zip(&reference).enumerate() {
                let within = 1e-4 * largest(r) + 1e-5 * global;
                for (a, b) in g.iter().zip(r) {
                    assert!(
                        (a - b).abs() <= within,
                        "multi-start {multi_start}, parameter {k}: {a} vs {b}"
                    );
                }
            }
        }
    }

    // flex's fused step (ndarray has none).
    #[test]
    fn scored_at_once_matches_step_by_step() {
        let Some(device) = device_of(Backend::Flex) else {
            return;
        };
        assert_scored_at_once_matches_step_by_step(&device.autodiff(), 9);
    }

    testing::test_with_64_bit_offsets!(cube_scored_at_once_matches_step_by_step);

    /// [`assert_scored_at_once_matches_step_by_step`] on CubeCL's CPU runtime, where a
    /// training decode takes the scored form by itself.
    #[test]
    fn cube_scored_at_once_matches_step_by_step() {
        let Some(device) = device_of(Backend::Cpu).map(|d| d.autodiff()) else {
            return;
        };
        let _alone = one_cube_test_at_a_time();
        assert!(crate::runtime::device::trains_through_cubecl(&device));
        assert_scored_at_once_matches_step_by_step(&device, 9);
    }

    /// [`cube_scored_at_once_matches_step_by_step`] with more units a cube than the
    /// instances have nodes, as on a GPU (see [`cube_step_matches_op_by_op_with_idle_units`]):
    /// the sampling pass's record of what each step met, and the backward.
    #[test]
    fn cube_scored_at_once_matches_step_by_step_with_idle_units() {
        let given = testing::with_units(4, || {
            let device = Backend::Cpu.device().unwrap().autodiff();
            assert_scored_at_once_matches_step_by_step(&device, 2);
        });
        assert!(given.is_none_or(|given| given > 0));
    }

    testing::test_with_64_bit_offsets!(cube_decode_in_one_launch_matches_step_by_step);

    /// [`cube_decode_in_one_launch_matches_step_by_step`] with more units a cube than the
    /// instances have nodes, as on a GPU (see [`cube_step_matches_op_by_op_with_idle_units`]).
    #[test]
    fn cube_decode_in_one_launch_matches_step_by_step_with_idle_units() {
        let given = testing::with_units(4, || assert_decode_in_one_launch_matches_step_by_step(2));
        assert!(given.is_none_or(|given| given > 0));
    }

    /// On CubeCL's CPU runtime, a decode without gradients runs as one kernel: the same
    /// tours and log-likelihoods, bit for bit, as the decode one step at a time (a step's
    /// kernel, then the state kernel's choice and the running sum), greedy and sampled
    /// (at a temperature), one and several starts an instance.
    #[test]
    fn cube_decode_in_one_launch_matches_step_by_step() {
        assert_decode_in_one_launch_matches_step_by_step(9);
    }

    /// [`cube_decode_in_one_launch_matches_step_by_step`] on instances of `n` customers.
    fn assert_decode_in_one_launch_matches_step_by_step(n: usize) {
        use routeburn_data::{Generator, InstanceRng};
        let Some(device) = device_of(Backend::Cpu) else {
            return;
        };
        let _alone = one_cube_test_at_a_time();
        let model = small_model(&device);
        let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(5), 4);
        for multi_start in [false, true] {
            for options in [DecodeOptions::greedy(), DecodeOptions::sample(0.8)] {
                let options = options.with_multi_start(multi_start);
                let shape = crate::model::problem::NoiseShape {
                    rows_per_instance: options.rows_per_instance(batch.n),
                };
                let upload = || {
                    let mut rng = InstanceRng::new(21);
                    DeviceBatch::upload(&batch, Some((shape, &mut rng)), &device)
                };
                let problem = upload();
                let n = problem.num_nodes() - 1;
                let pre = model.precompute(model.encode(&problem), options.rows_per_instance(n));
                assert_eq!(pre.route, DecodeRoute::OneLaunch);
                let (ours, _) = model.decode_in_one_launch(&problem, &options, &pre, false);
                let reference = step_by_step(&model, &upload(), &options);
                let what = format!("{:?}, multi-start {multi_start}", options.selection);
                assert_eq!(
                    read_ints(ours.actions),
                    read_ints(reference.actions),
                    "{what}"
                );
                assert_eq!(
                    read(ours.log_likelihood),
                    read(reference.log_likelihood),
                    "{what}"
                );
            }
        }
    }

    /// A multi-start decode from the first K customers is the full one's rollouts from
    /// those customers: rollouts are independent given their instance, so greedily the
    /// same tours and log-likelihoods, bit for bit, on both of flex's step forms, though
    /// the full decode runs longer (its rows past their tours add exact zeros).
    #[test]
    fn fewer_starts_are_the_first_rollouts_of_every_start() {
        use routeburn_data::{Generator, InstanceRng};
        let device = Backend::first_on_host().unwrap().device().unwrap();
        // Instances on which the full decode's last tour ends after the first four's, and
        // where a sum of the log-probabilities over the record's columns (their order set
        // by the record's length) differed in the last bit.
        let n = 9;
        let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(97), 3);
        let problem = DeviceBatch::upload(&batch, None, &device);
        for kernel in [StepKernel::Fused, StepKernel::OpByOp] {
            let model = small_model(&device).with_step_kernel(kernel);
            let decode = |starts| {
                let options = DecodeOptions::greedy()
                    .with_multi_start(true)
                    .with_starts(starts);
                let out = model.decode(&problem, &options);
                let [_, t] = out.actions.dims();
                (read_ints(out.actions), read(out.log_likelihood), t)
            };
            let (all, all_ll, t) = decode(None);
            let (four, four_ll, t4) = decode(Some(4));
            assert_eq!(four_ll.len(), 3 * 4);
            assert!(
                t4 < t,
                "the case has the full decode run longer: {t4} < {t}"
            );
            for instance in 0..3 {
                for start in 0..4 {
                    let (row, ours) = (instance * n + start, instance * 4 + start);
                    let tour = &four[ours * t4..][..t4];
                    assert_eq!(tour[0] as usize, start + 1, "forced first customer");
                    // The shorter decode may stop earlier: the rest is depot padding.
                    let full = &all[row * t..][..t];
                    assert_eq!(&full[..t4], tour, "{kernel:?} row {row}");
                    assert!(full[t4..].iter().all(|&a| a == 0));
                    let (a, b) = (all_ll[row], four_ll[ours]);
                    assert_eq!(a.to_bits(), b.to_bits(), "{kernel:?} row {row}: {a} vs {b}");
                }
            }
        }
    }

    /// The multi-start decode on flex as one operation, instance by instance, against the
    /// step-by-step decode: the same tours and log-likelihoods and, with autodiff, the same
    /// gradients of every parameter, bit for bit. Greedy and sampled, every start and
    /// fewer, both load arithmetics; several instances, and one (whose rows the decode
    /// without gradients splits across threads). The loss weighs the rows unevenly, some
    /// by zero, as `reinforce.learn_from` does.
    #[test]
    fn decode_on_flex_matches_step_by_step() {
        use burn::module::Module;
        use routeburn_data::{Generator, InstanceRng};
        let Some(flex) = device_of(Backend::Flex) else {
            return;
        };
        let cases = [
            (flex.clone().autodiff(), 9, 5),
            (flex.clone(), 13, 1),
            (flex.clone().autodiff(), 20, 3),
        ];
        let options = [
            DecodeOptions::greedy(),
            DecodeOptions::sample(1.0),
            DecodeOptions::sample(0.7).with_starts(Some(4)),
            DecodeOptions::greedy().with_check_every(1),
        ];
        for (device, n, instances) in cases {
            let batch = Generator::uniform(n).sample_batch(&mut InstanceRng::new(5), instances);
            for arithmetic in [LoadArithmetic::Exact, LoadArithmetic::Float32] {
                let mut model = small_model(&device);
                model.load_arithmetic = arithmetic;
                for options in options.map(|o| o.with_multi_start(true)) {
                    let case = format!("n = {n}, {arithmetic:?}, {options:?}");
                    let shape = crate::model::problem::NoiseShape {
                        rows_per_instance: options.rows_per_instance(n),
                    };
                    let upload = || {
                        let mut rng = InstanceRng::new(17);
                        DeviceBatch::upload(&batch, Some((shape, &mut rng)), &device)
                    };
                    let pre = model.precompute(model.encode(&upload()), shape.rows_per_instance);
                    assert!(pre.compat_tables.is_some(), "{case}: the decode on flex");
                    let reference = step_by_step(&model, &upload(), &options);
                    let ours = model.decode(&upload(), &options);
                    let ints = |o: &DecodeOutput| read_ints(o.actions.clone());
                    assert_eq!(ints(&ours), ints(&reference), "{case}");
                    let bits = |t: Tensor<1>| read(t).iter().map(|x| x.to_bits()).collect();
                    let bits: [Vec<u32>; 2] =
                        [&ours, &reference].map(|o| bits(o.log_likelihood.clone()));
                    assert_eq!(bits[0], bits[1], "{case}");
                    if !device.is_autodiff() {
                        continue;
                    }
                    let grads = |ll: Tensor<1>| {
                        let rows = ll.dims()[0];
                        let weights: Vec<f32> =
                            (0..rows).map(|r| [0.0, 1.3, -0.7][r % 3]).collect();
                        let weights = Tensor::<1>::from_floats(weights.as_slice(), &device);
                        let grads = (ll * weights).sum().backward();
                        let mut all = Vec::new();
                        model.visit(&mut crate::test_support::GradsOf::new(&grads, &mut all));
                        all.concat().iter().map(|x| x.to_bits()).collect::<Vec<_>>()
                    };
                    let reference = grads(reference.log_likelihood);
                    assert!(reference.iter().any(|&g| g != 0), "{case}: no gradient");
                    assert!(grads(ours.log_likelihood) == reference, "{case}: gradients");
                }
            }
        }
    }

    /// A multi-start step reads each instance's keys for its S rollouts; the same step on
    /// embeddings repeated S times, one rollout each, is the reference.
    #[test]
    fn grouped_multi_start_step_matches_repeated_rows() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let model = small_model(&device);
        let (b, s, n, d) = (2, 3, 4, 16);
        let values: Vec<f32> = (0..b * n * d)
            .map(|i| (i * 29 % 97) as f32 / 40.0 - 1.2)
            .collect();
        let embeddings = Tensor::<3>::from_data(TensorData::new(values, [b, n, d]), &device);
        // Capacity 10, demands 3 each; rollout s of each instance has visited customer s + 1,
        // so every row has its own mask and load.
        let demands = Tensor::<2>::from_data(
            TensorData::new([0.0f32, 3.0, 3.0, 3.0].repeat(b * s), [b * s, n]),
            &device,
        );
        let capacity =
            Tensor::<2>::from_data(TensorData::new(vec![10.0f32; b * s], [b * s, 1]), &device);
        let mut state = CvrpState::new(demands, capacity);
        let first: Vec<i64> = (0..b * s).map(|row| (row % s) as i64 + 1).collect();
        state.step(Tensor::<2, Int>::from_data(
            TensorData::new(first, [b * s, 1]),
            &device,
        ));

        let read = |t: Tensor<2>| t.into_data().try_to_vec::<f32>().unwrap();
        let grouped =
            read(model.step_log_probs(&model.precompute(embeddings.clone(), s), &state, 1.0));
        let repeated = model.precompute(crate::model::decode::repeat_rows(embeddings, s), 1);
        let reference = read(
            model
                .clone()
                .with_step_kernel(StepKernel::OpByOp)
                .step_log_probs(&repeated, &state, 1.0),
        );
        assert_eq!(grouped.len(), b * s * n);
        assert_log_probs_close(&grouped, &reference);
    }
}
