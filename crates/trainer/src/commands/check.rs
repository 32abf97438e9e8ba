use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use routeburn_cost::Metric;
use routeburn_data::{read_sol, read_vrp};

use crate::error::TrainError;

#[derive(Debug, Args)]
pub struct CheckArgs {
    /// The instance, a CVRPLIB .vrp file.
    pub instance: PathBuf,
    /// The solution, a CVRPLIB .sol file (customers numbered 1..n after the depot).
    pub solution: PathBuf,
    /// Edge lengths: `cvrplib` rounds each edge to the nearest integer (EUC_2D), `exact`
    /// does not. Default: cvrplib for integer coordinates or explicit weights, exact
    /// otherwise.
    #[arg(long, value_parser = super::metric_parser())]
    pub metric: Option<Metric>,
}

pub fn run(args: CheckArgs) -> Result<ExitCode, TrainError> {
    let instance = read_vrp(&args.instance)?;
    let sol = read_sol(&args.solution)?;
    let metric = args.metric.unwrap_or_else(|| instance.default_metric());
    match instance.cost(&sol.solution, metric) {
        Ok(cost) => {
            println!("cost {}", format_cost(cost, metric));
            if let Some(stated) = sol.cost {
                if (stated - cost).abs() > 1e-6 * cost.abs().max(1.0) {
                    eprintln!(
                        "note: {} states cost {stated}, but it costs {} under the {} metric",
                        args.solution.display(),
                        format_cost(cost, metric),
                        metric_name(metric)
                    );
                }
            }
            Ok(ExitCode::SUCCESS)
        }
        Err(e) => {
            println!("infeasible: {e}");
            eprintln!(
                "{} is not a feasible solution of {}: {e}",
                args.solution.display(),
                args.instance.display()
            );
            Ok(ExitCode::from(1))
        }
    }
}

pub fn format_cost(cost: f64, metric: Metric) -> String {
    match metric {
        Metric::Cvrplib if cost.fract() == 0.0 => format!("{}", cost as i64),
        _ => format!("{cost:.6}"),
    }
}

fn metric_name(m: Metric) -> &'static str {
    match m {
        Metric::Exact => "exact",
        Metric::Cvrplib => "cvrplib",
    }
}
