//! The validation set of a run: a JSONL file with reference costs, or generated instances.

use std::path::Path;

use burn::tensor::Device;
use routeburn_data::{read_jsonl, Batch, DatasetReader, Generator, InstanceRng};
use routeburn_model::{DecodeOptions, Policy};

use crate::config::{Config, ValidationStrategy, DEFAULT_VALIDATION_FILE};
use crate::error::TrainError;
use crate::evaluate::{batches_of, decode_costs, mean};
use crate::run::paths::resolve;
use crate::shards::Shards;

/// Batches, and reference costs per instance when the file has them.
pub(crate) struct ValidationSet {
    batches: Vec<Batch>,
    references: Option<Vec<f64>>,
    options: DecodeOptions,
    shards: Shards,
}

impl ValidationSet {
    pub(crate) fn load(
        config: &Config,
        generator: &Generator,
        config_dir: Option<&Path>,
        verbose: bool,
    ) -> Result<Self, TrainError> {
        let v = &config.validation;
        let shards = Shards::of(&config.training);
        let options = DecodeOptions::greedy()
            .without_log_likelihood()
            .with_check_every(config.training.decode_check_every)
            .with_multi_start(config.validation_strategy() == ValidationStrategy::Multistart);
        let Some(file) = &v.file else {
            let instances = generator.sample_many(&mut InstanceRng::new(v.seed), v.size, "val");
            return Ok(Self {
                batches: batches_of(&instances, v.batch_size)?,
                references: None,
                options,
                shards,
            });
        };
        let path = resolve(file, config_dir);
        let (embedded_name, embedded) = DEFAULT_VALIDATION_FILE;
        let records = match (path.exists(), file == Path::new(embedded_name)) {
            (true, _) => read_jsonl(&path)?,
            (false, true) => {
                if verbose {
                    eprintln!("validation: {embedded_name} is not in the working directory; using the copy built into routeburn");
                }
                DatasetReader::new(embedded, format!("(built in) {embedded_name}"))
                    .collect::<Result<_, _>>()?
            }
            (false, false) => {
                let beside = config_dir.map_or(String::new(), |d| {
                    format!(" nor in {} or a parent directory", d.display())
                });
                return Err(TrainError::Input(format!(
                    "validation.file = \"{}\": no such file in the working directory{beside}",
                    file.display()
                )));
            }
        };
        let n = config.problem.n;
        let bad = |message: String| {
            TrainError::Input(format!("validation.file {}: {message}", path.display()))
        };
        if records.is_empty() {
            return Err(bad("no instances".into()));
        }
        if let Some(r) = records.iter().find(|r| r.instance.n() != n) {
            return Err(bad(format!(
                "instance `{}` has {} customers, but problem.n is {n}",
                r.instance.name(),
                r.instance.n()
            )));
        }
        let references: Option<Vec<f64>> = records.iter().map(|r| r.reference_cost).collect();
        let instances: Vec<_> = records.into_iter().map(|r| r.instance).collect();
        Ok(Self {
            batches: batches_of(&instances, v.batch_size)?,
            references,
            options,
            shards,
        })
    }

    /// Mean validated cost of `model`'s decodes, and the mean gap to the reference costs
    /// in percent when the set has them.
    pub(crate) fn evaluate(
        &self,
        model: &(impl Policy + Sync),
        device: &Device,
    ) -> Result<(f64, Option<f64>), TrainError> {
        let costs = decode_costs(model, &self.batches, &self.options, device, self.shards)?;
        let gap = self.references.as_ref().map(|refs| {
            let gaps: Vec<f64> = costs.iter().zip(refs).map(|(c, r)| c / r - 1.0).collect();
            100.0 * mean(&gaps)
        });
        Ok((mean(&costs), gap))
    }
}
