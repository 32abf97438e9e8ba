use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, ValueEnum};
use routeburn_data::{write_jsonl, write_vrp, Generator, GeneratorConfig, InstanceRng, Record};

use crate::error::TrainError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GenFormat {
    /// One JSON Lines file (the dataset format).
    Jsonl,
    /// One CVRPLIB .vrp file per instance in a directory.
    Vrp,
}

#[derive(Debug, Args)]
pub struct GenArgs {
    /// Customers per instance.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub n: u64,
    /// Number of instances.
    #[arg(long, default_value_t = 128)]
    pub count: usize,
    /// Seed of the portable generator: the same seed gives byte-identical files.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Vehicle capacity (default: Kool's 20/30/40/50 for n = 10/20/50/100, interpolated).
    #[arg(long)]
    pub capacity: Option<u32>,
    /// Smallest and largest customer demand.
    #[arg(long, default_value_t = 1)]
    pub min_demand: u32,
    #[arg(long, default_value_t = 9)]
    pub max_demand: u32,
    #[arg(long, value_enum, default_value_t = GenFormat::Jsonl)]
    pub format: GenFormat,
    /// Output file (jsonl) or directory (vrp).
    #[arg(long)]
    pub out: PathBuf,
}

pub fn run(args: GenArgs) -> Result<ExitCode, TrainError> {
    let n = args.n as usize;
    let generator = Generator::new(
        n,
        args.capacity,
        GeneratorConfig::Uniform {
            min_demand: args.min_demand,
            max_demand: args.max_demand,
        },
    )
    .map_err(|e| TrainError::Input(format!("--n/--capacity/--min-demand/--max-demand: {e}")))?;
    let mut rng = InstanceRng::new(args.seed);
    let instances =
        generator.sample_many(&mut rng, args.count, &format!("cvrp{n}_s{}_", args.seed));
    match args.format {
        GenFormat::Jsonl => {
            crate::atomic::create_parent(&args.out)?;
            let records: Vec<Record> = instances.into_iter().map(Record::new).collect();
            write_jsonl(&args.out, &records)?;
        }
        GenFormat::Vrp => {
            std::fs::create_dir_all(&args.out).map_err(|e| TrainError::io(&args.out, e))?;
            for inst in &instances {
                write_vrp(inst, args.out.join(format!("{}.vrp", inst.name())))?;
            }
        }
    }
    eprintln!(
        "wrote {} instances of {n} customers (capacity {}) to {}",
        args.count,
        generator.capacity(),
        args.out.display()
    );
    Ok(ExitCode::SUCCESS)
}
