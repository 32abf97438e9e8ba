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
/// same weights in every run ([`FixedWeights`]), so that a test that fails fails again.
#[cfg(test)]
pub(crate) fn small_model(device: &burn::tensor::Device) -> attention_model::AttentionModel {
    use burn::module::Module;
    let encoder = encoder::GraphEncoderConfig::new()
        .with_embed_dim(16)
        .with_num_heads(4)
        .with_num_layers(1)
        .with_feed_forward_dim(32);
    attention_model::AttentionModelConfig::new()
        .with_encoder(encoder)
        .init(device)
        .map(&mut FixedWeights { tensors: 0 })
}

/// Replaces each weight tensor drawn at initialisation by one from a fixed generator,
/// uniform within ±1/√rows (Burn's own draws come from the OS's entropy unless seeded, and
/// its seed is shared by every test of the process); constant tensors (norms' scales and
/// shifts) stay as they are.
#[cfg(test)]
struct FixedWeights {
    tensors: u64,
}

#[cfg(test)]
impl burn::module::ModuleMapper for FixedWeights {
    fn map_float<const D: usize>(
        &mut self,
        param: burn::module::Param<burn::tensor::Tensor<D>>,
    ) -> burn::module::Param<burn::tensor::Tensor<D>> {
        use burn::tensor::{Tensor, TensorData};
        self.tensors += 1;
        let mut rng = routeburn_data::InstanceRng::new(self.tensors);
        param.map(|tensor| {
            let values = tensor
                .to_data()
                .convert::<f32>()
                .try_to_vec::<f32>()
                .unwrap();
            if values.iter().all(|&v| v == values[0]) {
                return tensor;
            }
            let dims = tensor.dims();
            let bound = 1.0 / (dims[0] as f64).sqrt();
            let fixed: Vec<f32> = (values.iter())
                .map(|_| (bound * (2.0 * rng.unit() - 1.0)) as f32)
                .collect();
            let fixed = Tensor::from_data(TensorData::new(fixed, dims), &tensor.device());
            match tensor.is_require_grad() {
                true => fixed.require_grad(),
                false => fixed,
            }
        })
    }
}
