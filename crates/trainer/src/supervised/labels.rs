//! The pointer network's labels: instances solved by the classical heuristic on every
//! core (`routeburn_data::label_instances`), written once as a JSONL dataset and read back
//! by later runs and resumes.

use std::path::{Path, PathBuf};
use std::time::Instant;

use routeburn_data::{label_instances, read_jsonl, write_jsonl, InstanceRng, Record};

use crate::config::Config;
use crate::error::TrainError;
use crate::evaluate::mean;
use crate::run::method::Setup;
use crate::run::paths::resolve;
use crate::run::progress::labelling_bar;

/// One labelled training example in the form the loop needs.
pub(crate) struct Example {
    pub(crate) record: Record,
    /// The label as decoder actions: each route, then a depot visit.
    pub(crate) target: Vec<i64>,
}

/// Where the run's labels live: `supervised.labels_file`, or `labels.jsonl` in the run.
fn labels_path(setup: &Setup) -> PathBuf {
    match &setup.config.supervised.labels_file {
        Some(p) => resolve(p, setup.config_dir),
        None => setup.run_dir.join("labels.jsonl"),
    }
}

/// Reads the labels file, or labels fresh instances and writes it.
pub(crate) fn load_or_make_labels(setup: &Setup) -> Result<Vec<Example>, TrainError> {
    let (config, verbose) = (setup.config, setup.verbose);
    let path = labels_path(setup);
    let records = if path.exists() {
        let records = read_jsonl(&path)?;
        check_labels(&records, config, &path)?;
        if verbose {
            eprintln!(
                "{} labelled instances from {}",
                records.len(),
                path.display()
            );
        }
        records
    } else {
        make_labels(config, &path, verbose)?
    };
    Ok(records
        .into_iter()
        .map(|record| {
            let target = record
                .reference_routes
                .as_ref()
                .expect("checked: every record has a label")
                .to_actions(0);
            Example { record, target }
        })
        .collect())
}

fn check_labels(records: &[Record], config: &Config, path: &Path) -> Result<(), TrainError> {
    let n = config.problem.n;
    if records.is_empty() {
        return Err(TrainError::Input(format!(
            "{}: no labelled instances",
            path.display()
        )));
    }
    for (i, r) in records.iter().enumerate() {
        if r.instance.n() != n {
            return Err(TrainError::Input(format!(
                "{} line {}: instance `{}` has {} customers, but problem.n is {n}",
                path.display(),
                i + 1,
                r.instance.name(),
                r.instance.n()
            )));
        }
        if r.reference_routes.is_none() {
            return Err(TrainError::Input(format!(
                "{} line {}: no `reference_routes`; a labels file needs a solution per instance",
                path.display(),
                i + 1
            )));
        }
    }
    Ok(())
}

fn make_labels(config: &Config, path: &Path, verbose: bool) -> Result<Vec<Record>, TrainError> {
    let sup = &config.supervised;
    let generator = config.generator()?;
    let instances =
        generator.sample_many(&mut InstanceRng::new(sup.label_seed), sup.labels, "label");
    let start = Instant::now();
    let pb = labelling_bar(instances.len(), verbose);
    let records = label_instances(&instances, &sup.heuristic(), &|_| pb.inc(1));
    pb.finish_and_clear();
    let seconds = start.elapsed().as_secs_f64();
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(|e| TrainError::io(parent, e))?;
    }
    // Write beside, then rename: a killed run never leaves half a labels file.
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    write_jsonl(&tmp, &records)?;
    std::fs::rename(&tmp, path).map_err(|e| TrainError::io(path, e))?;
    if verbose {
        let costs: Vec<f64> = records.iter().filter_map(|r| r.reference_cost).collect();
        eprintln!(
            "labelled {} instances in {seconds:.1}s ({:.2} ms each on {} threads), mean cost {:.4}; written to {}",
            records.len(),
            1000.0 * seconds / records.len().max(1) as f64 * rayon::current_num_threads() as f64,
            rayon::current_num_threads(),
            mean(&costs),
            path.display()
        );
    }
    Ok(records)
}
