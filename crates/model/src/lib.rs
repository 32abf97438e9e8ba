//! Neural CVRP solvers in Burn: the attention model (graph-transformer encoder with a
//! pointer decoder), the LSTM pointer network, and the CVRP decoding state and step loop
//! they share.
//!
//! The model knows nothing of training: it turns a [`DeviceBatch`] into a
//! [`DecodeOutput`] of actions and log-likelihoods.

pub mod attention_model;
pub mod backend;
mod batch_norm;
pub mod cubecl_config;
#[cfg(unix)]
pub mod cuda_driver;
pub mod decode;
pub mod decoder_step;
pub mod encoder;
mod linear;
pub mod pointer_network;
pub mod problem;
pub mod routing_model;
#[cfg(feature = "flex")]
mod row_kernels;
mod self_attention;
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

/// Inputs the unit tests share.
#[cfg(test)]
mod test_values {
    /// Deterministic values in [-scale, scale] from a small LCG.
    pub(crate) fn pseudo_random(len: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut x = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..len)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((x >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
            })
            .collect()
    }
}
