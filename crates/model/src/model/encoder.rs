//! The graph-transformer encoder of Kool et al. (2019): node embeddings refined by L
//! layers of multi-head self-attention and a feed-forward block, each followed by a skip
//! connection and normalisation.

use burn::config::Config;
use burn::module::Module;
use burn::nn::{
    BatchNorm, BatchNormConfig, InstanceNorm, InstanceNormConfig, LayerNorm, LayerNormConfig,
    Linear, LinearConfig,
};
use burn::tensor::activation::relu;
use burn::tensor::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::ops::linear;
use crate::ops::matmul::MatmulPrecision;
use crate::ops::node_embedding;
use crate::ops::norm::{BatchNormRun, RunningUpdates};
use crate::ops::self_attention;
use crate::ops::StepKernel;

/// Which normalisation follows each skip connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Normalization {
    /// Batch normalisation over all nodes of the batch (Kool's default).
    #[default]
    Batch,
    /// Per instance, over its nodes.
    Instance,
    /// Per node, over its features.
    Layer,
}

#[derive(Config, Debug)]
pub struct GraphEncoderConfig {
    #[config(default = 128)]
    pub embed_dim: usize,
    #[config(default = 8)]
    pub num_heads: usize,
    #[config(default = 3)]
    pub num_layers: usize,
    #[config(default = 512)]
    pub feed_forward_dim: usize,
    #[config(default = "Normalization::Batch")]
    pub normalization: Normalization,
    /// Biases in the attention's projections: Kool's encoder has none, rl4co's has them.
    #[config(default = false)]
    pub attention_bias: bool,
    /// The attention core as one fused operation where the backend has one (flex, CUDA and
    /// the `cpu` stand-in), or Burn's ops one by one.
    #[config(default = "StepKernel::Fused")]
    pub encoder_attention: StepKernel,
}

impl GraphEncoderConfig {
    pub fn init(&self, device: &Device) -> GraphEncoder {
        GraphEncoder {
            depot_embedding: LinearConfig::new(2, self.embed_dim).init(device),
            customer_embedding: LinearConfig::new(3, self.embed_dim).init(device),
            layers: (0..self.num_layers)
                .map(|_| EncoderLayer::new(self, device))
                .collect(),
        }
    }
}

#[derive(Module, Debug)]
pub struct GraphEncoder {
    /// `Linear(2, d)` on the depot's [x, y].
    depot_embedding: Linear,
    /// `Linear(3, d)` on each customer's [x, y, demand / capacity].
    customer_embedding: Linear,
    layers: Vec<EncoderLayer>,
}

impl GraphEncoder {
    /// The encoder with its attention core run in `kernel`'s form.
    pub(crate) fn with_attention_kernel(mut self, kernel: StepKernel) -> Self {
        for layer in &mut self.layers {
            layer.attention.kernel = kernel;
        }
        self
    }

    /// Embeds every node and refines the embeddings, the products at `p` (the model's
    /// precision on this device, [`MatmulPrecision::on`]; the tests split them on the CPU).
    ///
    /// # Shapes
    /// - `coords`: `[B, N, 2]` (depot first), `demands`: `[B, N]`, `capacity`: `[B, 1]`
    /// - output: `[B, N, d]` node embeddings
    pub fn forward(
        &self,
        coords: Tensor<3>,
        demands: Tensor<2>,
        capacity: Tensor<2>,
        p: MatmulPrecision,
    ) -> Tensor<3> {
        let [b, n, _] = coords.dims();
        // The layers run on rows: on CubeCL a reshape ends a fused chain, and as rows each
        // product fuses with the bias and skip additions after it.
        let mut rows = self.embed(coords, [demands, capacity], p); // [B × N, d]
        let [_, d] = rows.dims();
        let mut running_updates = RunningUpdates::default();
        for layer in &self.layers {
            rows = layer.forward(rows, n, p, &mut running_updates);
        }
        running_updates.finish();
        rows.reshape([b, n, d])
    }
}

impl GraphEncoder {
    /// Every node's embedding as a row: one operation each way on CubeCL devices
    /// ([`node_embedding`]), Burn's linear layers elsewhere.
    ///
    /// # Shapes
    /// - `coords`: `[B, N, 2]` (depot first), `demands`: `[B, N]`, `capacity`: `[B, 1]` →
    ///   `[B × N, d]`
    fn embed(
        &self,
        coords: Tensor<3>,
        [demands, capacity]: [Tensor<2>; 2],
        p: MatmulPrecision,
    ) -> Tensor<2> {
        let (depot, customer) = (&self.depot_embedding, &self.customer_embedding);
        node_embedding::embed_rows(depot, customer, coords, [demands, capacity], p)
    }
}

#[derive(Module, Debug)]
pub struct EncoderLayer {
    attention: MultiHeadSelfAttention,
    attention_norm: Norm,
    feed_forward_in: Linear,
    feed_forward_out: Linear,
    feed_forward_norm: Norm,
}

impl EncoderLayer {
    fn new(config: &GraphEncoderConfig, device: &Device) -> Self {
        let d = config.embed_dim;
        Self {
            attention: MultiHeadSelfAttention::new(config, device),
            attention_norm: Norm::new(config.normalization, d, device),
            feed_forward_in: LinearConfig::new(d, config.feed_forward_dim).init(device),
            feed_forward_out: LinearConfig::new(config.feed_forward_dim, d).init(device),
            feed_forward_norm: Norm::new(config.normalization, d, device),
        }
    }

    /// One layer over the rows of B instances of `nodes` nodes each, products at `p`.
    /// Its batch norms' training statistics go to `running_updates`.
    ///
    /// # Shapes
    /// - `h`: `[B × N, d]` → `[B × N, d]`
    pub(crate) fn forward<'a>(
        &'a self,
        h: Tensor<2>,
        nodes: usize,
        p: MatmulPrecision,
        running_updates: &mut RunningUpdates<'a>,
    ) -> Tensor<2> {
        // Both norms are readied before the layer's first operation: a batch norm's
        // inference form reshapes its parameters, and on CubeCL a reshape between a skip
        // addition and its norm would split them into two kernels.
        let device = h.device();
        let [attention_norm, feed_forward_norm] =
            [&self.attention_norm, &self.feed_forward_norm].map(|norm| norm.ready(&device));
        let attended = self.attention.forward(h.clone(), nodes, p); // [B × N, d]
        let h = attention_norm.forward(attended, h, nodes, running_updates);
        let hidden = relu(linear::forward(&self.feed_forward_in, h.clone(), p)); // [B × N, ff]
        let ff = linear::forward(&self.feed_forward_out, hidden, p); // [B × N, d]
        feed_forward_norm.forward(ff, h, nodes, running_updates)
    }
}

/// Multi-head self-attention, without biases as in Kool's encoder (or with them, as in
/// rl4co's). Burn's `MultiHeadAttention` has dropout and separate projections, so we write
/// the few lines ourselves.
#[derive(Module, Debug)]
pub struct MultiHeadSelfAttention {
    /// Queries, keys and values in one projection: `Linear(d, 3d)`.
    qkv: Linear,
    out: Linear,
    num_heads: usize,
    /// The fused attention core where the backend has one (not saved).
    #[module(skip)]
    kernel: StepKernel,
}

impl MultiHeadSelfAttention {
    fn new(config: &GraphEncoderConfig, device: &Device) -> Self {
        let (d, num_heads, bias) = (config.embed_dim, config.num_heads, config.attention_bias);
        assert!(
            d.is_multiple_of(num_heads),
            "embed_dim {d} is not divisible by num_heads {num_heads}"
        );
        Self {
            qkv: LinearConfig::new(d, 3 * d).with_bias(bias).init(device),
            out: LinearConfig::new(d, d).with_bias(bias).init(device),
            num_heads,
            kernel: config.encoder_attention,
        }
    }

    /// The heads' outputs, projected, for the rows of B instances of `nodes` nodes each;
    /// products at `p`.
    ///
    /// # Shapes
    /// - `h`: `[B × N, d]` → `[B × N, d]`
    pub fn forward(&self, h: Tensor<2>, nodes: usize, p: MatmulPrecision) -> Tensor<2> {
        let [rows, d] = h.dims();
        let qkv = linear::forward(&self.qkv, h, p).reshape([rows / nodes, nodes, 3 * d]); // [B, N, 3d]
        let attended = self_attention::attend(qkv, self.num_heads, self.kernel, p); // [B, N, d]
        linear::forward(&self.out, attended.reshape([rows, d]), p) // [B × N, d]
    }
}

/// The normalisation after a skip connection, over `[B, N, d]` node embeddings.
#[derive(Module, Debug)]
pub enum Norm {
    Batch(BatchNorm),
    Instance(InstanceNorm),
    Layer(LayerNorm),
}

impl Norm {
    fn new(kind: Normalization, d: usize, device: &Device) -> Self {
        match kind {
            Normalization::Batch => Norm::Batch(BatchNormConfig::new(d).init(device)),
            Normalization::Instance => Norm::Instance(InstanceNormConfig::new(d).init(device)),
            Normalization::Layer => Norm::Layer(LayerNormConfig::new(d).init(device)),
        }
    }

    /// The norm as one forward pass on `device` runs it ([`ReadyNorm::forward`]).
    fn ready(&self, device: &Device) -> ReadyNorm<'_> {
        match self {
            Norm::Batch(bn) => ReadyNorm::Batch(BatchNormRun::new(bn, device)),
            Norm::Instance(inn) => ReadyNorm::Instance(inn),
            Norm::Layer(ln) => ReadyNorm::Layer(ln),
        }
    }
}

/// A [`Norm`] readied for one forward pass.
#[allow(
    clippy::large_enum_variant,
    reason = "two a layer, moved straight into the layer's norms: boxing would buy nothing"
)]
enum ReadyNorm<'a> {
    Batch(BatchNormRun<'a>),
    Instance(&'a InstanceNorm),
    Layer(&'a LayerNorm),
}

impl<'a> ReadyNorm<'a> {
    /// Over `x + skip`, a block's output and its skip connection, the rows of B instances of
    /// `nodes` nodes each. A batch norm's training statistics go to `running_updates`.
    ///
    /// # Shapes
    /// - `x`, `skip`: `[B × N, d]` → `[B × N, d]`
    fn forward(
        self,
        x: Tensor<2>,
        skip: Tensor<2>,
        nodes: usize,
        running_updates: &mut RunningUpdates<'a>,
    ) -> Tensor<2> {
        match self {
            // Batch norm over every node of the batch: as rows the features already sit on
            // axis 1, and the output stays contiguous (a swapped view would be copied by
            // every later gather and reshape).
            ReadyNorm::Batch(run) => run.forward(x, skip, running_updates),
            ReadyNorm::Instance(inn) => crate::ops::norm::instance_norm(inn, x, skip, nodes),
            ReadyNorm::Layer(ln) => ln.forward(x + skip),
        }
    }
}
