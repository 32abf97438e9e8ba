//! Neural CVRP solvers in Burn: the attention model (graph-transformer encoder with a
//! pointer decoder), the LSTM pointer network, and the CVRP decoding state and step loop
//! they share.
//!
//! The model knows nothing of training: it turns a [`DeviceBatch`] into a
//! [`DecodeOutput`] of actions and log-likelihoods.

pub mod attention_model;
pub mod backend;
#[cfg(any(feature = "cuda", feature = "cpu"))]
mod cube_launch;
pub mod cubecl_config;
#[cfg(unix)]
pub mod cuda_driver;
pub mod decode;
pub mod decoder_step;
pub mod encoder;
pub mod graph_capture;
pub mod launches;
mod linear;
mod mask_kernel;
pub mod matmul;
mod node_embedding;
#[cfg(any(feature = "cuda", feature = "cpu"))]
mod norm_kernel;
mod normalization;
pub mod pointer_network;
pub mod problem;
pub mod routing_model;
#[cfg(feature = "flex")]
mod row_kernels;
mod self_attention;
pub mod state;
#[cfg(any(feature = "cuda", feature = "cpu"))]
mod state_kernel;

pub use attention_model::{AttentionModel, AttentionModelConfig, GradientDecode, Precomputed};
pub use backend::{records_device_graphs, runs_through_cubecl, Backend, BackendError};
pub use decode::{decode_chunk, decode_in_chunks, DecodeOptions, DecodeOutput, Policy, Selection};
pub use decoder_step::StepKernel;
pub use encoder::{GraphEncoder, GraphEncoderConfig, Normalization};
pub use matmul::MatmulPrecision;
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
    // The fused kernels' tests and their helpers exist where a fused kernel does (flex,
    // CubeCL); an ndarray-only build compiles the rest.
    #![cfg_attr(not(any(feature = "flex", feature = "cpu")), allow(dead_code))]

    /// Held by the tests that launch CubeCL kernels: the launch counter
    /// ([`crate::launches`]) sees every launch of the process. A thread that holds it may
    /// take it again (a test that runs another: `crate::cube_launch::for_tests`).
    #[cfg(feature = "cpu")]
    pub(crate) fn one_cube_test_at_a_time() -> CubeTestAlone {
        static CUBE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        if HELD.get() {
            return CubeTestAlone(None);
        }
        let guard = CUBE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        HELD.set(true);
        CubeTestAlone(Some(guard))
    }

    #[cfg(feature = "cpu")]
    thread_local! {
        /// Whether this thread holds [`one_cube_test_at_a_time`]'s lock.
        static HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// [`one_cube_test_at_a_time`]'s lock, held till dropped (`None`: held further out).
    #[cfg(feature = "cpu")]
    pub(crate) struct CubeTestAlone(Option<std::sync::MutexGuard<'static, ()>>);

    #[cfg(feature = "cpu")]
    impl Drop for CubeTestAlone {
        fn drop(&mut self) {
            if self.0.is_some() {
                HELD.set(false);
            }
        }
    }

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

    /// The gradients of a loss that weighs every entry of `out` differently (weights drawn
    /// from `seed`).
    pub(crate) fn weighted_loss_grads<const D: usize>(
        out: &burn::tensor::Tensor<D>,
        seed: u64,
    ) -> burn::tensor::Gradients {
        use burn::tensor::{Tensor, TensorData};
        let shape = out.shape();
        let weights = TensorData::new(pseudo_random(shape.num_elements(), seed, 1.0), shape);
        let weights = Tensor::<D>::from_data(weights, &out.device());
        (out.clone() * weights).sum().backward()
    }

    /// An attention model of d = 16, 4 heads, one layer: small enough for any test.
    pub(crate) fn small_model(device: &burn::tensor::Device) -> crate::AttentionModel {
        let encoder = crate::GraphEncoderConfig::new()
            .with_embed_dim(16)
            .with_num_heads(4)
            .with_num_layers(1)
            .with_feed_forward_dim(32);
        crate::AttentionModelConfig::new()
            .with_encoder(encoder)
            .init(device)
    }

    /// Collects the gradient of every float parameter that has one in `grads`, in the
    /// module's visiting order.
    pub(crate) struct GradsOf<'a> {
        grads: &'a burn::tensor::Gradients,
        out: &'a mut Vec<Vec<f32>>,
    }

    impl<'a> GradsOf<'a> {
        pub(crate) fn new(grads: &'a burn::tensor::Gradients, out: &'a mut Vec<Vec<f32>>) -> Self {
            Self { grads, out }
        }
    }

    impl burn::module::ModuleVisitor for GradsOf<'_> {
        fn visit_float<const D: usize>(
            &mut self,
            param: &burn::module::Param<burn::tensor::Tensor<D>>,
        ) {
            if let Some(grad) = param.val().grad(self.grads) {
                self.out.push(read(grad));
            }
        }
    }

    /// An int tensor's values, in order.
    pub(crate) fn read_ints<const D: usize>(
        t: burn::tensor::Tensor<D, burn::tensor::Int>,
    ) -> Vec<i64> {
        t.into_data().try_into_vec_as::<i64>().expect("ints")
    }

    /// A tensor's values, in order.
    pub(crate) fn read<const D: usize>(t: burn::tensor::Tensor<D>) -> Vec<f32> {
        t.into_data().try_to_vec::<f32>().expect("f32")
    }

    /// Each of `ours` within `relative` of the matching `reference`, relative to that
    /// reference's largest entry (exactly equal where it is all zero). `names` names the
    /// tensors, `case` the inputs, in the message of the first entry that is not.
    pub(crate) fn assert_close(
        ours: &[Vec<f32>],
        reference: &[Vec<f32>],
        names: &[&str],
        case: &str,
        relative: f32,
    ) {
        assert_eq!(ours.len(), reference.len(), "{case}");
        for ((a, r), what) in ours.iter().zip(reference).zip(names) {
            assert_eq!(a.len(), r.len(), "{case} {what}: lengths");
            let scale = r.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            for (i, (a, r)) in a.iter().zip(r).enumerate() {
                assert!(
                    (a - r).abs() <= relative * scale,
                    "{case} {what}[{i}]: ours {a} vs the reference {r} (scale {scale})"
                );
            }
        }
    }
}
