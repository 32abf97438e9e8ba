//! Counting the kernels a CubeCL backend launches, and optionally timing each one.
//!
//! Below a few thousand elements a GPU kernel finishes in microseconds, so a small
//! model's step costs what its launches cost: the number of kernels is the figure to cut,
//! and it can be counted without a GPU on CubeCL's CPU runtime (`cpu`), which launches
//! through the same client as CUDA. CubeCL calls an observer (`LaunchObserver`) on every
//! launch, before it is submitted, from whichever thread issues it: under fusion that is
//! the thread that flushes a queue of fused operations, not always the caller's, and a
//! queue filled in one piece of work may be flushed in the next. So the counts are
//! process-wide: [`issued`] read before and after a piece of work gives the launches
//! flushed meanwhile, and [`label`] names the work the launches that follow belong to.
//!
//! With timing on, each launch is timed on the device and read back before the next
//! starts (CubeCL's `TimingRequest::Resolved`): the sum is the device's busy time, and
//! the run is slower than an untimed one, so read wall times from a run without it.

use std::collections::HashMap;
use std::time::Duration;

/// Launches and their device time: a process's totals, a phase's or a kernel's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Issued {
    pub launches: u64,
    /// Summed kernel time, when launches are timed; zero otherwise.
    pub kernel_time: Duration,
}

impl std::ops::Add for Issued {
    type Output = Self;

    fn add(self, other: Self) -> Self {
        Self {
            launches: self.launches + other.launches,
            kernel_time: self.kernel_time + other.kernel_time,
        }
    }
}

impl Issued {
    /// What was issued between `earlier` and `self`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            launches: self.launches - earlier.launches,
            kernel_time: self.kernel_time.saturating_sub(earlier.kernel_time),
        }
    }
}

/// Every kernel launched while watching, by name (CubeCL's name for the kernel type,
/// shortened to its last path segment, with its first type parameter's).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ByKernel(pub HashMap<String, Issued>);

impl ByKernel {
    /// What was launched between `earlier` and `self`.
    pub fn since(&self, earlier: &Self) -> Self {
        let mut out = HashMap::new();
        for (name, now) in &self.0 {
            let before = earlier.0.get(name).copied().unwrap_or_default();
            if now.launches > before.launches {
                out.insert(name.clone(), now.since(before));
            }
        }
        Self(out)
    }

    /// Both tallies together, kernel by kernel.
    pub fn plus(&self, other: &Self) -> Self {
        let mut out = self.0.clone();
        for (name, issued) in &other.0 {
            let sum = out.get(name).copied().unwrap_or_default() + *issued;
            out.insert(name.clone(), sum);
        }
        Self(out)
    }

    /// Every kernel's launches (and device time) together.
    pub fn total(&self) -> Issued {
        self.0.values().fold(Issued::default(), |a, &b| a + b)
    }

    /// The kernels launched most often first (ties by name).
    pub fn most_launched(&self) -> Vec<(&str, Issued)> {
        let mut v: Vec<_> = self.0.iter().map(|(k, t)| (k.as_str(), *t)).collect();
        v.sort_by(|a, b| b.1.launches.cmp(&a.1.launches).then(a.0.cmp(b.0)));
        v
    }
}

/// Watches every kernel launch of the process until dropped.
#[must_use = "launches are counted only while the watch is kept"]
pub struct Watch {
    #[cfg(feature = "cube")]
    _observation: burn::cubecl::logging::LaunchObservation,
}

impl std::fmt::Debug for Watch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("launches::Watch")
    }
}

/// Starts counting launches (and timing each, with `timed`); `None` when no CubeCL
/// backend is compiled in, as nothing else launches kernels. With the environment variable
/// `ROUTEBURN_LAUNCH_TRACE` set, each launch is also written to stderr, in order, as
/// `launch <label> <kernel>`: what a phase's count is made of.
pub fn watch(timed: bool) -> Option<Watch> {
    #[cfg(feature = "cube")]
    {
        use std::sync::Arc;
        let traced = std::env::var_os("ROUTEBURN_LAUNCH_TRACE").is_some();
        let observer = Arc::new(observe::Counter { timed, traced });
        Some(Watch {
            _observation: burn::cubecl::logging::LaunchObservation::new(observer),
        })
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = timed;
        None
    }
}

/// The process's totals so far: two relaxed loads, cheap enough to read around every
/// phase of every step.
pub fn issued() -> Issued {
    #[cfg(feature = "cube")]
    {
        observe::issued()
    }
    #[cfg(not(feature = "cube"))]
    {
        Issued::default()
    }
}

/// Charges the launches that follow to `label` (0: unlabelled) until the next call, and
/// returns the label it replaces. A relaxed swap: cheap around every phase of every step.
pub fn label(label: u8) -> u8 {
    LABEL.swap(label, std::sync::atomic::Ordering::Relaxed)
}

static LABEL: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// The process's launches so far, by kernel, of the labels `wanted` accepts.
pub fn by_kernel(wanted: impl Fn(u8) -> bool) -> ByKernel {
    #[cfg(feature = "cube")]
    {
        observe::by_kernel(wanted)
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = wanted;
        ByKernel::default()
    }
}

#[cfg(feature = "cube")]
mod observe {
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, PoisonError};
    use std::time::Duration;

    use burn::cubecl::logging::{LaunchObserver, TimingMethod, TimingRequest};

    use super::{ByKernel, Issued};

    static LAUNCHES: AtomicU64 = AtomicU64::new(0);
    static KERNEL_NANOS: AtomicU64 = AtomicU64::new(0);
    /// Keyed by the label and the kernel's `&'static str`: a launch neither allocates nor
    /// formats.
    type Tallies = HashMap<(u8, &'static str), Issued>;
    static BY_KERNEL: Mutex<Option<Tallies>> = Mutex::new(None);

    fn tally(kernel: &'static str) -> (u8, &'static str) {
        (super::LABEL.load(Ordering::Relaxed), kernel)
    }

    pub(super) struct Counter {
        pub(super) timed: bool,
        pub(super) traced: bool,
    }

    impl LaunchObserver for Counter {
        fn launched(&self, kernel: &'static str) {
            if self.traced {
                eprintln!("launch {} {kernel}", super::LABEL.load(Ordering::Relaxed));
            }
            LAUNCHES.fetch_add(1, Ordering::Relaxed);
            let mut map = BY_KERNEL.lock().unwrap_or_else(PoisonError::into_inner);
            map.get_or_insert_with(HashMap::new)
                .entry(tally(kernel))
                .or_default()
                .launches += 1;
        }

        fn timing(&self) -> TimingRequest {
            match self.timed {
                true => TimingRequest::Resolved,
                false => TimingRequest::None,
            }
        }

        fn timed(&self, kernel: &'static str, duration: Duration, _method: TimingMethod) {
            let nanos = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
            KERNEL_NANOS.fetch_add(nanos, Ordering::Relaxed);
            let mut map = BY_KERNEL.lock().unwrap_or_else(PoisonError::into_inner);
            map.get_or_insert_with(HashMap::new)
                .entry(tally(kernel))
                .or_default()
                .kernel_time += duration;
        }
    }

    pub(super) fn issued() -> Issued {
        Issued {
            launches: LAUNCHES.load(Ordering::Relaxed),
            kernel_time: Duration::from_nanos(KERNEL_NANOS.load(Ordering::Relaxed)),
        }
    }

    pub(super) fn by_kernel(wanted: impl Fn(u8) -> bool) -> ByKernel {
        use burn::cubecl::config::{type_name_format, TypeNameFormatLevel};
        let map = BY_KERNEL.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out: HashMap<String, Issued> = HashMap::new();
        let labelled = map
            .iter()
            .flatten()
            .filter(|((label, _), _)| wanted(*label));
        for ((_, name), tally) in labelled {
            // Generic instances of one kernel type share a short name: summed.
            // CubeCL separates a kernel's type parameters with `|`: not in a table cell. The
            // kernel and its first parameter name it; a matmul's twelve more do not.
            let balanced = type_name_format(name, TypeNameFormatLevel::Balanced);
            let short = balanced.split(" | ").take(2).collect::<Vec<_>>().join("/");
            let entry = out.entry(short).or_default();
            *entry = *entry + *tally;
        }
        ByKernel(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On CubeCL's CPU runtime: a piece of work run three times issues three times the
    /// launches of one run, once its kernels are compiled, all under the label set while
    /// it ran.
    #[cfg(feature = "cpu")]
    #[test]
    fn cube_launches_are_counted_and_labelled() {
        use burn::tensor::{Tensor, TensorData};
        let _alone = crate::runtime::testing::one_cube_test_at_a_time();
        let device = crate::runtime::backend::Backend::Cpu.device().unwrap();
        let x = Tensor::<1>::from_data(TensorData::new(vec![0.5f32; 64], [64]), &device);
        let work = || {
            let y = (x.clone().exp() * 2.0 + 1.0).sum();
            y.into_data().try_to_vec::<f32>().unwrap()
        };
        let _watch = watch(false).unwrap();
        let before = issued();
        let first = work();
        assert!(issued().since(before).launches > 0, "no launch counted");
        let before = issued();
        assert_eq!(work(), first);
        let one = issued().since(before).launches;
        let labelled = |l| {
            by_kernel(move |k| k == l)
                .0
                .values()
                .map(|t| t.launches)
                .sum::<u64>()
        };
        let (outer, before, before_7) = (label(7), issued(), labelled(7));
        for _ in 0..3 {
            assert_eq!(work(), first);
        }
        assert_eq!(label(outer), 7);
        assert_eq!(issued().since(before).launches, 3 * one);
        assert_eq!(labelled(7) - before_7, 3 * one);
    }

    #[test]
    fn differences_drop_kernels_not_launched_since() {
        let tally = |launches, ms| Issued {
            launches,
            kernel_time: Duration::from_millis(ms),
        };
        let earlier = ByKernel(HashMap::from([
            ("a".to_string(), tally(3, 5)),
            ("b".to_string(), tally(2, 1)),
        ]));
        let now = ByKernel(HashMap::from([
            ("a".to_string(), tally(7, 9)),
            ("b".to_string(), tally(2, 1)),
            ("c".to_string(), tally(7, 2)),
        ]));
        let since = now.since(&earlier);
        assert_eq!(
            since.most_launched(),
            vec![("c", tally(7, 2)), ("a", tally(4, 4))]
        );
    }
}
