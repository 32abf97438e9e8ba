//! A batch of instances on the device, uploaded in one transfer.

use burn::tensor::{Bool, Device, Int, Tensor, TensorData};
use routeburn_data::{Batch, InstanceRng};

/// The device-side view of a [`Batch`], plus the uniform noise a sampled decode consumes.
///
/// Everything the decoder needs crosses to the device in one buffer per batch: node
/// coordinates, demands, capacities and (when sampling) noise, sliced apart on the device.
#[derive(Debug, Clone)]
pub struct DeviceBatch {
    /// `[B, N, 2]` node coordinates, depot first.
    pub coords: Tensor<3>,
    /// `[B, N]` integer demands as f32, depot 0.
    pub demands: Tensor<2>,
    /// `[B, 1]` vehicle capacities.
    pub capacity: Tensor<2>,
    /// `[B * rows_per_instance, steps]` uniforms in (0, 1) for sampled decodes: each row
    /// a decode of its instance (rows instance-major), each column one decode step.
    pub noise: Option<Tensor<2>>,
    /// A lower bound on the steps any full decode of this batch takes (computed on the
    /// host): the decoder need not check for completion before it.
    pub min_steps: usize,
}

/// Target tours of a supervised batch, on the device.
#[derive(Debug, Clone)]
pub struct DeviceTargets {
    /// `[B, T]` node indices, padded with depot visits.
    pub targets: Tensor<2, Int>,
    /// `[B, T]` true inside each tour's true length.
    pub valid: Tensor<2, Bool>,
}

/// How much sampling noise to upload with a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NoiseShape {
    /// Sampled decodes per instance (1, or a multi-start decode's starts: n or fewer).
    pub rows_per_instance: usize,
}

impl DeviceBatch {
    /// Uploads `batch`; with `noise`, also draws `[B * rows, 2n]` uniforms from `rng`
    /// (enough for the longest possible decode) in the same transfer.
    pub fn upload(
        batch: &Batch,
        noise: Option<(NoiseShape, &mut InstanceRng)>,
        device: &Device,
    ) -> Self {
        Self::upload_inner(batch, noise, None, device).0
    }

    /// Uploads `batch`'s [`instance_values`](Self::instance_values) as one flat tensor, for
    /// [`from_flat`](Self::from_flat): the input buffer of a decode recorded as a device
    /// graph, which the next batch's values overwrite in place.
    pub fn upload_flat(batch: &Batch, device: &Device) -> Tensor<1> {
        let values = Self::instance_values(batch);
        let len = values.len();
        Tensor::from_data(TensorData::new(values, [len]), device)
    }

    /// The batch (no noise) whose coordinates, demands and capacities are views of `flat`,
    /// which starts with `batch`'s [`instance_values`](Self::instance_values). The views are
    /// issued anew on each call, so a decode that starts from them reads the buffer as it
    /// is then: views kept from an earlier decode can read a copy instead, since fusion
    /// stores a view it computed for a tensor that is still alive (seen on CubeCL's CPU
    /// runtime).
    pub fn from_flat(flat: &Tensor<1>, batch: &Batch) -> Self {
        let (b, nodes) = (batch.size, batch.num_nodes());
        let view = |at: usize, len: usize| flat.clone().slice(at..at + len);
        Self {
            coords: view(0, b * nodes * 2).reshape([b, nodes, 2]),
            demands: view(b * nodes * 2, b * nodes).reshape([b, nodes]),
            capacity: view(b * nodes * 3, b).reshape([b, 1]),
            noise: None,
            min_steps: min_decode_steps(batch),
        }
    }

    /// The values [`upload`](Self::upload) sends for `batch`'s instances, in its order:
    /// `[B, N, 2]` coordinates, `[B, N]` demands, `[B]` capacities, as f32.
    pub fn instance_values(batch: &Batch) -> Vec<f32> {
        let (b, nodes) = (batch.size, batch.num_nodes());
        let mut values = Vec::with_capacity(b * nodes * 3 + b);
        values.extend_from_slice(&batch.coords);
        values.extend(batch.node_demands.iter().map(|&d| d as f32));
        values.extend(batch.capacities.iter().map(|&c| c as f32));
        values
    }

    /// Uploads `batch` and its target tours (one action sequence per instance, see
    /// `routeburn_cost::Solution::to_actions`) in one transfer, for supervised training.
    /// Targets are padded with depot visits to the longest; `valid` marks the positions
    /// inside each tour's true length.
    pub fn upload_with_targets(
        batch: &Batch,
        targets: &[Vec<i64>],
        device: &Device,
    ) -> (Self, DeviceTargets) {
        assert_eq!(targets.len(), batch.size, "one target tour per instance");
        let (problem, targets) = Self::upload_inner(batch, None, Some(targets), device);
        (problem, targets.expect("targets uploaded"))
    }

    fn upload_inner(
        batch: &Batch,
        noise: Option<(NoiseShape, &mut InstanceRng)>,
        targets: Option<&[Vec<i64>]>,
        device: &Device,
    ) -> (Self, Option<DeviceTargets>) {
        let b = batch.size;
        let steps = max_decode_steps(batch.n);
        let noise_len = noise
            .as_ref()
            .map_or(0, |(s, _)| b * s.rows_per_instance * steps);
        let mut buffer = Self::instance_values(batch);
        let instance_len = buffer.len();
        buffer.reserve(noise_len);
        let rows = if let Some((shape, rng)) = noise {
            // Strictly inside (0, 1): a zero would select a masked first node.
            buffer.extend(
                (0..noise_len)
                    .map(|_| ((rng.next_u64() >> 40) as f32 + 0.5) * (1.0 / (1u64 << 24) as f32)),
            );
            Some(b * shape.rows_per_instance)
        } else {
            None
        };
        // Node indices are exact in f32 (far below 2²⁴) and turned back into ints on the
        // device, so the targets ride in the same buffer.
        let target_len = targets.map(|t| t.iter().map(Vec::len).max().unwrap_or(0).max(1));
        if let (Some(targets), Some(len)) = (targets, target_len) {
            for tour in targets {
                buffer.extend(tour.iter().map(|&a| a as f32));
                buffer.extend(std::iter::repeat_n(0.0, len - tour.len()));
            }
            for tour in targets {
                buffer.extend(std::iter::repeat_n(1.0, tour.len()));
                buffer.extend(std::iter::repeat_n(0.0, len - tour.len()));
            }
        }
        let total = buffer.len();
        let flat = Tensor::<1>::from_data(TensorData::new(buffer, [total]), device);
        let instances = Self::from_flat(&flat, batch);
        let mut at = instance_len;
        let mut take = |len: usize| {
            let t = flat.clone().slice(at..at + len);
            at += len;
            t
        };
        let noise = rows.map(|r| take(r * steps).reshape([r, steps]));
        let targets = target_len.map(|len| DeviceTargets {
            targets: take(b * len).reshape([b, len]).int(),
            valid: take(b * len).reshape([b, len]).greater_elem(0.5),
        });
        (Self { noise, ..instances }, targets)
    }

    /// The instances `instances` of the batch, with their noise rows: one shard of a
    /// data-parallel step. On the CPU backends a slice is a view, so this copies nothing.
    /// `min_steps` stays the batch's: a lower bound of the slowest instance, so the
    /// shard's decode starts checking for completion no earlier than the whole batch's.
    pub fn shard(&self, instances: std::ops::Range<usize>) -> Self {
        let b = self.size();
        let noise = self.noise.as_ref().map(|t| {
            let per_instance = t.dims()[0] / b;
            t.clone().slice_dim(
                0,
                instances.start * per_instance..instances.end * per_instance,
            )
        });
        Self {
            coords: self.coords.clone().slice_dim(0, instances.clone()),
            demands: self.demands.clone().slice_dim(0, instances.clone()),
            capacity: self.capacity.clone().slice_dim(0, instances),
            noise,
            min_steps: self.min_steps,
        }
    }

    pub fn size(&self) -> usize {
        self.coords.dims()[0]
    }

    pub fn num_nodes(&self) -> usize {
        self.coords.dims()[1]
    }

    /// `[B, N]` demand / capacity, the encoder's demand feature.
    pub fn demand_fraction(&self) -> Tensor<2> {
        self.demands.clone() / self.capacity.clone()
    }

    /// The same tensors outside any autodiff graph (for a frozen baseline's rollout).
    pub fn without_autodiff(&self) -> Self {
        Self {
            coords: self.coords.clone().without_autodiff(),
            demands: self.demands.clone().without_autodiff(),
            capacity: self.capacity.clone().without_autodiff(),
            noise: self.noise.clone().map(|t| t.without_autodiff()),
            min_steps: self.min_steps,
        }
    }
}

/// An upper bound on decode steps for n customers under Kool's masks: the depot cannot be
/// visited twice in a row while customers remain, so at worst every customer is followed by
/// a depot visit.
pub fn max_decode_steps(n: usize) -> usize {
    2 * n
}

/// A lower bound on the steps of the slowest instance: n customer visits plus at least
/// ceil(total demand / capacity) - 1 depot visits between routes.
fn min_decode_steps(batch: &Batch) -> usize {
    let nodes = batch.num_nodes();
    batch
        .node_demands
        .chunks_exact(nodes)
        .zip(&batch.capacities)
        .map(|(d, &c)| {
            let total: u64 = d.iter().map(|&x| x as u64).sum();
            batch.n + (total.div_ceil(c as u64) as usize).saturating_sub(1)
        })
        .max()
        .unwrap_or(0)
}
