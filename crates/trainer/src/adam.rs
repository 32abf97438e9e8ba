//! Adam on all of a model's parameters at once, after PyTorch's global-norm clipping.
//!
//! Burn's `ModuleOptimizer` updates each parameter tensor on its own (13 tensor operations
//! each) and clipping by the global norm adds 5 more a tensor: 689 operations a step for
//! tiny_1's 38 tensors. On a CubeCL device (CUDA) each operation costs its host-side handling
//! whatever its size: tiny_1 on an H200 spent 28 ms of a step in the optimizer, whose
//! arithmetic takes microseconds. There the parameters are joined into one vector, so the
//! norm, the clip and Adam's moments are 21 operations, and each parameter then takes its
//! slice of the update (4 operations a tensor: 173 in all). On the CPU backends each
//! parameter stays a segment of its own: an operation costs little there, and a tensor's chain
//! of operations stays in cache where one pass over all parameters would not (joined, a
//! tiny_1 step's optimizer took 7 ms on flex instead of 5).
//!
//! The arithmetic is Burn's `Adam`'s, operation for operation: a parameter gets the same
//! bits as from Burn's optimizer, joined or not (tested). The state is kept in Burn's
//! optimizer file format, one state per parameter keyed by its id, so checkpoints move between
//! devices, checkpoints written by Burn's `ModuleOptimizer` (routeburn before this) resume
//! here, and Burn's optimizer reads these.

use std::collections::HashMap;
use std::path::Path;

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param, ParamId};
use burn::optim::{
    AdamState, AdaptiveMomentumState, GradientsParams, RecordState, StateSink, StateSource,
};
use burn::store::burn_pack::{self, Scalar};
use burn::tensor::{Device, Shape, Tensor, TensorData};
use routeburn_model::DeviceTraits;

use crate::error::TrainError;

/// Burn's key for a parameter state's rank in its optimizer files.
const RANK_KEY: &str = "__rank";

/// Adam (Kingma and Ba) with Burn's defaults but ε, which is Kool's 1e-8.
pub(crate) struct Adam {
    beta_1: f32,
    beta_2: f32,
    epsilon: f32,
    weight_decay: Option<f32>,
    /// All parameters in one segment, or one segment each.
    joined: bool,
    moments: Option<Moments>,
}

/// Both moments of every parameter that had a gradient, segment by segment.
struct Moments {
    /// Adam's t: the steps taken.
    time: usize,
    segments: Vec<Segment>,
}

/// Parameters whose values lie end to end in one vector, in the model's order.
struct Segment {
    slots: Vec<Slot>,
    moment_1: Tensor<1>, // [P]
    moment_2: Tensor<1>, // [P]
}

/// Where one parameter's values lie in its segment.
#[derive(Clone, Debug)]
struct Slot {
    id: ParamId,
    dims: Vec<usize>,
    offset: usize,
}

impl Slot {
    fn range(&self) -> std::ops::Range<usize> {
        self.offset..self.offset + self.dims.iter().product::<usize>()
    }
}

/// Groups per-parameter items into segments (one, or one each), setting each slot's offset.
fn segments<T>(items: Vec<(Slot, T)>, joined: bool) -> Vec<(Vec<Slot>, Vec<T>)> {
    let mut out: Vec<(Vec<Slot>, Vec<T>)> = Vec::new();
    for (mut slot, item) in items {
        match out.last_mut() {
            Some((slots, items)) if joined => {
                slot.offset = slots.last().map_or(0, |s| s.range().end);
                slots.push(slot);
                items.push(item);
            }
            _ => {
                slot.offset = 0;
                out.push((vec![slot], vec![item]));
            }
        }
    }
    out
}

/// One vector of a segment's parts.
fn join(mut parts: Vec<Tensor<1>>) -> Tensor<1> {
    match parts.len() {
        1 => parts.pop().expect("one part"),
        _ => Tensor::cat(parts, 0),
    }
}

impl Adam {
    /// `weight_decay`: an L2 penalty added to the gradient (Burn's and PyTorch's Adam).
    /// Parameters are joined on CubeCL devices.
    pub(crate) fn new(weight_decay: Option<f32>, device: &Device) -> Self {
        Self {
            beta_1: 0.9,
            beta_2: 0.999,
            epsilon: 1e-8,
            weight_decay,
            joined: DeviceTraits::of(device).joins_updates,
            moments: None,
        }
    }

    /// Clips the gradients to a global L2 norm of `max_norm` (none when it is 0), then takes
    /// one Adam step of rate `lr`. Returns the model and the norm before clipping as a `[1]`
    /// device tensor (no host read), or `None` when no parameter had a gradient.
    pub(crate) fn step<M: Module>(
        &mut self,
        lr: f64,
        model: M,
        mut grads: GradientsParams,
        max_norm: f64,
    ) -> Result<(M, Option<Tensor<1>>), TrainError> {
        // Joined, the parameters' values are joined too, so that their update is one
        // operation rather than one per tensor.
        let with_params = self.weight_decay.is_some() || self.joined;
        let mut gather = Gather::new(&mut grads, with_params);
        model.visit(&mut gather);
        if gather.items.is_empty() {
            return Ok((model, None));
        }
        let (slots, parts): (Vec<_>, Vec<_>) =
            segments(gather.items, self.joined).into_iter().unzip();
        let (grads, params): (Vec<_>, Vec<_>) = parts
            .into_iter()
            .map(|p| p.into_iter().unzip::<_, _, Vec<_>, Vec<_>>())
            .map(|(g, p)| (join(g), p.into_iter().collect::<Option<Vec<_>>>().map(join)))
            .unzip();
        let (grads, norm) = clip_global_norm(grads, max_norm);
        let grads = match self.weight_decay {
            Some(penalty) => (grads.into_iter().zip(params.clone()))
                .map(|(g, p)| match p {
                    Some(p) => p.mul_scalar(penalty).add(g),
                    None => g,
                })
                .collect(),
            None => grads,
        };
        let updates = (self.update(slots, grads)?.into_iter().zip(params))
            .map(|(direction, values)| {
                let delta = direction.mul_scalar(lr); // [P] a segment
                match values {
                    Some(values) if self.joined => SegmentUpdate::Values(values - delta),
                    _ => SegmentUpdate::Delta(delta),
                }
            })
            .collect();
        let moments = self.moments.as_ref().expect("set by update");
        let model = model.map(&mut Subtract::new(&moments.segments, updates));
        Ok((model, Some(norm)))
    }

    /// Advances the moments with each segment's gradient and returns Adam's step direction
    /// for each, `[P]`.
    fn update(
        &mut self,
        slots: Vec<Vec<Slot>>,
        grads: Vec<Tensor<1>>,
    ) -> Result<Vec<Tensor<1>>, TrainError> {
        let (b1, b2) = (self.beta_1, self.beta_2);
        let moments = match self.moments.take() {
            Some(m) => {
                check_same_parameters(&m.segments, &slots)?;
                let segments = (m.segments.into_iter().zip(grads))
                    .map(|(s, grad)| {
                        let device = grad.device();
                        Segment {
                            slots: s.slots,
                            moment_1: (s.moment_1.to_device(&device).mul_scalar(b1))
                                .add(grad.clone().mul_scalar(1.0 - b1)),
                            moment_2: (s.moment_2.to_device(&device).mul_scalar(b2))
                                .add(grad.square().mul_scalar(1.0 - b2)),
                        }
                    })
                    .collect();
                Moments {
                    time: m.time + 1,
                    segments,
                }
            }
            None => Moments {
                time: 1,
                segments: (slots.into_iter().zip(grads))
                    .map(|(slots, grad)| Segment {
                        slots,
                        moment_1: grad.clone().mul_scalar(1.0 - b1),
                        moment_2: grad.square().mul_scalar(1.0 - b2),
                    })
                    .collect(),
            },
        };
        // Burn's form: the bias corrections folded into one factor and into ε.
        let t = moments.time as i32;
        let correction_2 = (1.0 - b2.powi(t)).sqrt();
        let factor = correction_2 / (1.0 - b1.powi(t));
        let directions = (moments.segments.iter())
            .map(|s| {
                s.moment_1
                    .clone()
                    .mul_scalar(factor)
                    .div((s.moment_2.clone().sqrt()).add_scalar(self.epsilon * correction_2))
            })
            .collect();
        self.moments = Some(moments);
        Ok(directions)
    }

    /// Writes the moments in Burn's optimizer format (a burnpack file) to `path`.
    pub(crate) fn save<M: Module>(&self, model: &M, path: &Path) -> Result<(), TrainError> {
        let mut record = Record::default();
        if let Some(moments) = &self.moments {
            let slots = (moments.segments.iter())
                .flat_map(|seg| seg.slots.iter().map(move |s| (s.id, (seg, s))))
                .collect();
            model.visit(&mut Flatten {
                time: moments.time,
                slots,
                record: &mut record,
                path: Vec::new(),
            });
        }
        record.into_writer().write_to_file(path).map_err(|e| {
            TrainError::checkpoint(path, format!("cannot write the optimizer state: {e}"))
        })
    }

    /// Reads moments written by [`Adam::save`] or by Burn's `ModuleOptimizer` for `model`,
    /// onto `device`.
    pub(crate) fn load<M: Module>(
        mut self,
        model: &M,
        path: &Path,
        device: &Device,
    ) -> Result<Self, TrainError> {
        let bad = |message: String| TrainError::checkpoint(path, message);
        let unreadable = |e: burn_pack::Error| bad(format!("cannot read the optimizer state: {e}"));
        let reader = burn_pack::Reader::from_file(path).map_err(unreadable)?;
        let mut source = StateSource::new(reader.scalars().clone());
        let tensors = reader.into_tensors().map_err(unreadable)?;
        let stored = tensors.len();
        for tensor in tensors {
            let (name, dtype, shape, _, bytes) = tensor.into_parts().map_err(unreadable)?;
            source.insert_tensor(name, TensorData::from_bytes(bytes, shape, dtype));
        }
        let mut unflatten = Unflatten {
            source: &mut source,
            device,
            items: Vec::new(),
        };
        model.visit(&mut unflatten);
        self.moments = unflatten.finish(stored, self.joined).map_err(bad)?;
        Ok(self)
    }
}

/// One Adam state per parameter: Burn's rule is that a parameter without a gradient keeps
/// its state. A model whose set of trained parameters changes between steps would need it;
/// routeburn's models use every parameter in every step.
fn check_same_parameters(before: &[Segment], now: &[Vec<Slot>]) -> Result<(), TrainError> {
    let before: Vec<_> = before.iter().flat_map(|s| &s.slots).collect();
    let now: Vec<_> = now.iter().flatten().collect();
    let same = before.len() == now.len()
        && (before.iter().zip(&now)).all(|(a, b)| a.id == b.id && a.dims == b.dims);
    match same {
        true => Ok(()),
        false => Err(TrainError::Failed(format!(
            "the parameters with gradients changed between steps ({} before, {} now): \
             routeburn's Adam keeps one state for all of a model's parameters",
            before.len(),
            now.len()
        ))),
    }
}

/// Scales the gradients (each segment's joined) so that their global L2 norm is at most
/// `max_norm` (not when `max_norm` is 0), as `torch.nn.utils.clip_grad_norm_`: Kool's "max
/// grad norm" is over all gradients together, where Burn's `GradientClippingConfig::Norm`
/// clips each tensor on its own. Returns them and the norm before clipping, `[1]`, all on the
/// device.
fn clip_global_norm(grads: Vec<Tensor<1>>, max_norm: f64) -> (Vec<Tensor<1>>, Tensor<1>) {
    let norm = (grads.iter())
        .map(|g| g.clone().square().sum()) // [1]
        .reduce(|total, s| total + s)
        .expect("a gradient")
        .sqrt(); // [1]
    if max_norm <= 0.0 {
        return (grads, norm);
    }
    // min(1, max_norm / (norm + 1e-6)), as PyTorch's.
    let factor = (norm.clone().add_scalar(1e-6))
        .recip()
        .mul_scalar(max_norm)
        .clamp_max(1.0);
    let grads = grads.into_iter().map(|g| g * factor.clone()).collect();
    (grads, norm)
}

/// Each parameter's gradient (and, for weight decay, its value) as a flat vector.
struct Gather<'a> {
    grads: &'a mut GradientsParams,
    with_params: bool,
    items: Vec<(Slot, (Tensor<1>, Option<Tensor<1>>))>,
}

impl<'a> Gather<'a> {
    fn new(grads: &'a mut GradientsParams, with_params: bool) -> Self {
        Self {
            grads,
            with_params,
            items: Vec::new(),
        }
    }
}

impl ModuleVisitor for Gather<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(grad) = self.grads.remove::<D>(param.id) else {
            return;
        };
        let dims = grad.dims().to_vec();
        let n: usize = dims.iter().product();
        let value = (self.with_params).then(|| param.val().inner().reshape([n]));
        let slot = Slot {
            id: param.id,
            dims,
            offset: 0,
        };
        self.items.push((slot, (grad.reshape([n]), value)));
    }
}

/// A segment's update: the step its parameters subtract, or (joined) their new values,
/// each parameter's a slice, which CubeCL makes a view where its offset is aligned.
enum SegmentUpdate {
    Delta(Tensor<1>),  // [P]
    Values(Tensor<1>), // [P]
}

/// Subtracts each parameter's slice of its segment's update (or takes its slice of the new
/// values), outside the autodiff graph, and puts the parameter back as it was (trainable,
/// same checkpointing strategy).
struct Subtract {
    slots: HashMap<ParamId, (usize, std::ops::Range<usize>, Shape)>,
    updates: Vec<SegmentUpdate>,
}

impl Subtract {
    fn new(segments: &[Segment], updates: Vec<SegmentUpdate>) -> Self {
        let slots = (segments.iter().enumerate())
            .flat_map(|(i, seg)| seg.slots.iter().map(move |s| (i, s)))
            .map(|(i, s)| (s.id, (i, s.range(), Shape::from(s.dims.clone()))))
            .collect();
        Self { slots, updates }
    }
}

impl ModuleMapper for Subtract {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, tensor, mapper) = param.consume();
        let Some((segment, range, shape)) = self.slots.get(&id) else {
            return Param::from_mapped_value(id, tensor, mapper);
        };
        let slice = |whole: &Tensor<1>| -> Tensor<D> {
            match range.len() == whole.dims()[0] {
                true => whole.clone().reshape(shape.clone()),
                false => whole.clone().slice(range.clone()).reshape(shape.clone()),
            }
        };
        let strategy = tensor.gradient_checkpointing_strategy();
        let trainable = tensor.is_require_grad();
        let mut updated = Tensor::from_inner(match &self.updates[*segment] {
            SegmentUpdate::Delta(delta) => tensor.inner() - slice(delta),
            SegmentUpdate::Values(values) => slice(values),
        });
        if let Some(strategy) = strategy {
            updated = updated.with_gradient_checkpointing_strategy(strategy);
        }
        if trainable {
            updated = updated.require_grad();
        }
        Param::from_mapped_value(id, updated, mapper)
    }
}

/// What Burn's `OptimizerRecord` holds: tensors named `{param id}.{field}`, scalars, and each
/// parameter's module path.
#[derive(Default)]
struct Record {
    tensors: Vec<burn_pack::Tensor>,
    scalars: Vec<(String, Scalar)>,
    paths: Vec<(String, String)>,
}

impl Record {
    fn into_writer(self) -> burn_pack::Writer {
        let mut writer = burn_pack::Writer::new(self.tensors);
        for (key, value) in self.scalars {
            writer = writer.with_scalar(&key, value);
        }
        for (key, path) in self.paths {
            writer = writer.with_metadata(&key, &path);
        }
        writer
    }
}

/// Cuts the moments into Burn's per-parameter `AdamState`s (which know their rank `D`) and
/// flattens each as Burn's optimizer does.
struct Flatten<'a> {
    time: usize,
    slots: HashMap<ParamId, (&'a Segment, &'a Slot)>,
    record: &'a mut Record,
    /// The module path, which Burn's files keep to match parameter groups.
    path: Vec<String>,
}

impl ModuleVisitor for Flatten<'_> {
    fn enter_module(&mut self, name: &str, _container_type: &str) {
        self.path.push(name.to_string());
    }

    fn exit_module(&mut self, _name: &str, _container_type: &str) {
        self.path.pop();
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let Some(&(segment, slot)) = self.slots.get(&param.id) else {
            return;
        };
        let shape = Shape::from(slot.dims.clone());
        let cut =
            |m: &Tensor<1>| -> Tensor<D> { m.clone().slice(slot.range()).reshape(shape.clone()) };
        let state = AdamState::new(AdaptiveMomentumState::new(
            self.time,
            cut(&segment.moment_1),
            cut(&segment.moment_2),
        ));
        let prefix = slot.id.val().to_string();
        let mut sink = StateSink::default();
        state.state_flatten(&prefix, &mut sink);
        for (name, data) in sink.tensors {
            let (bytes, shape, dtype) = data.into_parts();
            let tensor = burn_pack::Tensor::new(name, dtype, shape, Some(slot.id.val()), bytes);
            self.record.tensors.push(tensor);
        }
        self.record.scalars.extend(sink.scalars);
        let rank_key = format!("{prefix}.{RANK_KEY}");
        self.record.scalars.push((rank_key, Scalar::from(D)));
        self.record.paths.push((prefix, self.path.join(".")));
    }
}

/// Rebuilds each parameter's `AdamState` from a file, in the model's order.
struct Unflatten<'a> {
    source: &'a mut StateSource,
    device: &'a Device,
    /// Each parameter's slot, its moments flat, and its step count.
    items: Vec<(Slot, (Tensor<1>, Tensor<1>, usize))>,
}

impl Unflatten<'_> {
    /// The moments in segments (`None` for a file with no state), or why they cannot be:
    /// `stored` is the number of tensors the file held, two per parameter.
    fn finish(self, stored: usize, joined: bool) -> Result<Option<Moments>, String> {
        if self.items.len() * 2 != stored {
            return Err(format!(
                "the optimizer state holds {stored} tensors, but {} parameters of this model \
                 have a state (two tensors each): is it a checkpoint of this model and config?",
                self.items.len()
            ));
        }
        let Some(&(_, (_, _, time))) = self.items.first() else {
            return Ok(None);
        };
        if self.items.iter().any(|(_, (_, _, t))| *t != time) {
            return Err("the optimizer state's parameters are at different steps".into());
        }
        let segments = (segments(self.items, joined).into_iter())
            .map(|(slots, moments)| {
                let (m1, m2): (Vec<_>, Vec<_>) =
                    moments.into_iter().map(|(a, b, _)| (a, b)).unzip();
                Segment {
                    slots,
                    moment_1: join(m1),
                    moment_2: join(m2),
                }
            })
            .collect();
        Ok(Some(Moments { time, segments }))
    }
}

impl ModuleVisitor for Unflatten<'_> {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let prefix = param.id.val().to_string();
        let rank = self.source.take_scalar(&prefix, RANK_KEY);
        if rank.is_some_and(|r| r != Scalar::from(D)) {
            return; // counted as missing by `finish`
        }
        let Some(state) = AdamState::<D>::state_unflatten(&prefix, self.source, self.device) else {
            return;
        };
        let m = state.momentum;
        let dims = m.moment_1.dims().to_vec();
        if m.moment_2.dims().to_vec() != dims || dims != param.val().dims().to_vec() {
            return;
        }
        let n: usize = dims.iter().product();
        let slot = Slot {
            id: param.id,
            dims,
            offset: 0,
        };
        let moments = (m.moment_1.reshape([n]), m.moment_2.reshape([n]), m.time);
        self.items.push((slot, moments));
    }
}

#[cfg(test)]
mod tests {
    use burn::module::Module;
    use burn::nn::{Linear, LinearConfig};
    use burn::optim::decay::WeightDecayConfig;
    use burn::optim::{AdamConfig, ModuleOptimizer};
    use burn::tensor::{Distribution, TensorData};
    use routeburn_model::Backend;

    use super::*;

    #[derive(Module, Debug)]
    struct Net {
        first: Linear,
        second: Linear,
        table: Param<Tensor<3>>,
    }

    fn device() -> Device {
        Backend::first_on_host()
            .unwrap()
            .device()
            .unwrap()
            .autodiff()
    }

    fn net(device: &Device, seed: u64) -> Net {
        device.seed(seed);
        Net {
            first: LinearConfig::new(4, 8).init(device),
            second: LinearConfig::new(8, 3).init(device),
            table: Param::from_tensor(Tensor::random([2, 3, 4], Distribution::Default, device)),
        }
    }

    /// Gradients of a loss that changes with `step`, touching every parameter.
    fn grads(net: &Net, step: usize, device: &Device) -> GradientsParams {
        let x: Vec<f32> = (0..20)
            .map(|i| ((i * 7 + step * 3) % 11) as f32 / 5.0 - 1.0)
            .collect();
        let x = Tensor::<2>::from_data(TensorData::new(x, [5, 4]), device); // [5, 4]
        let y = net.second.forward(net.first.forward(x).tanh()); // [5, 3]
        let weights = net.table.val().sum_dim(2).sum_dim(0).reshape([1, 3]); // [1, 3]
        let loss = (y * weights).square().mean();
        GradientsParams::from_grads(loss.backward(), net)
    }

    fn burns_adam(weight_decay: Option<f32>) -> ModuleOptimizer {
        AdamConfig::new()
            .with_epsilon(1e-8)
            .with_weight_decay(weight_decay.map(WeightDecayConfig::new))
            .init()
    }

    /// Every parameter's values, as bits.
    fn bits(net: &Net) -> Vec<Vec<u32>> {
        struct Bits(Vec<Vec<u32>>);
        impl ModuleVisitor for Bits {
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                let values = param.val().into_data().try_to_vec::<f32>().unwrap();
                self.0.push(values.iter().map(|v| v.to_bits()).collect());
            }
        }
        let mut out = Bits(Vec::new());
        net.visit(&mut out);
        out.0
    }

    /// Joined into one segment, as on CubeCL devices, or one segment a parameter.
    fn adam(weight_decay: Option<f32>, joined: bool) -> Adam {
        Adam {
            joined,
            ..Adam::new(weight_decay, &device())
        }
    }

    #[test]
    fn takes_burns_adam_steps_bit_for_bit() {
        let device = device();
        for (weight_decay, joined) in [(None, true), (Some(0.01), true), (Some(0.01), false)] {
            let mut ours = (net(&device, 7), adam(weight_decay, joined));
            let mut burns = (ours.0.clone(), burns_adam(weight_decay));
            for (step, lr) in [1e-2, 3e-3, 1e-2].into_iter().enumerate() {
                let g = grads(&ours.0, step, &device);
                let (model, _) = ours.1.step(lr, ours.0, g, 0.0).unwrap();
                ours.0 = model;
                let g = grads(&burns.0, step, &device);
                burns.0 = burns.1.step(lr, burns.0, g);
                assert_eq!(
                    bits(&ours.0),
                    bits(&burns.0),
                    "step {step}, {weight_decay:?}, {joined}"
                );
            }
            assert_ne!(
                bits(&ours.0),
                bits(&net(&device, 7)),
                "the steps moved nothing"
            );
        }
    }

    #[test]
    fn resumes_from_burns_files_and_burn_from_ours() {
        let device = device();
        let dir = std::env::temp_dir().join(format!("routeburn-adam-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (burns_file, our_file) = (dir.join("burn.bpk"), dir.join("ours.bpk"));
        // Saved joined, loaded one segment a parameter (a CUDA run resumed on the CPU).
        let (mut a, mut burns) = (net(&device, 3), burns_adam(None));
        let (mut b, mut ours) = (a.clone(), adam(None, true));
        for step in 0..2 {
            a = burns.step(1e-2, a.clone(), grads(&a, step, &device));
            b = ours
                .step(1e-2, b.clone(), grads(&b, step, &device), 0.0)
                .unwrap()
                .0;
        }
        burns.save(&burns_file).unwrap();
        ours.save(&b, &our_file).unwrap();
        let inner = device.clone().inner();
        let mut ours_from_burns = adam(None, false).load(&b, &burns_file, &inner).unwrap();
        let g = grads(&a, 2, &device);
        let after_ours = ours_from_burns.step(1e-2, a.clone(), g, 0.0).unwrap().0;
        let continued = burns.step(1e-2, a.clone(), grads(&a, 2, &device));
        assert_eq!(bits(&after_ours), bits(&continued));
        // Burn's `ModuleOptimizer::load` puts its moments on `Device::default()`, CUDA where
        // it is compiled in: that half runs where the default device is the tests' own.
        if !routeburn_model::Backend::Cuda.is_compiled() {
            let mut burns_from_ours = burns_adam(None).load(&our_file).unwrap();
            let after_burns = burns_from_ours.step(1e-2, b.clone(), grads(&b, 2, &device));
            assert_eq!(bits(&after_burns), bits(&continued));
        }
        // A state is per parameter id: another model's is refused, naming the file.
        let other = net(&device, 3);
        let err = adam(None, true)
            .load(&other, &our_file, &inner)
            .err()
            .unwrap();
        let message = err.to_string();
        assert!(
            message.contains("ours.bpk") && message.contains("holds 10 tensors"),
            "{message}"
        );
        std::fs::remove_dir_all(dir).unwrap();
    }

    /// A model and its optimizer file after two steps.
    fn saved() -> &'static (Net, Vec<u8>) {
        static SAVED: std::sync::OnceLock<(Net, Vec<u8>)> = std::sync::OnceLock::new();
        SAVED.get_or_init(|| {
            let device = device();
            let (mut model, mut adam) = (net(&device, 5), adam(None, false));
            for step in 0..2 {
                let g = grads(&model, step, &device);
                model = adam.step(1e-2, model, g, 1.0).unwrap().0;
            }
            let path = std::env::temp_dir().join(format!("adam-saved-{}.bpk", std::process::id()));
            adam.save(&model, &path).unwrap();
            let bytes = std::fs::read(&path).unwrap();
            std::fs::remove_file(path).unwrap();
            (model, bytes)
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 200, ..crate::mutate::config() })]

        /// Any optimizer file gives moments or an error naming the file, never a panic.
        #[test]
        fn a_damaged_file_never_panics(bytes in crate::mutate::mutated(vec![saved().1.clone()])) {
            let path = std::env::temp_dir().join(format!("adam-fuzz-{}.bpk", std::process::id()));
            std::fs::write(&path, &bytes).unwrap();
            let inner = device().inner();
            let result = adam(None, true).load(&saved().0, &path, &inner);
            std::fs::remove_file(&path).unwrap();
            if let Err(e) = result {
                proptest::prop_assert!(e.to_string().contains("adam-fuzz"), "{}", e);
            }
        }
    }

    #[test]
    fn clips_to_the_global_norm() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let vector = |v: &[f32]| Tensor::<1>::from_data(TensorData::from(v), &device);
        // Two segments, [3, 0] and [-4]: the norm is over both.
        let grads = vec![vector(&[3.0, 0.0]), vector(&[-4.0])];
        let values = |t: Vec<Tensor<1>>| -> Vec<f32> {
            (t.into_iter()
                .flat_map(|t| t.into_data().try_to_vec::<f32>().unwrap()))
            .collect()
        };
        for (max_norm, expected) in [(1.0, [0.6, 0.0, -0.8]), (10.0, [3.0, 0.0, -4.0])] {
            let (clipped, norm) = clip_global_norm(grads.clone(), max_norm);
            assert_eq!(values(vec![norm]), [5.0]);
            for (c, e) in values(clipped).iter().zip(expected) {
                assert!((c - e).abs() < 1e-6, "{max_norm}: {c} against {e}");
            }
        }
        let (unclipped, norm) = clip_global_norm(grads.clone(), 0.0);
        assert_eq!(
            (values(unclipped), values(vec![norm])),
            (values(grads), vec![5.0])
        );
    }
}
