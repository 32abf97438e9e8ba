use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use routeburn_cost::Metric;
use routeburn_data::{read_sol, read_vrp, write_sol, InstanceRng};
use routeburn_model::Backend;

use crate::commands::check::format_cost;
use crate::error::TrainError;
use crate::inference::{solve_batch, Strategy, TrainedModel};
use crate::plot::plot_routes;

#[derive(Debug, Args)]
pub struct SolveArgs {
    /// Run directory of a trained model (its best checkpoint, else its latest), a checkpoint
    /// directory, or a PyTorch checkpoint of Kool et al.'s attention model (`.pt`,
    /// `args.json` beside it).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// greedy, sample:K, multistart, aug8, multistart+aug8, sample:K+aug8.
    #[arg(long, default_value = "multistart+aug8", value_parser = super::parse_strategy)]
    pub strategy: Strategy,
    /// Where to write NAME.sol (and NAME.svg with --plot).
    #[arg(long)]
    pub out_dir: PathBuf,
    /// Also draw each solution's routes to NAME.svg.
    #[arg(long)]
    pub plot: bool,
    /// Directory of reference .sol files (default: beside each instance).
    #[arg(long)]
    pub reference_dir: Option<PathBuf>,
    /// cvrplib or exact (default: cvrplib for integer coordinates, exact otherwise).
    #[arg(long, value_parser = super::metric_parser())]
    pub metric: Option<Metric>,
    #[arg(long, value_parser = super::backend_parser())]
    pub backend: Option<String>,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// CVRPLIB .vrp instances.
    #[arg(required = true)]
    pub instances: Vec<PathBuf>,
}

pub fn run(args: SolveArgs) -> Result<ExitCode, TrainError> {
    let backend = Backend::resolve(args.backend.as_deref())?;
    let device = backend.device()?;
    let trained = TrainedModel::load(&args.checkpoint, &device)?;
    trained.announce();
    std::fs::create_dir_all(&args.out_dir).map_err(|e| TrainError::io(&args.out_dir, e))?;
    let mut rng = InstanceRng::new(args.seed);
    println!("instance\tn\tcost\treference\tgap_percent\tseconds");
    // One bad instance does not stop the others; the exit status says something failed.
    let mut failures = 0;
    for path in &args.instances {
        if let Err(e) = solve_one(&args, path, &trained, &mut rng, &device) {
            let (message, file) = (e.to_string(), path.display().to_string());
            match message.starts_with(&file) {
                true => eprintln!("error: {message}"),
                false => eprintln!("error: {file}: {message}"),
            }
            failures += 1;
        }
    }
    if failures > 0 {
        return Err(TrainError::Input(format!(
            "{failures} of {} instances could not be solved",
            args.instances.len()
        )));
    }
    Ok(ExitCode::SUCCESS)
}

fn solve_one(
    args: &SolveArgs,
    path: &std::path::Path,
    trained: &TrainedModel,
    rng: &mut InstanceRng,
    device: &burn::tensor::Device,
) -> Result<(), TrainError> {
    let instance = read_vrp(path)?;
    let start = Instant::now();
    let solved = solve_batch(
        &trained.model,
        &[&instance],
        args.strategy,
        true,
        args.metric,
        trained.config.training.decode_check_every,
        rng,
        device,
    )?
    .remove(0);
    let seconds = start.elapsed().as_secs_f64();
    let metric = args.metric.unwrap_or_else(|| instance.default_metric());
    let name = instance.name().to_string();
    let sol_path = args.out_dir.join(format!("{name}.sol"));
    write_sol(&solved.solution, solved.cost, &sol_path)?;
    let reference_sol = match &args.reference_dir {
        Some(d) => d.join(format!("{name}.sol")),
        None => path.with_extension("sol"),
    };
    let reference = if reference_sol.exists() && reference_sol != sol_path {
        read_sol(&reference_sol)?.cost
    } else {
        None
    };
    println!(
        "{name}\t{}\t{}\t{}\t{}\t{seconds:.3}",
        instance.n(),
        format_cost(solved.cost, metric),
        reference.map_or("-".into(), |r| format_cost(r, metric)),
        reference.map_or("-".into(), |r| format!(
            "{:.2}",
            100.0 * (solved.cost / r - 1.0)
        )),
    );
    if args.plot {
        let svg = args.out_dir.join(format!("{name}.svg"));
        let title = format!(
            "{name}: cost {} ({})",
            format_cost(solved.cost, metric),
            args.strategy
        );
        plot_routes(&instance, &solved.solution, &title, &svg)?;
    }
    Ok(())
}
