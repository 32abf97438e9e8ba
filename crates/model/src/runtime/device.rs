//! What a device can do, asked once: the model decides its decode's route from it
//! (`DecodeRoute` in `crate::model::attention_model`), and the trainer asks [`DeviceTraits`] rather than which
//! backend or cargo feature is behind the device.

use burn::tensor::Device;

use super::backend::Backend;

/// What the trainer needs to know about a device, each as what it implies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceTraits {
    /// A new batch size compiles and autotunes kernels again (CubeCL fuses and compiles per
    /// stream of operations and per shape): decode a dataset's last, smaller batch padded
    /// to the others' size.
    pub keeps_batch_shapes: bool,
    /// Every small operation is a kernel launch: join the optimizer's per-parameter
    /// updates into a few operations over all parameters.
    pub joins_updates: bool,
    /// The device runs one stream of work: one data-parallel shard by default, where the
    /// CPU backends take one a core.
    pub runs_one_stream: bool,
    /// Kernel compiles and fusion explorations can be counted (CubeCL's logs).
    pub counts_compiles: bool,
    /// A decode can be recorded as a device graph and replayed (CUDA graphs).
    pub records_graphs: bool,
    /// Tensors live in the host's memory as plain buffers (flex, ndarray): a decode or a
    /// training step that needs more than the host has available can be refused before it
    /// starts.
    pub host_memory: bool,
}

impl DeviceTraits {
    /// The traits of `device` (or of the device an autodiff device wraps).
    pub fn of(device: &Device) -> Self {
        Self::from_kinds(runs_through_cubecl(device), records_device_graphs(device))
    }

    /// The traits of `backend`'s devices, before a device is made.
    pub fn of_backend(backend: Backend) -> Self {
        let cubecl = matches!(backend, Backend::Cuda | Backend::Cpu);
        Self::from_kinds(cubecl, backend == Backend::Cuda)
    }

    fn from_kinds(cubecl: bool, graphs: bool) -> Self {
        Self {
            keeps_batch_shapes: cubecl,
            joins_updates: cubecl,
            runs_one_stream: cubecl,
            counts_compiles: cubecl,
            records_graphs: graphs,
            host_memory: !cubecl,
        }
    }
}

/// How `device` runs through CubeCL: `None` where it does not, `Some(false)` for a CubeCL
/// device, `Some(true)` for an autodiff device over one.
fn on_cubecl(device: &Device) -> Option<bool> {
    #[cfg(feature = "cube")]
    {
        use burn::backend::DispatchDevice;
        match device.as_dispatch() {
            DispatchDevice::Cube(_) => Some(false),
            DispatchDevice::Autodiff(inner) => {
                matches!(**inner, DispatchDevice::Cube(_)).then_some(true)
            }
            #[allow(unreachable_patterns)]
            _ => None,
        }
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = device;
        None
    }
}

/// Whether `device` (or the device an autodiff device wraps) runs through CubeCL: fusion
/// caches plans and compiles kernels per relative op stream, and a host read is a sync.
pub(crate) fn runs_through_cubecl(device: &Device) -> bool {
    on_cubecl(device).is_some()
}

/// Whether `device` is a CubeCL device without autodiff: there a decoder step makes each
/// row's query from its context inside its kernel (`fused_step_from_context`).
pub(crate) fn steps_from_context(device: &Device) -> bool {
    on_cubecl(device) == Some(false)
}

/// Whether `device` is an autodiff device over CubeCL (a training decode there is sampled
/// outside autodiff and then scored in one step: `DecodeRoute::SampleThenScore`).
pub(crate) fn trains_through_cubecl(device: &Device) -> bool {
    on_cubecl(device) == Some(true)
}

/// Whether `device` (or the device an autodiff device wraps) is a CUDA device: the one
/// runtime compiled in here with device graphs (CUDA graphs; CubeCL's CPU runtime has none).
pub(crate) fn records_device_graphs(device: &Device) -> bool {
    #[cfg(feature = "cuda")]
    {
        use burn::backend::DispatchDevice;
        use burn_cubecl::cubecl::RuntimeId;
        let cuda = |d: &DispatchDevice| matches!(d, DispatchDevice::Cube(cube) if cube.runtime() == RuntimeId::Cuda);
        match device.as_dispatch() {
            DispatchDevice::Autodiff(inner) => cuda(inner),
            other => cuda(other),
        }
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = device;
        false
    }
}

/// Whether `device` (or the device an autodiff device wraps) is flex: the backend with the
/// fused operations of this crate's own (decoder step, encoder attention, linear layers).
pub(crate) fn runs_on_flex(device: &Device) -> bool {
    use burn::backend::DispatchDevice;
    fn is_flex(device: &DispatchDevice) -> bool {
        match device {
            #[cfg(feature = "flex")]
            DispatchDevice::Flex(_) => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
    match device.as_dispatch() {
        #[cfg(feature = "autodiff")]
        DispatchDevice::Autodiff(inner) => is_flex(inner),
        other => is_flex(other),
    }
}

/// `work` on each of `items`, in order: as many at once as flex's thread pool has threads
/// (rayon), then the next as many; one after another where no pool is compiled in.
pub(crate) fn in_rounds<I: Sync, T: Send>(items: &[I], work: impl Fn(&I) -> T + Sync) -> Vec<T> {
    #[cfg(feature = "flex")]
    {
        use rayon::prelude::*;
        let at_once = rayon::current_num_threads().max(1);
        items
            .chunks(at_once)
            .flat_map(|round| round.par_iter().map(&work).collect::<Vec<_>>())
            .collect()
    }
    #[cfg(not(feature = "flex"))]
    items.iter().map(work).collect()
}
