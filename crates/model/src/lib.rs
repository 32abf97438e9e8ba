//! Neural CVRP solvers in Burn: the attention model (graph-transformer encoder with a
//! pointer decoder), the LSTM pointer network, and the CVRP decoding state and step loop
//! they share.
//!
//! The model knows nothing of training: it turns a [`DeviceBatch`] into a
//! [`DecodeOutput`] of actions and log-likelihoods.
//!
//! Three layers, each importing only from those below it (docs/design.md):
//! - [`model`]: the models' math, the CVRP state and the decode loop, in Burn's tensor
//!   operations and the fused operations below; no backend `cfg`.
//! - `ops`: the fused operations, each a `#[backend_extension]` trait with an op-by-op
//!   reference, one implementation per backend and tests against the reference.
//! - [`runtime`]: which backends are compiled in, devices and what they can do, the
//!   CUDA driver check, the kernel cache and compile counters, kernel launches and
//!   device graphs.

#[doc(hidden)]
pub mod fixed_weights;
pub mod model;
pub(crate) mod ops;
pub mod runtime;
#[cfg(test)]
mod test_support;

pub use model::attention_model::{
    AttentionModel, AttentionModelConfig, GradientDecode, Precomputed,
};
pub use model::decode::{
    decode_chunk, decode_in_chunks, decode_steps_taken, DecodeOptions, DecodeOutput, Policy,
    Selection,
};
pub use model::encoder::{GraphEncoder, GraphEncoderConfig, Normalization};
pub use model::pointer_network::{
    pointer_network_loss, pointer_network_nll_sum, PointerNetwork, PointerNetworkConfig,
    NODE_FEATURES,
};
pub use model::problem::{max_decode_steps, DeviceBatch, DeviceTargets, NoiseShape};
pub use model::recorded_decode;
pub use model::routing_model::RoutingModel;
pub use model::state::{CvrpState, LoadArithmetic};
pub use ops::matmul::MatmulPrecision;
pub use ops::StepKernel;
pub use runtime::backend::{Backend, BackendError};
pub use runtime::device::DeviceTraits;
pub use runtime::device_graph::DeviceGraphError;
pub use runtime::{cubecl_config, launches};
