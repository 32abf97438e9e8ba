//! The runtime below the model and its operations: which backends are compiled in and how
//! a device is made ([`backend`]), what a device can do ([`device`]), the CUDA driver
//! check, CubeCL's kernel cache and compile counters ([`cubecl_config`]), kernel launches
//! ([`launches`]) and device graphs ([`device_graph`]).

pub mod backend;
#[cfg(feature = "cube")]
pub(crate) mod cube_launch;
pub mod cubecl_config;
#[cfg(unix)]
pub mod cuda_driver;
pub mod device;
pub(crate) mod device_graph;
pub mod launches;
#[cfg(test)]
pub(crate) mod testing;
