//! Weights that are the same in every run, for tests: Burn draws initial weights from the
//! OS's entropy unless its seed is set, and that seed is one per process, shared by every
//! test running beside it. A test whose model comes from [`fixed_weights`] fails again
//! when it fails.

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{Tensor, TensorData};
use routeburn_data::InstanceRng;

/// `module` with each weight tensor drawn at initialisation replaced by one from a fixed
/// generator (the k-th tensor visited from `InstanceRng::new(k)`), uniform within
/// ±1/√rows; constant tensors (norms' scales and shifts, zero biases) stay as they are.
pub fn fixed_weights<M: Module>(module: M) -> M {
    module.map(&mut FixedWeights { tensors: 0 })
}

struct FixedWeights {
    tensors: u64,
}

impl ModuleMapper for FixedWeights {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        self.tensors += 1;
        let mut rng = InstanceRng::new(self.tensors);
        param.map(|tensor| {
            let values = tensor.to_data().convert::<f32>().try_to_vec::<f32>();
            let values = values.expect("a float tensor converted to f32 reads as f32");
            if values.iter().all(|&v| v == values[0]) {
                return tensor;
            }
            let dims = tensor.dims();
            let bound = 1.0 / (dims[0] as f64).sqrt();
            let fixed: Vec<f32> = (values.iter())
                .map(|_| (bound * (2.0 * rng.unit() - 1.0)) as f32)
                .collect();
            let fixed = Tensor::from_data(TensorData::new(fixed, dims), &tensor.device());
            match tensor.is_require_grad() {
                true => fixed.require_grad(),
                false => fixed,
            }
        })
    }
}
