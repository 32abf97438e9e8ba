use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;

use crate::error::TrainError;
use crate::plot::{plot_curves, read_curves};

#[derive(Debug, Args)]
pub struct PlotArgs {
    /// A run directory (with metrics.csv).
    pub run_dir: PathBuf,
    /// Output file (default: RUN_DIR/curves.svg).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

pub fn run(args: PlotArgs) -> Result<ExitCode, TrainError> {
    let curves = read_curves(&args.run_dir.join("metrics.csv"))?;
    let out = args.out.unwrap_or_else(|| args.run_dir.join("curves.svg"));
    crate::atomic::create_parent(&out)?;
    let title = format!("routeburn: {}", args.run_dir.display());
    plot_curves(&curves, &title, &out)?;
    eprintln!("wrote {}", out.display());
    Ok(ExitCode::SUCCESS)
}
