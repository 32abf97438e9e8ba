//! The fused operations. Each is a folder: `mod.rs` holds the `#[backend_extension]` trait,
//! the op-by-op reference in Burn's tensor operations and the dispatch between them;
//! `flex.rs` and `cube.rs` implement it for flex and for CubeCL's runtimes (with their
//! loops or kernels in `flex_kernel.rs` and `cube_kernel.rs`); `tests.rs` checks each
//! implementation against the reference. Backend `cfg`s live here and in the runtime.

pub(crate) mod decoder_step;
pub(crate) mod linear;
pub(crate) mod mask;
pub(crate) mod matmul;
pub(crate) mod node_embedding;
pub(crate) mod norm;
#[cfg(feature = "flex")]
pub(crate) mod row_kernels;
pub(crate) mod sampling;
pub(crate) mod self_attention;
pub(crate) mod state_step;

/// Which form a fused operation runs in: the decoder step (`model.decoder_step` in a
/// config) and the encoder's attention core (`model.encoder_attention`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum StepKernel {
    /// The fused operation where the device's backend has one, else the op-by-op form.
    #[default]
    Fused,
    /// Burn's tensor operations, one by one (the reference).
    OpByOp,
}
