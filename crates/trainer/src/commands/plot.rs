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
    let metrics = args.run_dir.join("metrics.csv");
    if !metrics.is_file() {
        return Err(TrainError::Input(format!(
            "{}: not a run directory (no metrics.csv); expected a directory `routeburn train` wrote",
            args.run_dir.display()
        )));
    }
    let curves = read_curves(&metrics)?;
    let out = args.out.unwrap_or_else(|| args.run_dir.join("curves.svg"));
    crate::atomic::create_parent(&out)?;
    let title = format!("routeburn: {}", args.run_dir.display());
    plot_curves(&curves, &title, &out)?;
    eprintln!("wrote {}", out.display());
    Ok(ExitCode::SUCCESS)
}
