//! Weight averaging (SWA, Izmailov et al. 2018): the uniform mean of the weights a run
//! passes through late in its schedule, one set at the end of each epoch. Late in a
//! REINFORCE run the gradient's noise keeps the weights moving about a good region rather
//! than into it; their mean lies nearer its middle than any one of them.
//!
//! Every float tensor of the model is averaged, batch norms' running statistics included
//! (they are Burn's `RunningState`s, which its visitors and mappers reach as parameters):
//! the sets averaged lie close together, so the mean statistics stand for the mean
//! weights' own.

use burn::module::{Module, ModuleMapper, ModuleVisitor, Param};
use burn::tensor::Tensor;

/// The running mean of the weight sets added so far.
#[derive(Clone)]
pub(crate) struct WeightAverage<M> {
    mean: M,
    count: usize,
}

impl<M: Module> WeightAverage<M> {
    /// The mean of one set, `first`.
    pub(crate) fn new(first: &M) -> Self {
        // A copy of its own: mapping a module writes its running statistics in place, into
        // every clone of it (Burn's `RunningState` shares its value), and `valid` gives
        // them new storage.
        Self {
            mean: first.valid(),
            count: 1,
        }
    }

    /// A mean of `count` sets, as a checkpoint saved it.
    pub(crate) fn restored(mean: M, count: usize) -> Self {
        Self { mean, count }
    }

    /// Adds `model`'s weights (a module of the same structure) to the mean.
    pub(crate) fn add(&mut self, model: &M) {
        self.count += 1;
        let mut values = Values::default();
        model.visit(&mut values);
        let mut toward = Toward {
            values: values.0.into_iter(),
            weight: 1.0 / self.count as f64,
        };
        self.mean = self.mean.clone().map(&mut toward);
    }

    pub(crate) fn mean(&self) -> &M {
        &self.mean
    }

    /// How many weight sets the mean holds.
    pub(crate) fn count(&self) -> usize {
        self.count
    }
}

/// Every float tensor of a module, flattened, in the order its visitor and mapper walk it.
#[derive(Default)]
struct Values(Vec<Tensor<1>>);

impl ModuleVisitor for Values {
    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let value = param.val();
        let n = value.shape().num_elements();
        self.0.push(value.reshape([n]));
    }
}

/// Moves each tensor of the mean a `weight` of the way to the next of `values`: with
/// weight 1/k, the mean of k − 1 sets becomes the mean of k.
struct Toward {
    values: std::vec::IntoIter<Tensor<1>>,
    weight: f64,
}

impl ModuleMapper for Toward {
    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let (id, mean, mapper) = param.consume();
        let value = (self.values.next())
            .expect("the models of a weight average have the same structure")
            .reshape(mean.shape());
        let moved = mean.clone() + (value - mean) * self.weight;
        Param::from_mapped_value(id, moved, mapper)
    }
}

#[cfg(test)]
mod tests {
    use burn::nn::{BatchNorm, BatchNormConfig, Linear, LinearConfig};
    use routeburn_model::Backend;

    use super::*;

    #[derive(Module, Debug)]
    struct Small {
        linear: Linear,
        norm: BatchNorm,
    }

    /// Every float tensor of `module` (its norm's running statistics too), in order.
    fn values(module: &Small) -> Vec<Vec<f32>> {
        let mut v = Values::default();
        module.visit(&mut v);
        (v.0.into_iter())
            .map(|t| t.into_data().try_into_vec_as::<f32>().unwrap())
            .collect()
    }

    /// `module` with its k-th tensor (visiting order) set to `scale · (k + 1)` throughout.
    fn filled(module: Small, scale: f32) -> Small {
        struct Fill(f32, usize);
        impl ModuleMapper for Fill {
            fn map_float<const D: usize>(&mut self, p: Param<Tensor<D>>) -> Param<Tensor<D>> {
                let (id, t, mapper) = p.consume();
                self.1 += 1;
                let value = t.zeros_like() + self.0 * self.1 as f32;
                Param::from_mapped_value(id, value, mapper)
            }
        }
        module.map(&mut Fill(scale, 0))
    }

    #[test]
    fn the_average_is_each_tensors_mean_running_statistics_included() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let small = || Small {
            linear: LinearConfig::new(3, 2).init(&device),
            norm: BatchNormConfig::new(2).init(&device),
        };
        // Weight, bias, then the norm's γ, β, running mean and running variance.
        let sets = [1.0, 2.0, 6.0].map(|scale| filled(small(), scale));
        let mut average = WeightAverage::new(&sets[0]);
        average.add(&sets[1]);
        average.add(&sets[2]);
        assert_eq!(average.count(), 3);
        let got = values(average.mean());
        assert_eq!(got.len(), 6, "linear weight and bias, and 4 of the norm");
        for (k, tensor) in got.iter().enumerate() {
            // (1 + 2 + 6) / 3 = 3 times the tensor's own (k + 1).
            let want = 3.0 * (k + 1) as f32;
            assert!(
                tensor.iter().all(|v| (v - want).abs() <= 1e-6 * want),
                "{k}: {tensor:?}"
            );
        }
        // The sets themselves are untouched, the first's running statistics too.
        for (k, set) in sets.iter().enumerate() {
            let scale = [1.0, 2.0, 6.0][k];
            assert_eq!(values(set)[5], vec![6.0 * scale; 2], "set {k}");
        }
    }
}
