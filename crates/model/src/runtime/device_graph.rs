//! Burn's device graphs (CUDA graphs): recording a piece of work once, with
//! `burn::tensor::capture`'s steps (prepare, three warm-up runs, the recorded one), and
//! writing new inputs into a recorded buffer in place between replays. The backend is
//! called for each step here: `capture` folds a refusal into a silent fallback (re-running
//! the closure), and a refusal here is reported with its reason. A replay reads and writes
//! the buffers the recording used (the graph holds raw device pointers), so the next input
//! is written into the recorded buffer in place: an operation of this crate's
//! ([`WriteInPlaceBackend`]) around cubecl's `ComputeClient::write`, since Burn 0.22.1 has
//! no tensor operation that writes into an existing buffer.

use burn::backend::{Backend as _, BackendGraph, Dispatch};
use burn::tensor::{Device, Tensor};
use thiserror::Error;

/// Why a decode was not recorded or replayed as a device graph.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DeviceGraphError {
    /// A step the backend refused or failed (every CPU backend refuses to open a capture),
    /// with the backend's error on one line.
    #[error("{step}: {reason}")]
    Backend { step: &'static str, reason: String },
    /// A replay of a batch of another size or n than the recorded one's.
    #[error("a batch of {size} instances of n = {n} replayed on a decode recorded for {recorded_size} of n = {recorded_n}")]
    OtherBatch {
        size: usize,
        n: usize,
        recorded_size: usize,
        recorded_n: usize,
    },
    /// Values that are not one f32 for each element of the buffer they are written into.
    #[error("{values} f32 values written into a buffer of {elements} {dtype}")]
    OtherBuffer {
        values: usize,
        elements: usize,
        dtype: String,
    },
    #[error("writing into a buffer in place needs a CubeCL backend (cuda, cpu)")]
    NoCubecl,
}

impl DeviceGraphError {
    /// The step that failed and the backend's error, on one line.
    pub(crate) fn backend(step: &'static str, error: impl std::fmt::Display) -> Self {
        let lines: Vec<String> = (error.to_string().lines())
            .map(|line| line.trim().to_string())
            .filter(|line| !line.is_empty())
            .collect();
        Self::Backend {
            step,
            reason: lines.join(" "),
        }
    }
}

/// Warm-up decodes before the recorded one: Burn's own `capture` runs three, since fusion
/// takes a different path (and allocates other buffers) the first time it sees a stream.
const WARM_UP_DECODES: usize = 3;

/// Records one run of `decode` as a device graph, with its output tensors; the backend's error at
/// the step that failed otherwise.
pub(crate) fn record<T>(
    device: &Device,
    decode: impl Fn() -> T,
) -> Result<(BackendGraph<Dispatch>, T), DeviceGraphError> {
    let dispatch = device.as_dispatch();
    Dispatch::graph_prepare(dispatch)
        .map_err(|e| DeviceGraphError::backend("preparing the pools", e))?;
    for _ in 0..WARM_UP_DECODES {
        // Kept until the sync: fusion drops work whose output is dropped before it runs.
        let warm_up = decode();
        Dispatch::sync(dispatch).map_err(|e| DeviceGraphError::backend("a warm-up decode", e))?;
        drop(warm_up);
    }
    Dispatch::graph_start_capture(dispatch)
        .map_err(|e| DeviceGraphError::backend("opening the capture", e))?;
    let recorded = decode();
    let graph = Dispatch::graph_stop_capture(dispatch)
        .map_err(|e| DeviceGraphError::backend("closing the capture of a decode", e))?;
    Ok((graph, recorded))
}

/// `target`'s buffer overwritten with `values` (as many f32s as it holds) in place: the
/// same buffer, returned as a tensor to keep until the write has run.
pub(crate) fn write_in_place(
    target: &Tensor<1>,
    values: Vec<f32>,
) -> Result<Tensor<1>, DeviceGraphError> {
    if values.len() != target.dims()[0] || target.dtype() != burn::tensor::DType::F32 {
        return Err(DeviceGraphError::OtherBuffer {
            values: values.len(),
            elements: target.dims()[0],
            dtype: format!("{:?}", target.dtype()),
        });
    }
    #[cfg(feature = "cube")]
    if super::device::runs_through_cubecl(&target.device()) {
        let values = std::sync::Arc::new(values);
        let out = <Dispatch as WriteInPlaceBackend>::write_in_place(
            target.clone().into_dispatch(),
            values,
        );
        return Ok(Tensor::from_dispatch(out));
    }
    Err(DeviceGraphError::NoCubecl)
}

#[cfg(feature = "cube")]
pub use write_op::WriteInPlaceBackend;

#[cfg(feature = "cube")]
mod write_op {
    use std::sync::Arc;

    use burn::backend::backend_extension;
    use burn::backend::tensor::FloatTensor;
    use burn::backend::TensorMetadata;
    use burn_cubecl::cubecl::bytes::Bytes;
    use burn_cubecl::CubeBackend;

    /// Overwrites a contiguous f32 tensor's own buffer (same device pointer) with host
    /// values: how a recorded decode's inputs are refreshed between replays.
    #[backend_extension(
        Cube: cfg(feature = "cube"),
        Fusion: cfg(feature = "cube")
    )]
    pub trait WriteInPlaceBackend: burn::backend::Backend {
        /// `target`, whose buffer now holds `values`.
        #[fusion(dtype = target, shape = target)]
        fn write_in_place(target: FloatTensor<Self>, values: Arc<Vec<f32>>) -> FloatTensor<Self>;
    }

    impl WriteInPlaceBackend for CubeBackend {
        fn write_in_place(target: FloatTensor<Self>, values: Arc<Vec<f32>>) -> FloatTensor<Self> {
            // What `RecordedDecode` uploads: one contiguous f32 buffer of its own.
            assert_eq!(target.dtype, burn::tensor::DType::F32, "an f32 buffer");
            assert!(target.is_contiguous(), "a contiguous buffer");
            assert_eq!(
                target.shape().num_elements(),
                values.len(),
                "one value per element"
            );
            // The caller's only reference in `RecordedDecode::replay`: no copy then.
            let values = Arc::try_unwrap(values).unwrap_or_else(|shared| shared.as_ref().clone());
            let bytes = Bytes::from_elems(values);
            target.client.write(&target.handle, bytes);
            target
        }
    }
}
