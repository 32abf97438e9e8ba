//! Neural CVRP solvers in Burn: the attention model (graph-transformer encoder with a
//! pointer decoder) and the CVRP decoding state they share.
//!
//! The model knows nothing of training: it turns a [`DeviceBatch`] into a
//! [`DecodeOutput`] of actions and log-likelihoods.

pub mod attention_model;
pub mod backend;
pub mod decode;
pub mod encoder;
pub mod problem;
pub mod state;

pub use attention_model::{AttentionModel, AttentionModelConfig};
pub use backend::{Backend, BackendError};
pub use decode::{DecodeOptions, DecodeOutput, Selection};
pub use encoder::{GraphEncoder, GraphEncoderConfig, Normalization};
pub use problem::{max_decode_steps, DeviceBatch, NoiseShape};
pub use state::CvrpState;
