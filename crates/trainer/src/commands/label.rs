use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use routeburn_data::{label_instances, read_jsonl, write_jsonl, HeuristicConfig, Instance};

use crate::error::TrainError;
use crate::evaluate::mean;
use crate::run::progress::labelling_bar;

#[derive(Debug, Args)]
pub struct LabelArgs {
    /// JSONL dataset to solve. Reference costs in it, if any, are compared against.
    #[arg(long)]
    pub data: PathBuf,
    /// Where to write the labelled dataset (JSONL, canonical route order).
    #[arg(long)]
    pub out: PathBuf,
    /// Ruin-and-recreate rounds per instance.
    #[arg(long, default_value_t = HeuristicConfig::default().perturbation_rounds)]
    pub rounds: usize,
    /// Seed of the heuristic's random rounds.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Worker threads (default: one per core).
    #[arg(long)]
    pub threads: Option<usize>,
}

pub fn run(args: LabelArgs) -> Result<ExitCode, TrainError> {
    let records = read_jsonl(&args.data)?;
    let instances: Vec<Instance> = records.iter().map(|r| r.instance.clone()).collect();
    let config = HeuristicConfig {
        perturbation_rounds: args.rounds,
        seed: args.seed,
        ..HeuristicConfig::default()
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(args.threads.unwrap_or(0))
        .build()
        .map_err(|e| TrainError::Input(format!("--threads: {e}")))?;
    let threads = pool.current_num_threads();
    let pb = labelling_bar(instances.len(), true);
    let start = Instant::now();
    let labels = pool.install(|| label_instances(&instances, &config, &|_| pb.inc(1)));
    let seconds = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    crate::atomic::create_parent(&args.out)?;
    write_jsonl(&args.out, &labels)?;

    let costs: Vec<f64> = labels.iter().filter_map(|r| r.reference_cost).collect();
    println!(
        "labelled {} instances in {seconds:.2}s on {threads} threads: {:.2} ms per instance per thread",
        labels.len(),
        1000.0 * seconds * threads as f64 / labels.len().max(1) as f64
    );
    println!("mean cost {:.4}", mean(&costs));
    let gaps: Option<Vec<f64>> = records
        .iter()
        .zip(&costs)
        .map(|(r, c)| r.reference_cost.map(|reference| c / reference - 1.0))
        .collect();
    if let Some(gaps) = gaps {
        println!(
            "mean gap to {}'s reference costs: {:.3}%",
            args.data.display(),
            100.0 * mean(&gaps)
        );
    }
    eprintln!("wrote {}", args.out.display());
    Ok(ExitCode::SUCCESS)
}
