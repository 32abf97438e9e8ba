//! Turns the compiled cargo features into a Burn [`Device`].
//!
//! Burn 0.22 tensors carry no backend type: the features `ndarray`, `flex` and `cuda`
//! decide which backends are compiled in, and a `Device` picks one at run time. We never
//! use `Device::default()`, whose priority order (and the `BURN_DEVICE` variable) could
//! silently change the device when features unify differently.

use std::fmt;
use std::str::FromStr;

use burn::tensor::Device;
use thiserror::Error;

use super::device::DeviceTraits;

/// A tensor backend routeburn knows how to build.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// `burn-ndarray`, the CPU backend of the project's original users.
    Ndarray,
    /// `burn-flex`, Burn's own recommended pure-Rust CPU backend.
    Flex,
    /// CUDA through CubeCL, on GPU 0.
    Cuda,
    /// CubeCL's CPU runtime (`burn-cpu`): the CUDA path's fusion, autotune and kernel
    /// compiles (through the same LLVM) on a machine without a GPU. A developer's stand-in
    /// for counting compiles, not a fast CPU backend (flex is).
    Cpu,
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum BackendError {
    #[error("unknown backend `{0}`; expected one of: ndarray, flex, cuda, cpu")]
    Unknown(String),
    #[error("backend `{requested}` was not compiled into this binary (compiled: {compiled}); rebuild with `--features {requested}`, e.g. `cargo xtask train --backend {requested}`")]
    NotCompiled {
        requested: Backend,
        compiled: String,
    },
    #[error(
        "no backend was compiled in; build with one of the features ndarray, flex, cuda or cpu"
    )]
    NoneCompiled,
    /// The cuda backend was asked for on a machine that cannot run it.
    #[error("cuda: {0}")]
    NoCudaDriver(String),
}

impl Backend {
    pub const ALL: [Backend; 4] = [Backend::Ndarray, Backend::Flex, Backend::Cuda, Backend::Cpu];

    pub fn name(self) -> &'static str {
        match self {
            Backend::Ndarray => "ndarray",
            Backend::Flex => "flex",
            Backend::Cuda => "cuda",
            Backend::Cpu => "cpu",
        }
    }

    pub fn is_compiled(self) -> bool {
        match self {
            Backend::Ndarray => cfg!(feature = "ndarray"),
            Backend::Flex => cfg!(feature = "flex"),
            Backend::Cuda => cfg!(feature = "cuda"),
            Backend::Cpu => cfg!(feature = "cpu"),
        }
    }

    /// Every backend compiled into this binary, in order of preference.
    pub fn compiled() -> Vec<Backend> {
        // CUDA, when compiled in, is preferred; among CPU backends flex (Burn's recommended
        // one) before ndarray; the CubeCL CPU stand-in only when asked for by name.
        [Backend::Cuda, Backend::Flex, Backend::Ndarray, Backend::Cpu]
            .into_iter()
            .filter(|b| b.is_compiled())
            .collect()
    }

    /// The compiled backends' names, for messages.
    pub fn compiled_names() -> String {
        Self::compiled()
            .iter()
            .map(|b| b.name())
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// The backend used when the user names none: the first of [`Backend::compiled`].
    pub fn default_compiled() -> Result<Backend, BackendError> {
        Self::compiled()
            .first()
            .copied()
            .ok_or(BackendError::NoneCompiled)
    }

    /// The first compiled backend that runs on the host's CPU: flex, else ndarray, else
    /// CubeCL's CPU runtime. The tests run on it, so that a build with CUDA compiled in
    /// (the bundle's) runs them on a machine without a GPU driver.
    pub fn first_on_host() -> Result<Backend, BackendError> {
        [Backend::Flex, Backend::Ndarray, Backend::Cpu]
            .into_iter()
            .find(|b| b.is_compiled())
            .ok_or(BackendError::NoneCompiled)
    }

    /// Resolves an optional user choice (`--backend`) against what was compiled in.
    pub fn resolve(requested: Option<&str>) -> Result<Backend, BackendError> {
        match requested {
            None => Self::default_compiled(),
            Some(name) => {
                let b: Backend = name.parse()?;
                if b.is_compiled() {
                    Ok(b)
                } else {
                    Err(BackendError::NotCompiled {
                        requested: b,
                        compiled: Self::compiled_names(),
                    })
                }
            }
        }
    }

    /// The inference device of this backend (no autodiff). Call `.autodiff()` on it for
    /// training.
    pub fn device(self) -> Result<Device, BackendError> {
        match self {
            #[cfg(feature = "ndarray")]
            Backend::Ndarray => {
                // The one place the deprecated constructor is allowed: users asked to keep
                // the ndarray backend working.
                #[allow(deprecated)]
                let device = Device::ndarray();
                Ok(device)
            }
            #[cfg(feature = "flex")]
            Backend::Flex => Ok(Device::flex()),
            #[cfg(feature = "cuda")]
            Backend::Cuda => {
                crate::runtime::cuda_driver::check()
                    .map_err(|e| BackendError::NoCudaDriver(e.0))?;
                crate::runtime::cubecl_config::configure(true);
                Ok(Device::cuda(0))
            }
            #[cfg(feature = "cpu")]
            Backend::Cpu => {
                crate::runtime::cubecl_config::configure(false);
                Ok(Device::cpu())
            }
            #[allow(unreachable_patterns)]
            other => Err(BackendError::NotCompiled {
                requested: other,
                compiled: Self::compiled_names(),
            }),
        }
    }

    /// What this backend's devices can do ([`DeviceTraits`]).
    pub fn traits(self) -> DeviceTraits {
        DeviceTraits::of_backend(self)
    }
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Backend {
    type Err = BackendError;
    fn from_str(s: &str) -> Result<Self, BackendError> {
        match s.to_ascii_lowercase().as_str() {
            "ndarray" => Ok(Backend::Ndarray),
            "flex" => Ok(Backend::Flex),
            "cuda" => Ok(Backend::Cuda),
            "cpu" => Ok(Backend::Cpu),
            _ => Err(BackendError::Unknown(s.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Backend;

    /// The tests' backend runs on the CPU whatever else is compiled in, and is flex where
    /// flex is.
    #[test]
    fn the_tests_backend_is_on_the_host() {
        let backend = Backend::first_on_host().unwrap();
        assert!(backend.is_compiled());
        assert_ne!(backend, Backend::Cuda);
        if Backend::Flex.is_compiled() {
            assert_eq!(backend, Backend::Flex);
        }
    }
}
