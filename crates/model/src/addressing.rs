//! The offsets the crate's CubeCL kernels index their tensors with.
//!
//! A CubeCL kernel indexes with 32-bit offsets unless it is launched otherwise, so a tensor
//! of more than `u32::MAX` elements would be read and written at its offset modulo 2³²:
//! wrong numbers, with no error. Training can reach that size on a large GPU: a POMO step
//! at n = 200 and batch 512 scores 102,400 rollouts × 400 steps × 201 nodes ≈ 8.2 × 10⁹
//! log-probabilities. Every kernel here is declared `address_type = "dynamic"` and
//! launched with the widest type its tensors need, as Burn's own kernels are: the same
//! 32-bit kernels as before at every size that fits, 64-bit offsets beyond it.

use burn_cubecl::cubecl::prelude::AddressType;
use burn_cubecl::tensor::CubeTensor;

/// The address type a kernel reading and writing `tensors` must be launched with: 64-bit
/// where one of them has more elements than a `u32` counts.
pub(crate) fn address_type<'a>(tensors: impl IntoIterator<Item = &'a CubeTensor>) -> AddressType {
    let needed = tensors
        .into_iter()
        .map(CubeTensor::required_address_type)
        .max()
        .unwrap_or_default();
    #[cfg(all(test, feature = "cpu"))]
    if let Some(needed) = wide::instead(needed) {
        return needed;
    }
    needed
}

/// 64-bit offsets on demand, so that the tests can run each kernel with them on tensors
/// small enough for a test.
#[cfg(all(test, feature = "cpu"))]
pub(crate) mod wide {
    use super::AddressType;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    /// Whether [`launches`] runs, and how many kernels it launched. Process-wide: the
    /// fusion server launches on its own thread.
    static WIDE: AtomicBool = AtomicBool::new(false);
    static LAUNCHED: AtomicUsize = AtomicUsize::new(0);

    /// `U64` (counted) while [`launches`] runs.
    pub(super) fn instead(_needed: AddressType) -> Option<AddressType> {
        WIDE.load(Ordering::SeqCst).then(|| {
            LAUNCHED.fetch_add(1, Ordering::SeqCst);
            AddressType::U64
        })
    }

    /// Runs `f` (a test) with every kernel given 64-bit offsets; the number of kernels it
    /// launched. It holds the lock the tests that launch kernels take
    /// (`crate::test_values::one_cube_test_at_a_time`, which `f` may take again), so no
    /// other test's kernels run meanwhile; `f` must read its results before it returns.
    pub(crate) fn launches(f: impl FnOnce()) -> usize {
        let _alone = crate::test_values::one_cube_test_at_a_time();
        LAUNCHED.store(0, Ordering::SeqCst);
        WIDE.store(true, Ordering::SeqCst);
        // Off again even where `f` fails, for the tests after it.
        struct Off;
        impl Drop for Off {
            fn drop(&mut self) {
                WIDE.store(false, Ordering::SeqCst);
            }
        }
        let _off = Off;
        f();
        LAUNCHED.load(Ordering::SeqCst)
    }
}
