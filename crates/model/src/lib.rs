//! Neural CVRP solvers in Burn: the attention model (graph-transformer encoder with a
//! pointer decoder), the LSTM pointer network, and the CVRP decoding state and step loop
//! they share.
//!
//! The model knows nothing of training: it turns a [`DeviceBatch`] into a
//! [`DecodeOutput`] of actions and log-likelihoods.

pub mod attention_model;
pub mod backend;
pub mod cubecl_config;
#[cfg(unix)]
pub mod cuda_driver;
pub mod decode;
pub mod decoder_step;
pub mod encoder;
pub mod pointer_network;
pub mod problem;
pub mod routing_model;
pub mod state;

pub use attention_model::{AttentionModel, AttentionModelConfig, Precomputed};
pub use backend::{runs_through_cubecl, Backend, BackendError};
pub use decode::{decode_chunk, decode_in_chunks, DecodeOptions, DecodeOutput, Policy, Selection};
pub use decoder_step::StepKernel;
pub use encoder::{GraphEncoder, GraphEncoderConfig, Normalization};
pub use pointer_network::{
    pointer_network_loss, pointer_network_nll_sum, PointerNetwork, PointerNetworkConfig,
    NODE_FEATURES,
};
pub use problem::{max_decode_steps, DeviceBatch, DeviceTargets, NoiseShape};
pub use routing_model::RoutingModel;
pub use state::{CvrpState, LoadArithmetic};
