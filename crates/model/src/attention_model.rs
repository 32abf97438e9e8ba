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

use burn::config::Config;
use burn::module::Module;
use burn::nn::{Linear, LinearConfig};
use burn::tensor::activation::{log_softmax, softmax};
use burn::tensor::{Device, Tensor};

use crate::decode::{repeat_rows, rollout, DecodeOptions, DecodeOutput, Policy};
use crate::encoder::{GraphEncoder, GraphEncoderConfig};
use crate::problem::DeviceBatch;
use crate::state::CvrpState;

#[derive(Config, Debug)]
pub struct AttentionModelConfig {
    #[config(default = "GraphEncoderConfig::new()")]
    pub encoder: GraphEncoderConfig,
    /// C in the logit clipping C·tanh(·).
    #[config(default = 10.0)]
    pub tanh_clipping: f64,
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
}

/// Everything the decoder reuses at every step, computed once per batch.
#[derive(Debug, Clone)]
pub struct Precomputed {
    /// `[R, N, d]` node embeddings.
    node_embeddings: Tensor<3>,
    /// `[R, 1, d]` projected graph embedding.
    fixed_context: Tensor<3>,
    /// `[R, H, dk, N]` glimpse keys, transposed for the matmul.
    glimpse_keys_t: Tensor<4>,
    /// `[R, H, N, dk]` glimpse values.
    glimpse_values: Tensor<4>,
    /// `[R, d, N]` logit keys, transposed.
    logit_keys_t: Tensor<3>,
}

impl AttentionModel {
    /// Encodes the batch and decodes a full solution for every instance (or, with
    /// multi-start, one per instance and first customer).
    ///
    /// # Shapes
    /// - output `actions`: `[R, T]`, `log_likelihood`: `[R]`, R = B × rows per instance
    pub fn decode(&self, problem: &DeviceBatch, options: &DecodeOptions) -> DecodeOutput {
        let n = problem.num_nodes() - 1;
        let node_embeddings = self.encode(problem); // [B, N, d]
        let pre = self.precompute(repeat_rows(node_embeddings, options.rows_per_instance(n)));
        let temperature = options.temperature();
        rollout(problem, options, |state| {
            self.step_log_probs(&pre, state, temperature)
        })
    }

    /// The encoder alone: node embeddings of the batch.
    ///
    /// # Shapes
    /// - output: `[B, N, d]`
    pub fn encode(&self, problem: &DeviceBatch) -> Tensor<3> {
        self.encoder
            .forward(problem.coords.clone(), problem.demand_fraction())
    }

    /// The decoder's per-batch work, done once before the first step (one row per
    /// rollout: repeat the embeddings for multi-start).
    pub fn precompute(&self, node_embeddings: Tensor<3>) -> Precomputed {
        let [r, n, d] = node_embeddings.dims();
        let heads = self.num_heads;
        let dk = d / heads;
        let graph_embedding = node_embeddings.clone().mean_dim(1); // [R, 1, d]
        let fixed_context = self.project_fixed_context.forward(graph_embedding); // [R, 1, d]
        let projected = self
            .project_node_embeddings
            .forward(node_embeddings.clone()); // [R, N, 3d]
        let glimpse_keys = projected.clone().slice_dim(2, 0..d); // [R, N, d]
        let glimpse_values = projected.clone().slice_dim(2, d..2 * d);
        let logit_keys = projected.slice_dim(2, 2 * d..3 * d);
        Precomputed {
            node_embeddings,
            fixed_context,
            glimpse_keys_t: glimpse_keys
                .reshape([r, n, heads, dk])
                .permute([0, 2, 3, 1]), // [R, H, dk, N]
            glimpse_values: glimpse_values.reshape([r, n, heads, dk]).swap_dims(1, 2), // [R, H, N, dk]
            logit_keys_t: logit_keys.swap_dims(1, 2),                                  // [R, d, N]
        }
    }

    /// Log-probabilities of the next node for every row.
    ///
    /// # Shapes
    /// - output: `[R, N]`, −∞ at masked nodes
    pub fn step_log_probs(
        &self,
        pre: &Precomputed,
        state: &CvrpState,
        temperature: f64,
    ) -> Tensor<2> {
        let [r, n, d] = pre.node_embeddings.dims();
        let heads = self.num_heads;
        let dk = d / heads;
        let mask = state.mask(); // [R, N]

        let last = state.last_node().unsqueeze_dim::<3>(2).expand([r, 1, d]); // [R, 1, d]
        let last_embedding = pre.node_embeddings.clone().gather(1, last); // [R, 1, d]
        let remaining = state.remaining_capacity_fraction().unsqueeze_dim::<3>(2); // [R, 1, 1]
        let step_context = self
            .project_step_context
            .forward(Tensor::cat(vec![last_embedding, remaining], 2)); // [R, 1, d]
        let query = pre.fixed_context.clone() + step_context; // [R, 1, d]

        // Glimpse: one query per head attends over the unmasked nodes.
        let head_mask = mask.clone().reshape([r, 1, 1, n]).expand([r, heads, 1, n]);
        let q = query.reshape([r, 1, heads, dk]).swap_dims(1, 2); // [R, H, 1, dk]
        let compatibility = q.matmul(pre.glimpse_keys_t.clone()) / (dk as f64).sqrt(); // [R, H, 1, N]
        let attention = softmax(compatibility.mask_fill(head_mask, f32::NEG_INFINITY), 3);
        let heads_out = attention.matmul(pre.glimpse_values.clone()); // [R, H, 1, dk]
        let glimpse = self
            .project_out
            .forward(heads_out.swap_dims(1, 2).reshape([r, 1, d])); // [R, 1, d]

        // Single-head pointer logits, clipped, masked.
        let logits = glimpse.matmul(pre.logit_keys_t.clone()).reshape([r, n]) / (d as f64).sqrt(); // [R, N]
        let clipped = logits.tanh() * self.tanh_clipping;
        let scaled = if temperature == 1.0 {
            clipped
        } else {
            clipped / temperature
        };
        log_softmax(scaled.mask_fill(mask, f32::NEG_INFINITY), 1)
    }
}

impl Policy for AttentionModel {
    fn decode(&self, problem: &DeviceBatch, options: &DecodeOptions) -> DecodeOutput {
        AttentionModel::decode(self, problem, options)
    }
}
