//! CubeCL's configuration for the CUDA (and CubeCL CPU) backends: the persistent kernel
//! cache, on by default, and the logs that count fusion explorations and kernel compiles.
//!
//! Every kernel CubeCL compiles (cubecl → LLVM → PTX) costs tens to hundreds of
//! milliseconds, and a first training step compiles hundreds. CubeCL can keep them on disk
//! but ships with that off (`compilation.cache`, cubecl-runtime 0.11 `config/compilation.rs`);
//! routeburn turns it on in a per-user directory, so a second process starts warm. The
//! cache is keyed on the binary's build id: a rebuilt binary starts a fresh one.
//!
//! - Directory: `$ROUTEBURN_KERNEL_CACHE_DIR`, else `$XDG_CACHE_HOME/routeburn/kernels`,
//!   else `~/.cache/routeburn/kernels`.
//! - Off: `--no-kernel-cache` on the command line (see [`set_kernel_cache`]) or
//!   `ROUTEBURN_KERNEL_CACHE=off`. Any other CubeCL setting still comes from a
//!   `cubecl.toml` (or `burn.toml`'s `[cubecl]`) in the working directory or above it.
//!
//! Fusion plans are not persisted by CubeCL: a new process explores each op stream once.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

static KERNEL_CACHE: AtomicBool = AtomicBool::new(true);

/// Turns the kernel cache on or off for this process; call before the first CubeCL device.
pub fn set_kernel_cache(enabled: bool) {
    KERNEL_CACHE.store(enabled, Ordering::Relaxed);
}

/// Where the kernel cache lives, or `None` when it is off.
pub fn kernel_cache_dir() -> Option<PathBuf> {
    let off = std::env::var("ROUTEBURN_KERNEL_CACHE")
        .is_ok_and(|v| matches!(v.to_ascii_lowercase().as_str(), "off" | "0" | "false"));
    if off || !KERNEL_CACHE.load(Ordering::Relaxed) {
        return None;
    }
    let from_env = |name: &str| std::env::var_os(name).filter(|v| !v.is_empty());
    if let Some(dir) = from_env("ROUTEBURN_KERNEL_CACHE_DIR") {
        return Some(PathBuf::from(dir));
    }
    let cache_root = from_env("XDG_CACHE_HOME")
        .map(PathBuf::from)
        .or_else(|| from_env("HOME").map(|home| PathBuf::from(home).join(".cache")))?;
    Some(cache_root.join("routeburn").join("kernels"))
}

/// Sets CubeCL's configuration once per process, before its first device (the backend
/// calls it): the configuration file CubeCL would read, with the kernel cache in
/// [`kernel_cache_dir`]. For a GPU, says on stderr when the cache is empty, since the
/// first steps then compile for minutes (CubeCL's CPU runtime keeps no kernels on disk).
#[cfg(feature = "cube")]
pub(crate) fn configure(gpu: bool) {
    use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
    // `false`: set before (by `count_compiles_in`) or already read; it stays as it is.
    let _ = CubeClRuntimeConfig::try_set(cubecl_runtime_config(None));
    keep_products_apart_from_their_epilogues();
    if gpu {
        announce_an_empty_cache();
    }
}

/// Takes Burn's matmul fusion out of every CubeCL stream (unless `ROUTEBURN_FUSE_MATMUL=1`),
/// once, before the first stream exists (later, the registry refuses and nothing changes).
///
/// With it, a product and the elementwise operations after it (a bias, a skip connection,
/// a relu) become one cubek matmul with those operations as its epilogue, autotuned anew
/// for every (shape, operation count): ~15 more candidate kernels compiled per linear layer
/// in a first step, and on the `cpu` stand-in a first step that had not ended after 20
/// minutes of timing candidates. Without it, those operations still fuse into one kernel
/// after the product's: a launch more per layer, and no new autotune keys.
#[cfg(feature = "cube")]
fn keep_products_apart_from_their_epilogues() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var("ROUTEBURN_FUSE_MATMUL").is_ok_and(|v| v == "1") {
            return;
        }
        // `ServiceRunning` only: another device started the fusion service first.
        let _ = burn_cubecl::fusion::remove(MATMUL_FUSION);
    });
}

/// Burn's name for its matmul fusion (burn-cubecl-fusion 0.22.1 `optim/matmul`); removing a
/// name it does not know is no error, so a test checks it.
#[cfg(feature = "cube")]
const MATMUL_FUSION: &str = "Matmul";

/// Says once per process that kernels are being compiled, when the cache is empty.
#[cfg(feature = "cube")]
fn announce_an_empty_cache() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    let Some(dir) = kernel_cache_dir() else {
        return;
    };
    ONCE.call_once(|| {
        let empty = !std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some());
        if empty {
            eprintln!(
                "routeburn: compiling GPU kernels on first use (the first steps take minutes); \
                 they are cached in {} for the next runs (off: --no-kernel-cache)",
                dir.display()
            );
        }
    });
}

#[cfg(feature = "cube")]
fn cubecl_runtime_config(count_dir: Option<&Path>) -> burn::cubecl::config::CubeClRuntimeConfig {
    use burn::cubecl::config::{cache::CacheConfig, CubeClRuntimeConfig, RuntimeConfig};
    let mut config = CubeClRuntimeConfig::from_current_dir().override_from_env();
    if let Some(dir) = kernel_cache_dir() {
        config.compilation.cache = true;
        config.environment.path = CacheConfig::Directory(dir);
    }
    if let Some(dir) = count_dir {
        config.autotune.decisions.file = Some(dir.join(AUTOTUNE_LOG));
    }
    config
}

const FUSION_LOG: &str = "fusion.log";
const AUTOTUNE_LOG: &str = "autotune.jsonl";

/// Why the compile counters could not be set up.
#[derive(Debug, thiserror::Error)]
#[error("cannot count compiles: {0}")]
pub struct CountError(String);

/// Logs every fusion exploration and autotune decision under `dir` for [`CompileCounts`];
/// call before any tensor is created (Burn reads its configuration once).
///
/// Full fusion logging writes a line per registered operation: steps run slower while it
/// is on.
pub fn count_compiles_in(dir: &Path) -> Result<(), CountError> {
    #[cfg(feature = "cube")]
    {
        use burn::cubecl::config::{CubeClRuntimeConfig, RuntimeConfig};
        use burn::BurnConfig;
        std::fs::create_dir_all(dir).map_err(|e| CountError(format!("{}: {e}", dir.display())))?;
        // BurnConfig's fields are private: edit it as TOML.
        let burn = BurnConfig::from_current_dir().override_from_env();
        let mut value =
            toml::Value::try_from(&burn).map_err(|e| CountError(format!("Burn's config: {e}")))?;
        let mut logger = toml::map::Map::new();
        logger.insert("level".into(), "full".into());
        logger.insert("append".into(), true.into());
        let file = dir.join(FUSION_LOG).display().to_string();
        logger.insert("file".into(), file.into());
        let fusion = value
            .get_mut("fusion")
            .and_then(toml::Value::as_table_mut)
            .ok_or_else(|| CountError("Burn's config has no [fusion] section".into()))?;
        fusion.insert("logger".into(), logger.into());
        let burn: BurnConfig = value
            .try_into()
            .map_err(|e| CountError(format!("Burn's config: {e}")))?;
        if !BurnConfig::try_set(burn)
            || !CubeClRuntimeConfig::try_set(cubecl_runtime_config(Some(dir)))
        {
            return Err(CountError(
                "Burn's configuration was read before the counters were set up".into(),
            ));
        }
        Ok(())
    }
    #[cfg(not(feature = "cube"))]
    {
        let _ = dir;
        Err(CountError(
            "no CubeCL backend (cuda, cpu) was compiled into this binary".into(),
        ))
    }
}

/// What CubeCL has done so far in this process, read from the logs of
/// [`count_compiles_in`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CompileCounts {
    /// Op streams that missed the fusion plan cache and were explored (each new plan is
    /// then compiled into kernels).
    pub explorations: usize,
    /// Matmul and reduce shapes autotuned. Each times its candidates (up to ~15 on CUDA, 2
    /// for a matmul on CubeCL's CPU runtime), compiling those whose kernel no earlier shape
    /// compiled.
    pub autotunes: usize,
    /// Wall time the autotunes spent on their candidates: each candidate's first launch
    /// compiles it, then its samples are timed (CubeCL's `TuningStep` events).
    pub tuning: Duration,
    /// PTX files in `$CUBECL_CUDA_DUMP_PTX`, one per kernel CUDA loaded, when it is set.
    pub ptx_kernels: Option<usize>,
}

impl CompileCounts {
    pub fn read(dir: &Path) -> Self {
        let lines_with = |file: &str, needle: &str| {
            std::fs::read_to_string(dir.join(file))
                .map(|text| text.lines().filter(|l| l.contains(needle)).count())
                .unwrap_or(0)
        };
        let ptx_kernels = std::env::var_os("CUBECL_CUDA_DUMP_PTX").map(|ptx| {
            std::fs::read_dir(ptx).map_or(0, |entries| {
                entries
                    .filter_map(Result::ok)
                    .filter(|e| e.path().extension().is_some_and(|x| x == "ptx"))
                    .count()
            })
        });
        let decisions = std::fs::read_to_string(dir.join(AUTOTUNE_LOG)).unwrap_or_default();
        let decisions: Vec<&str> = decisions.lines().filter(|l| l.contains('{')).collect();
        Self {
            explorations: lines_with(FUSION_LOG, "exploration completed"),
            autotunes: decisions.len(),
            tuning: decisions.iter().map(|d| tuning_time(d)).sum(),
            ptx_kernels,
        }
    }

    /// What happened between `earlier` and `self`.
    pub fn since(self, earlier: Self) -> Self {
        Self {
            explorations: self.explorations - earlier.explorations,
            autotunes: self.autotunes - earlier.autotunes,
            tuning: self.tuning.saturating_sub(earlier.tuning),
            ptx_kernels: self
                .ptx_kernels
                .zip(earlier.ptx_kernels)
                .map(|(a, b)| a - b),
        }
    }
}

/// The time one autotune decision (a line of CubeCL's decisions log) spent on its
/// candidates: the sum of its `log_context.events[].TuningStep` durations, each written as
/// `[name, {"secs": S, "nanos": N}]`. A line that does not parse counts as no time.
fn tuning_time(decision: &str) -> Duration {
    let Ok(value) = serde_json::from_str::<serde_json::Value>(decision) else {
        return Duration::ZERO;
    };
    let events = value["log_context"]["events"].as_array();
    events
        .into_iter()
        .flatten()
        .filter_map(|event| {
            let wall = &event["TuningStep"][1];
            let secs = wall["secs"].as_u64()?;
            let nanos = u32::try_from(wall["nanos"].as_u64()?).ok()?;
            Some(Duration::new(secs, nanos))
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_is_off_when_disabled() {
        set_kernel_cache(false);
        assert_eq!(kernel_cache_dir(), None);
        set_kernel_cache(true);
    }

    #[test]
    fn counts_are_read_from_the_logs() {
        let dir = std::env::temp_dir().join(format!("routeburn-counts-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let fusion = "[plan] exploration completed: lazy, 3/4 ops optimized\n\
                      [plan] cache hit: execute plan #0\n\
                      [plan] exploration completed: sync, 1/1 ops optimized\n";
        std::fs::write(dir.join(FUSION_LOG), fusion).unwrap();
        // Two decisions as CubeCL writes them (cubecl-runtime 0.11 `tune/log.rs`), cut to
        // the fields read: 1.5 s + 0.25 s of candidates, then 2 ms; a third line is torn.
        let decisions = r#"{"key":{"m":16},"log_context":{"limit":null,"events":[{"TuningStep":["gemm_a",{"secs":1,"nanos":500000000}]},{"ShortCircuit":"gemm_a"},{"TuningStep":["gemm_b",{"secs":0,"nanos":250000000}]}]}}
{"key":{"Sum":{"length":16}},"log_context":{"events":[{"TuningStep":["sum_one_shot",{"secs":0,"nanos":2000000}]}]}}
{"key":{"m":"#;
        std::fs::write(dir.join(AUTOTUNE_LOG), decisions).unwrap();
        let counts = CompileCounts::read(&dir);
        assert_eq!((counts.explorations, counts.autotunes), (2, 3));
        assert_eq!(counts.tuning, Duration::from_millis(1752));
        let later = CompileCounts {
            explorations: 5,
            ..counts
        };
        assert_eq!(later.since(counts).explorations, 3);
        assert_eq!(later.since(counts).tuning, Duration::ZERO);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[cfg(feature = "cube")]
    #[test]
    fn the_matmul_fusion_removed_is_burns() {
        assert!(burn_cubecl::fusion::BUILTIN_NAMES.contains(&MATMUL_FUSION));
    }
}
