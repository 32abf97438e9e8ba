//! The models' math: the attention model and its encoder, the pointer network, the CVRP
//! state, and the decode loop they share. Backend-independent: where a fused operation
//! runs is decided once per decode (`attention_model::DecodeRoute`) from what the device
//! can do (`crate::runtime::device`).

pub mod attention_model;
pub mod decode;
pub mod encoder;
pub mod pointer_network;
pub mod problem;
pub mod recorded_decode;
pub mod routing_model;
pub mod state;

/// An attention model of d = 16, 4 heads, one layer: small enough for any test, with the
/// same weights in every run ([`crate::fixed_weights`]), so that a test that fails fails
/// again.
#[cfg(test)]
pub(crate) fn small_model(device: &burn::tensor::Device) -> attention_model::AttentionModel {
    let encoder = encoder::GraphEncoderConfig::new()
        .with_embed_dim(16)
        .with_num_heads(4)
        .with_num_layers(1)
        .with_feed_forward_dim(32);
    crate::fixed_weights::fixed_weights(
        attention_model::AttentionModelConfig::new()
            .with_encoder(encoder)
            .init(device),
    )
}
