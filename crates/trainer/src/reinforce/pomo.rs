//! POMO's shared baseline: every tour of an instance (one per first customer) is measured
//! against the mean cost of that instance's tours.

use routeburn_data::Batch;

use crate::error::TrainError;
use crate::evaluate::mean;
use crate::reinforce::baseline::{Baseline, Tours};

pub(crate) struct SharedBaseline;

impl Baseline for SharedBaseline {
    fn multi_start(&self) -> bool {
        true
    }

    fn values(
        &mut self,
        _batch: &Batch,
        costs: &[f64],
        rows_per_instance: usize,
        _decoded: Option<Tours>,
    ) -> Result<Vec<f64>, TrainError> {
        Ok(costs
            .chunks(rows_per_instance)
            .flat_map(|c| std::iter::repeat_n(mean(c), rows_per_instance))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tour_against_its_instances_mean() {
        let batch = routeburn_data::Generator::uniform(3)
            .sample_batch(&mut routeburn_data::InstanceRng::new(1), 2);
        let v = SharedBaseline
            .values(&batch, &[1.0, 2.0, 3.0, 10.0, 20.0, 60.0], 3, None)
            .unwrap();
        assert_eq!(v, vec![2.0, 2.0, 2.0, 30.0, 30.0, 30.0]);
    }
}
