//! POMO's shared baseline: every tour of an instance (one per first customer) is measured
//! against the mean cost of that instance's tours. With Leader Reward (Wang et al. 2024,
//! arXiv:2405.13947) the instance's best tour, its leader, has its advantage multiplied
//! by α: a solver is judged by its best tour, not by the mean of them.

use routeburn_data::Batch;

use crate::error::TrainError;
use crate::evaluate::mean;
use crate::reinforce::baseline::{cost_less_value, Baseline, Tours};

pub(crate) struct SharedBaseline {
    /// α of Leader Reward (`reinforce.leader_alpha`); 1 is POMO's plain advantage.
    pub(crate) leader_alpha: f64,
}

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

    fn advantages(&self, costs: &[f64], values: &[f64], rows_per_instance: usize) -> Vec<f64> {
        let mut advantages = cost_less_value(costs, values);
        if self.leader_alpha != 1.0 {
            for (instance, costs) in costs.chunks(rows_per_instance).enumerate() {
                // `min_by` keeps the first of equally short tours, so a run repeats exactly.
                let (leader, _) = (costs.iter().enumerate())
                    .min_by(|a, b| a.1.total_cmp(b.1))
                    .expect("an instance has tours");
                advantages[instance * rows_per_instance + leader] *= self.leader_alpha;
            }
        }
        advantages
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tour_against_its_instances_mean() {
        let batch = routeburn_data::Generator::uniform(3)
            .sample_batch(&mut routeburn_data::InstanceRng::new(1), 2);
        let v = SharedBaseline { leader_alpha: 1.0 }
            .values(&batch, &[1.0, 2.0, 3.0, 10.0, 20.0, 60.0], 3, None)
            .unwrap();
        assert_eq!(v, vec![2.0, 2.0, 2.0, 30.0, 30.0, 30.0]);
    }

    #[test]
    fn the_leader_of_each_instance_gets_alpha_times_its_advantage() {
        let costs = [3.0, 1.0, 2.0, 6.0, 4.0, 4.0, 5.0, 7.0];
        let values = [3.0, 3.0, 3.0, 3.0, 5.0, 5.0, 5.0, 5.0];
        let plain = SharedBaseline { leader_alpha: 1.0 }.advantages(&costs, &values, 4);
        assert_eq!(plain, vec![0.0, -2.0, -1.0, 3.0, -1.0, -1.0, 0.0, 2.0]);
        // By hand: instance 0's leader is its second tour (cost 1), instance 1's the
        // first of its two tours of cost 4.
        let leader = SharedBaseline { leader_alpha: 4.0 }.advantages(&costs, &values, 4);
        assert_eq!(leader, vec![0.0, -8.0, -1.0, 3.0, -4.0, -1.0, 0.0, 2.0]);
    }
}
