//! What the tests of every layer need from the runtime, whatever backends are compiled in:
//! the devices they run on (`None` where a backend is not compiled, and the test is then
//! skipped), the lock that keeps CubeCL tests apart, and the launch settings a GPU would
//! choose (more units a cube, 64-bit offsets), so that no test outside the runtime and the
//! operations names a cargo feature.

use burn::tensor::Device;

use super::backend::Backend;

/// The device of `backend`, where it is compiled in and can start.
pub(crate) fn device_of(backend: Backend) -> Option<Device> {
    backend.device().ok()
}

/// Held by the tests that launch CubeCL kernels: the launch counter
/// ([`crate::runtime::launches`]) sees every launch of the process. A thread that holds it
/// may take it again (a test that runs another: [`with_units`]).
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

thread_local! {
    /// Whether this thread holds [`one_cube_test_at_a_time`]'s lock.
    static HELD: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// [`one_cube_test_at_a_time`]'s lock, held till dropped (`None`: held further out).
pub(crate) struct CubeTestAlone(#[allow(dead_code)] Option<std::sync::MutexGuard<'static, ()>>);

impl Drop for CubeTestAlone {
    fn drop(&mut self) {
        if self.0.is_some() {
            HELD.set(false);
        }
    }
}

/// Runs `f` (a test) with up to `units` units a cube in every CubeCL kernel, on CubeCL's
/// CPU runtime; the number of kernels it launched, or `None` (and `f` not run) where that
/// runtime is not compiled in.
pub(crate) fn with_units(units: u32, f: impl FnOnce()) -> Option<usize> {
    #[cfg(feature = "cpu")]
    return Some(super::cube_launch::for_tests::with_units(units, f));
    #[cfg(not(feature = "cpu"))]
    {
        let _ = (units, f);
        None
    }
}

/// Runs `f` (a test) with every CubeCL kernel given 64-bit offsets; the number of kernels
/// it launched, or `None` (and `f` not run) where CubeCL's CPU runtime is not compiled in.
pub(crate) fn with_wide_addresses(f: impl FnOnce()) -> Option<usize> {
    #[cfg(feature = "cpu")]
    return Some(super::cube_launch::for_tests::with_wide_addresses(f));
    #[cfg(not(feature = "cpu"))]
    {
        let _ = f;
        None
    }
}

/// Declares the test `<test>::with_64_bit_offsets`, which runs the test named with every
/// kernel given 64-bit offsets, as tensors of more than `u32::MAX` elements get them: the
/// kernels' index arithmetic in 64 bits, on tensors small enough for a test.
macro_rules! test_with_64_bit_offsets {
    ($test:ident) => {
        mod $test {
            #[doc = concat!("[`super::", stringify!($test), "`] with 64-bit offsets.")]
            #[test]
            fn with_64_bit_offsets() {
                if let Some(given) = crate::runtime::testing::with_wide_addresses(super::$test) {
                    assert!(given > 0, "no kernel took 64-bit offsets");
                }
            }
        }
    };
}
pub(crate) use test_with_64_bit_offsets;
