//! POMO's shared baseline: every tour of an instance (one per first customer) is measured
//! against the mean cost of that instance's tours. With Leader Reward (Wang et al. 2024,
//! arXiv:2405.13947) the instance's best tour, its leader, has its advantage multiplied
//! by α: a solver is judged by its best tour, not by the mean of them. With preference
//! optimisation (Pan et al. 2025, arXiv:2505.08735) the tours' weights come from the
//! order of their costs and the policy's own log-likelihoods instead.

use routeburn_data::Batch;

use crate::error::TrainError;
use crate::evaluate::mean;
use crate::reinforce::baseline::{cost_less_value, Baseline, Tours};

pub(crate) struct SharedBaseline {
    /// α of Leader Reward (`reinforce.leader_alpha`); 1 is POMO's plain advantage.
    pub(crate) leader_alpha: f64,
    /// α of preference optimisation (`reinforce.preference_alpha`); none is REINFORCE.
    pub(crate) preference_alpha: Option<f64>,
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

    fn advantages(
        &self,
        costs: &[f64],
        values: &[f64],
        log_likelihoods: &[f32],
        rows_per_instance: usize,
    ) -> Vec<f64> {
        if let Some(alpha) = self.preference_alpha {
            return preferences(costs, log_likelihoods, rows_per_instance, alpha);
        }
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

/// Preference optimisation's weight of each tour in the loss (Σ weight × log-likelihood):
/// of every pair of an instance's tours the cheaper one, w, is preferred to the other, l,
/// with Bradley–Terry probability σ(α (log p_w − log p_l)) under the policy. The gradient
/// of −log of it raises log p_w and lowers log p_l by α σ(−α (log p_w − log p_l)), most
/// where the policy has the pair the wrong way round. A tour's weight is the mean over
/// the instance's other tours of that amount, negative where it is preferred (the loss
/// is minimised). Tours of equal cost express no preference. Only the order of the costs
/// counts, so every instance weighs the same whatever the spread of its costs.
fn preferences(
    costs: &[f64],
    log_likelihoods: &[f32],
    rows_per_instance: usize,
    alpha: f64,
) -> Vec<f64> {
    let others = rows_per_instance.saturating_sub(1).max(1) as f64;
    let mut weights = vec![0.0; costs.len()];
    let instances = (costs.chunks(rows_per_instance))
        .zip(log_likelihoods.chunks(rows_per_instance))
        .zip(weights.chunks_mut(rows_per_instance));
    for ((costs, log_likelihoods), weights) in instances {
        for i in 0..costs.len() {
            for j in i + 1..costs.len() {
                let (w, l) = match costs[i].total_cmp(&costs[j]) {
                    std::cmp::Ordering::Less => (i, j),
                    std::cmp::Ordering::Greater => (j, i),
                    std::cmp::Ordering::Equal => continue,
                };
                let margin = alpha * f64::from(log_likelihoods[w] - log_likelihoods[l]);
                let push = alpha / (1.0 + margin.exp()) / others; // α σ(−margin), averaged
                weights[w] -= push;
                weights[l] += push;
            }
        }
    }
    weights
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tour_against_its_instances_mean() {
        let batch = routeburn_data::Generator::uniform(3)
            .sample_batch(&mut routeburn_data::InstanceRng::new(1), 2);
        let v = SharedBaseline {
            leader_alpha: 1.0,
            preference_alpha: None,
        }
        .values(&batch, &[1.0, 2.0, 3.0, 10.0, 20.0, 60.0], 3, None)
        .unwrap();
        assert_eq!(v, vec![2.0, 2.0, 2.0, 30.0, 30.0, 30.0]);
    }

    #[test]
    fn the_leader_of_each_instance_gets_alpha_times_its_advantage() {
        let costs = [3.0, 1.0, 2.0, 6.0, 4.0, 4.0, 5.0, 7.0];
        let values = [3.0, 3.0, 3.0, 3.0, 5.0, 5.0, 5.0, 5.0];
        let plain = SharedBaseline {
            leader_alpha: 1.0,
            preference_alpha: None,
        }
        .advantages(&costs, &values, &[0.0; 8], 4);
        assert_eq!(plain, vec![0.0, -2.0, -1.0, 3.0, -1.0, -1.0, 0.0, 2.0]);
        // By hand: instance 0's leader is its second tour (cost 1), instance 1's the
        // first of its two tours of cost 4.
        let leader = SharedBaseline {
            leader_alpha: 4.0,
            preference_alpha: None,
        }
        .advantages(&costs, &values, &[0.0; 8], 4);
        assert_eq!(leader, vec![0.0, -8.0, -1.0, 3.0, -4.0, -1.0, 0.0, 2.0]);
    }

    /// By hand: with equal log-likelihoods every pair's margin is 0 and σ(0) = ½, so with
    /// α = 2 each pair moves its two tours by 2 · ½ / 2 (two other tours): the weights are
    /// the tours' centred ranks. A tie expresses no preference.
    #[test]
    fn preferences_of_equally_likely_tours_are_their_centred_ranks() {
        let costs = [2.0, 1.0, 3.0, 5.0, 5.0, 4.0];
        let weights = preferences(&costs, &[-1.0; 6], 3, 2.0);
        assert_eq!(weights, vec![0.0, -1.0, 1.0, 0.5, 0.5, -1.0]);
    }

    /// By hand: two tours, the cheaper three times as likely (margin ln 3 at α = 1) is
    /// pushed by σ(−ln 3) = ¼; three times less likely, by σ(ln 3) = ¾: the pair the
    /// policy has the wrong way round moves more.
    #[test]
    fn a_pair_the_policy_has_the_wrong_way_round_moves_more() {
        let ln3 = 3f32.ln();
        let close = |got: Vec<f64>, want: [f64; 2]| {
            assert!(
                (got[0] - want[0]).abs() < 1e-6 && (got[1] - want[1]).abs() < 1e-6,
                "{got:?}"
            );
        };
        close(
            preferences(&[1.0, 2.0], &[0.0, -ln3], 2, 1.0),
            [-0.25, 0.25],
        );
        close(
            preferences(&[1.0, 2.0], &[-ln3, 0.0], 2, 1.0),
            [-0.75, 0.75],
        );
    }

    /// The weights are the gradient, by each tour's log-likelihood, of the loss they stand
    /// for: −Σ over preferred pairs of log σ(α (log p_w − log p_l)), over (tours − 1) per
    /// instance; checked by central differences of that loss written out apart.
    #[test]
    fn preferences_are_the_gradient_of_the_pairwise_loss() {
        let costs = [3.0, 1.0, 2.5, 4.0, 2.0, 7.0, 6.0, 6.5];
        let log_likelihoods = [-3.5f32, -1.25, -6.0, -2.0, -0.5, -4.75, -9.0, -2.5];
        let alpha = 0.7;
        let loss = |ll: &[f64]| -> f64 {
            let mut total = 0.0;
            for instance in 0..2 {
                let r = instance * 4..instance * 4 + 4;
                for w in r.clone() {
                    for l in r.clone() {
                        if costs[w] < costs[l] {
                            let margin: f64 = alpha * (ll[w] - ll[l]);
                            total -= (1.0 / (1.0 + (-margin).exp())).ln() / 3.0;
                        }
                    }
                }
            }
            total
        };
        let weights = preferences(&costs, &log_likelihoods, 4, alpha);
        let at: Vec<f64> = log_likelihoods.iter().map(|&x| f64::from(x)).collect();
        for (i, &weight) in weights.iter().enumerate() {
            let (mut up, mut down) = (at.clone(), at.clone());
            up[i] += 1e-5;
            down[i] -= 1e-5;
            let slope = (loss(&up) - loss(&down)) / 2e-5;
            assert!(
                (slope - weight).abs() < 1e-7,
                "tour {i}: {weight} against {slope}"
            );
        }
    }

    /// The baseline object hands the loss preferences in place of cost less value.
    #[test]
    fn the_shared_baseline_gives_preferences_when_asked() {
        let costs = [2.0, 1.0, 3.0];
        let pomo = SharedBaseline {
            leader_alpha: 1.0,
            preference_alpha: Some(2.0),
        };
        let got = pomo.advantages(&costs, &[2.0; 3], &[-1.0; 3], 3);
        assert_eq!(got, vec![0.0, -1.0, 1.0]);
    }
}
