//! Whether a decode or a training run on the CPU fits in the memory the machine has, asked
//! before it starts: one too large for the machine is refused with its size and what to
//! change, not killed by the operating system halfway.

use burn::tensor::Device;
use routeburn_model::{decode_chunk, DeviceTraits};

use crate::config::{AttentionConfig, Config, ModelConfig};
use crate::error::TrainError;

/// Refuses a decode on a CPU `device` of `instances` instances (symmetries and copies
/// included) of `nodes` nodes, `rows_per_instance` rollouts each, that needs more memory
/// than is available. A GPU's memory is not checked here, nor where the OS does not say
/// what is available.
pub(crate) fn check_decode_fits(
    device: &Device,
    (instances, nodes, rows_per_instance): (usize, usize, usize),
    strategy: &str,
) -> Result<(), TrainError> {
    match (DeviceTraits::of(device).host_memory, available_memory()) {
        (true, Some(available)) => DecodeSize::on_cpu(device, instances, nodes, rows_per_instance)
            .check(available, strategy),
        _ => Ok(()),
    }
}

/// Bytes a decode on the CPU holds per rollout and node: each rollout's mask, scores and
/// glimpse weights per head over the nodes, and its tour of up to 2n steps. Measured as
/// the peak resident set of `routeburn solve` on flex (multi-start, one instance and ×8):
/// 61 bytes from CVRP200 to CVRP500, 72 up to CVRP1000, beside ~20 MB for the rest.
const BYTES_PER_ROLLOUT_NODE: u64 = 72;

/// Refuses training the attention model on a CPU `device` where the attention weights its
/// encoder keeps for the backward of one shard alone, (`training.batch_size` / shards) ·
/// heads · (n + 1)² floats a layer, exceed the memory available. That is a lower bound of
/// what a step holds, so no run that fits is refused. `origin` names the config.
pub(crate) fn check_training_fits(
    device: &Device,
    config: &Config,
    origin: &str,
) -> Result<(), TrainError> {
    let ModelConfig::Attention(model) = &config.model else {
        return Ok(());
    };
    let (Some(available), true) = (available_memory(), DeviceTraits::of(device).host_memory) else {
        return Ok(());
    };
    let (batch, n) = (config.training.batch_size, config.problem.n);
    let shards = config
        .training
        .shards
        .unwrap_or(rayon::current_num_threads());
    let per_shard = batch.div_ceil(shards.max(1));
    let kept = training_attention_bytes(per_shard, n, model);
    if kept <= available {
        return Ok(());
    }
    Err(TrainError::Input(format!(
        "{origin}: problem.n = {n} with training.batch_size = {batch}: the encoder keeps \
         {per_shard} instances (one of {shards} shards) × {} heads × {}² attention weights in \
         each of its {} layers for the backward, at least {:.1} GiB, and this machine has \
         {:.1} GiB available; lower training.batch_size or problem.n",
        model.num_heads,
        n + 1,
        model.num_layers,
        gib(kept),
        gib(available),
    )))
}

/// The bytes of the attention weights a training step's encoder keeps for the backward.
fn training_attention_bytes(batch: usize, n: usize, model: &AttentionConfig) -> u64 {
    let nodes = (n as u64).saturating_add(1);
    [batch, model.num_heads, model.num_layers, 4]
        .into_iter()
        .fold(nodes.saturating_mul(nodes), |bytes, k| {
            bytes.saturating_mul(k as u64)
        })
}

fn gib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 30)
}

/// A decode's size: how many rollouts it runs at once, over how many nodes.
#[derive(Debug, Clone, Copy)]
struct DecodeSize {
    rollouts: usize,
    nodes: usize,
}

impl DecodeSize {
    /// The rollouts that run at once when `instances` (symmetries and copies included) of
    /// `nodes` nodes are decoded `rows_per_instance` rollouts each on a CPU `device`: as
    /// many chunks of [`decode_chunk`] instances as rayon has threads.
    fn on_cpu(device: &Device, instances: usize, nodes: usize, rows_per_instance: usize) -> Self {
        let chunk = decode_chunk(device, nodes);
        let at_once = instances.min(chunk.saturating_mul(rayon::current_num_threads()));
        Self {
            rollouts: at_once.saturating_mul(rows_per_instance),
            nodes,
        }
    }

    fn bytes(&self) -> u64 {
        BYTES_PER_ROLLOUT_NODE
            .saturating_mul(self.rollouts as u64)
            .saturating_mul(self.nodes as u64)
    }

    /// An error where the decode needs more than `available` bytes; `strategy` names what
    /// was asked for.
    fn check(&self, available: u64, strategy: &str) -> Result<(), TrainError> {
        let needed = self.bytes();
        if needed <= available {
            return Ok(());
        }
        Err(TrainError::Input(format!(
            "--strategy {strategy} decodes {} rollouts of {} nodes at once, about {:.1} GiB \
             on the CPU, and this machine has {:.1} GiB available; use a strategy with fewer \
             rollouts per instance (greedy: 1, aug8: 8, multistart: n, multistart+aug8: 8n)",
            self.rollouts,
            self.nodes,
            gib(needed),
            gib(available),
        )))
    }
}

/// The memory the operating system can give without swapping (Linux's `MemAvailable`);
/// None where it does not say.
fn available_memory() -> Option<u64> {
    proc_bytes("/proc/meminfo", "MemAvailable:")
}

/// The bytes a Linux `/proc` file gives in kB on the line starting with `key`
/// (`/proc/meminfo`, `/proc/self/status`); None where there is no such file or line.
pub(crate) fn proc_bytes(file: &str, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Hand-computed: one CVRP60000 instance, multi-start ×8, is 480,000 rollouts of 60,001
    /// nodes, 72 · 480,000 · 60,001 B = 1.93 TiB; greedy is one rollout, 4.1 MiB.
    #[test]
    fn a_decode_larger_than_the_memory_is_refused_with_its_size() {
        let gib = 1u64 << 30;
        let huge = DecodeSize {
            rollouts: 8 * 60_000,
            nodes: 60_001,
        };
        assert_eq!(huge.bytes(), 72 * 480_000 * 60_001);
        let err = huge
            .check(22 * gib, "multistart+aug8")
            .unwrap_err()
            .to_string();
        assert!(err.contains("480000 rollouts of 60001 nodes"), "{err}");
        assert!(
            err.contains("1931.2 GiB") && err.contains("22.0 GiB available"),
            "{err}"
        );
        let greedy = DecodeSize {
            rollouts: 1,
            nodes: 60_001,
        };
        assert!(greedy.check(22 * gib, "greedy").is_ok());
        // CVRP1000, multi-start ×8: 8,000 rollouts, 577 MB measured; 0.54 GiB estimated.
        let measured = DecodeSize {
            rollouts: 8_000,
            nodes: 1_001,
        };
        assert!(measured.check(gib, "multistart+aug8").is_ok());
        assert!(measured.check(gib / 4, "multistart+aug8").is_err());
    }

    /// Hand-computed: the default model (8 heads, 3 layers) on CVRP100000 at batch 512
    /// keeps 512 · 8 · 100,001² · 3 · 4 B ≈ 2.2 PiB; on CVRP100, 512 · 8 · 101² · 3 · 4 B =
    /// 501,399,552 B (~0.47 GiB).
    #[test]
    fn training_keeps_batch_heads_nodes_squared_weights_a_layer() {
        let model = AttentionConfig::default();
        assert_eq!((model.num_heads, model.num_layers), (8, 3));
        assert_eq!(training_attention_bytes(512, 100, &model), 501_399_552);
        let huge = training_attention_bytes(512, 100_000, &model);
        assert_eq!(huge, 512 * 8 * 3 * 4 * 100_001 * 100_001);
        assert_eq!(
            training_attention_bytes(usize::MAX, 100_000, &model),
            u64::MAX
        );
    }
}
