//! The rollout baseline's greedy decode as a device graph (CUDA graphs): recorded once per
//! frozen policy on the first batch of the training size, then replayed on every next
//! batch, its instances written into the recorded inputs. A replay is one launch where the
//! eager decode is hundreds of small kernels, each of which costs the host tens of
//! microseconds (433 a tiny_1 step on an H200, 10 ms of its 43 ms: `benches/gpu/`).
//!
//! The replay reads its batch from its own input buffer, so a step uploads its instances
//! twice (the sampled decode's upload and this one, a few kilobytes). A recording is
//! checked against the eager decode of the same batch, and its first replay of another
//! batch (the first that writes its inputs) against that batch's eager decode; a refusal
//! (no device graphs, other tours) is said once on stderr, and the baseline decodes
//! eagerly from then on.

use burn::tensor::{Device, Int, Tensor};
use routeburn_data::Batch;
use routeburn_model::recorded_decode::RecordedDecode;
use routeburn_model::{AttentionModel, DecodeOptions, DeviceBatch, DeviceTraits};

use crate::error::TrainError;
use crate::evaluate::int_data_to_i64;

pub(crate) struct RecordedRollout {
    /// Whether to record at all: `reinforce.baseline_graph` on a CUDA device.
    wanted: bool,
    recorded: Option<RecordedDecode<AttentionModel>>,
    /// Whether the recording has replayed a batch written into its inputs and given the
    /// eager decode's tours.
    replay_checked: bool,
    /// Set once a recording was refused: no second attempt in this run.
    refused: bool,
}

impl RecordedRollout {
    pub(crate) fn new(wanted: bool, device: &Device) -> Self {
        Self {
            wanted: wanted && DeviceTraits::of(device).records_graphs,
            recorded: None,
            replay_checked: false,
            refused: false,
        }
    }

    /// The frozen policy changed: the graph reads the old one's parameters.
    pub(crate) fn forget(&mut self) {
        self.recorded = None;
    }

    /// `model`'s greedy `[B, T]` tours of `batch` through the graph (recorded now if there
    /// is none yet), or `None` where the caller decodes eagerly: not wanted, refused, or a
    /// batch of another size than the recorded one.
    pub(crate) fn decode(
        &mut self,
        model: &AttentionModel,
        batch: &Batch,
        options: &DecodeOptions,
        device: &Device,
    ) -> Result<Option<Tensor<2, Int>>, TrainError> {
        if !self.wanted || self.refused {
            return Ok(None);
        }
        if let Some(recorded) = &self.recorded {
            if !recorded.fits(batch) {
                return Ok(None);
            }
            let actions = recorded.replay(batch).map_err(|why| {
                TrainError::Failed(format!("the rollout baseline's device graph: {why}"))
            })?;
            if self.replay_checked {
                return Ok(Some(actions));
            }
            let eager = model.decode(&DeviceBatch::upload(batch, None, device), options);
            if read(actions.clone())? == read(eager.actions.clone())? {
                self.replay_checked = true;
                return Ok(Some(actions));
            }
            self.refuse("a replay's tours of a new batch differ from the eager decode's");
            return Ok(Some(eager.actions));
        }
        let refusal = match RecordedDecode::record(model, batch, options, device) {
            Ok((recorded, actions)) => {
                let eager = model.decode(&DeviceBatch::upload(batch, None, device), options);
                if read(actions.clone())? == read(eager.actions)? {
                    self.recorded = Some(recorded);
                    self.replay_checked = false;
                    return Ok(Some(actions));
                }
                "its tours differ from the eager decode's".to_string()
            }
            Err(why) => why.to_string(),
        };
        self.refuse(&refusal);
        Ok(None)
    }

    /// No graph from now on, said once.
    fn refuse(&mut self, why: &str) {
        eprintln!("rollout baseline: device graph not used ({why}); decoding eagerly");
        self.recorded = None;
        self.refused = true;
    }
}

fn read(actions: Tensor<2, Int>) -> Result<Vec<i64>, TrainError> {
    let data = actions
        .try_into_data()
        .map_err(|e| TrainError::device("the rollout baseline's tours", e))?;
    Ok(int_data_to_i64(data))
}

#[cfg(test)]
mod tests {
    use routeburn_data::{Generator, InstanceRng};
    use routeburn_model::{AttentionModelConfig, Backend};

    use super::*;

    /// The default backend has no device graphs: the baseline is not recorded there,
    /// and where a recording is asked for anyway it is refused once, then never tried
    /// again, and the caller decodes eagerly.
    #[test]
    fn without_device_graphs_the_rollout_decodes_eagerly_and_records_once_at_most() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let model = AttentionModelConfig::new().init(&device);
        let batch = Generator::uniform(10).sample_batch(&mut InstanceRng::new(3), 4);
        let options = DecodeOptions::greedy();
        let mut unwanted = RecordedRollout::new(true, &device);
        assert!(!unwanted.wanted, "flex records no device graphs");
        assert!(unwanted
            .decode(&model, &batch, &options, &device)
            .unwrap()
            .is_none());
        let mut asked = RecordedRollout {
            wanted: true,
            recorded: None,
            replay_checked: false,
            refused: false,
        };
        assert!(asked
            .decode(&model, &batch, &options, &device)
            .unwrap()
            .is_none());
        assert!(asked.refused && asked.recorded.is_none());
        assert!(asked
            .decode(&model, &batch, &options, &device)
            .unwrap()
            .is_none());
    }
}
