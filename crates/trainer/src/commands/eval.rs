use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use clap::Args;
use routeburn_data::{read_jsonl, read_sol, read_vrp, Instance, InstanceRng};
use routeburn_model::{recorded_decode, Backend, DeviceTraits, MatmulPrecision};
use statrs::statistics::{Data, Median};

use crate::error::TrainError;
use crate::evaluate::mean;
use crate::inference::{
    padded_batch, solve_batch, upload_batch, GraphSolver, Solved, Strategy, TrainedModel,
};
use crate::run::progress::instances_bar;

#[derive(Debug, Args)]
pub struct EvalArgs {
    /// Run directory of a trained model (its best checkpoint, else its latest), a checkpoint
    /// directory, or a PyTorch checkpoint of Kool et al.'s attention model (`.pt`,
    /// `args.json` beside it).
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// A JSONL dataset, or a directory of CVRPLIB .vrp files (with .sol files beside them
    /// for gaps).
    #[arg(long)]
    pub data: PathBuf,
    /// greedy, sample:K, multistart, aug8, multistart+aug8, sample:K+aug8.
    #[arg(long, default_value = "greedy", value_parser = super::parse_strategy)]
    pub strategy: Strategy,
    /// Per-instance results (CSV: name, n, cost, reference, gap_percent, routes, and the tour
    /// as actions, `0` between routes).
    #[arg(long)]
    pub out: Option<PathBuf>,
    /// Most decoder rows (instances × samples × symmetries × starts) in one batch. On cuda
    /// (and cpu) a last, partial batch is padded with copies of an instance to the others'
    /// size, so that no new shapes are compiled for it.
    #[arg(long, default_value_t = 8192)]
    pub max_rows: usize,
    #[arg(long, value_parser = super::backend_parser())]
    pub backend: Option<String>,
    /// Seed of the sampling noise.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// A developer's probe of device graphs (CUDA graphs): decode the first batch eagerly
    /// and as a recorded graph, replay it, print whether it replays on the device, both
    /// times and whether their tours agree, and exit without evaluating.
    #[arg(long)]
    pub graph_probe: bool,
    /// Decode through a device graph (CUDA graphs): the first batch's decode is recorded
    /// once and replayed on each next batch of the same size, its instances written into
    /// the recorded inputs (the last, partial one is padded to that size on CUDA); batches
    /// of another instance size decode eagerly, and so does everything where the backend
    /// records no graph (said on stderr). Greedy, multistart and aug8 only.
    #[arg(long, conflicts_with = "graph_probe")]
    pub graph: bool,
    /// `highest`: every product of the attention model at f32 accuracy, as three TF32
    /// products on CUDA's tensor cores (about 3× the matmul work); `high`: the device's own
    /// (TF32 on CUDA). Default: the model's `model.matmul_precision`.
    #[arg(long, value_parser = super::matmul_precision_parser())]
    pub matmul_precision: Option<MatmulPrecision>,
}

/// An instance to evaluate and the cost it is measured against.
pub(crate) struct EvalItem {
    pub instance: Instance,
    pub reference: Option<f64>,
}

/// Reads a JSONL dataset or every `.vrp` in a directory (references from `.sol` files
/// beside them).
pub(crate) fn load_items(path: &Path) -> Result<(Vec<EvalItem>, bool), TrainError> {
    if path.is_dir() {
        let mut files: Vec<PathBuf> = std::fs::read_dir(path)
            .map_err(|e| TrainError::io(path, e))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "vrp"))
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(TrainError::Input(format!(
                "{}: no .vrp files",
                path.display()
            )));
        }
        let items = files
            .iter()
            .map(|f| {
                Ok(EvalItem {
                    instance: read_vrp(f)?,
                    reference: reference_beside(f)?,
                })
            })
            .collect::<Result<Vec<_>, TrainError>>()?;
        Ok((items, true))
    } else {
        let records = read_jsonl(path)?;
        if records.is_empty() {
            return Err(TrainError::Input(format!(
                "{}: no instances",
                path.display()
            )));
        }
        Ok((
            records
                .into_iter()
                .map(|r| EvalItem {
                    instance: r.instance,
                    reference: r.reference_cost,
                })
                .collect(),
            false,
        ))
    }
}

/// The stated cost of `NAME.sol` next to `NAME.vrp`, if there is one with a `Cost` line.
pub(crate) fn reference_beside(vrp: &Path) -> Result<Option<f64>, TrainError> {
    let sol = vrp.with_extension("sol");
    if !sol.exists() {
        return Ok(None);
    }
    Ok(read_sol(&sol)?.cost)
}

pub(crate) fn run(args: EvalArgs) -> Result<ExitCode, TrainError> {
    let backend = Backend::resolve(args.backend.as_deref())?;
    let device = backend.device()?;
    let mut trained = TrainedModel::load(&args.checkpoint, &device)?;
    if let Some(precision) = args.matmul_precision {
        trained = trained.with_matmul_precision(precision)?;
    }
    trained.announce();
    let (items, normalize) = load_items(&args.data)?;
    if args.graph_probe {
        return graph_probe(&args, &trained, &items, normalize, (backend, &device));
    }
    let start = Instant::now();
    let (results, replays) = solve_all(&args, &trained, &items, normalize, &device)?;
    let seconds = start.elapsed().as_secs_f64();

    let costs: Vec<f64> = results.iter().map(|r| r.cost).collect();
    let gaps: Vec<f64> = items
        .iter()
        .zip(&results)
        .filter_map(|(it, r)| it.reference.map(|re| 100.0 * (r.cost / re - 1.0)))
        .collect();
    println!("instances      {}", items.len());
    println!("strategy       {}", args.strategy);
    println!("backend        {backend}");
    println!("mean cost      {:.6}", mean(&costs));
    if !gaps.is_empty() {
        println!(
            "mean gap       {:.3}% ({} instances with a reference)",
            mean(&gaps),
            gaps.len()
        );
    }
    println!("total time     {seconds:.3} s");
    let rate = items.len() as f64 / seconds;
    // Enough digits for slow strategies too (×8 multi-start at n = 100 is < 0.1/s).
    let digits = if rate >= 10.0 { 1 } else { 3 };
    println!("instances/s    {rate:.digits$}");
    if let Some(GraphReplays { replayed, batches }) = replays {
        println!("device graph   replayed on {replayed} of {batches} batches");
    }
    if let Some(out) = &args.out {
        write_results(out, &items, &results)?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Solves every item, in batches of one instance size of at most `--max-rows` decoder
/// rows (on CubeCL devices, a last partial batch padded to the others' size); results in
/// the items' order, and with `--graph` how many of how many batches replayed the device
/// graph.
fn solve_all(
    args: &EvalArgs,
    trained: &TrainedModel,
    items: &[EvalItem],
    normalize: bool,
    device: &burn::tensor::Device,
) -> Result<(Vec<Solved>, Option<GraphReplays>), TrainError> {
    let check_every = trained.config.training.decode_check_every;
    let pad = DeviceTraits::of(device).keeps_batch_shapes;
    let mut graph = match args.graph {
        true => Some(GraphSolver::new(
            &trained.model,
            args.strategy,
            normalize,
            check_every,
        )?),
        false => None,
    };
    let mut batches = 0;
    let mut rng = InstanceRng::new(args.seed);
    let mut by_n: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, it) in items.iter().enumerate() {
        by_n.entry(it.instance.n()).or_default().push(i);
    }
    let mut results = vec![None; items.len()];
    let chunk_of = |n: usize| (args.max_rows / args.strategy.rows_per_instance(n)).max(1);
    let all_batches = by_n
        .iter()
        .map(|(&n, idx)| idx.len().div_ceil(chunk_of(n)))
        .sum();
    let bar = instances_bar(items.len(), all_batches);
    for (n, idx) in by_n {
        let chunk = chunk_of(n);
        let chunks = idx.len().div_ceil(chunk);
        for part in idx.chunks(chunk) {
            let instances: Vec<&Instance> = part.iter().map(|&i| &items[i].instance).collect();
            let decoded = padded_batch(&instances, chunk, chunks, pad);
            batches += 1;
            let solved = match graph.as_mut() {
                Some(graph) => graph.solve(&decoded, device)?,
                None => solve_batch(
                    &trained.model,
                    &decoded,
                    args.strategy,
                    normalize,
                    None,
                    check_every,
                    &mut rng,
                    device,
                )?,
            };
            // The zip leaves out the padding's solutions.
            for (&i, s) in part.iter().zip(solved) {
                results[i] = Some(s);
            }
            bar.inc(part.len() as u64);
        }
    }
    bar.finish_and_clear();
    let results = results
        .into_iter()
        .map(|r| r.expect("every instance solved"));
    let replays = graph.map(|g| GraphReplays {
        replayed: g.replays,
        batches,
    });
    Ok((results.collect(), replays))
}

/// With `--graph`: how many of the batches replayed the device graph.
struct GraphReplays {
    replayed: usize,
    batches: usize,
}

/// Runs of each kind in `--graph-probe`.
const PROBE_RUNS: usize = 3;

/// `--graph-probe`: the first `--max-rows` rows' worth of the first instance size, decoded
/// eagerly and replayed as a device graph ([`recorded_decode::probe`]). Exit status 1 when a
/// replay's tours differ from the eager decode's.
fn graph_probe(
    args: &EvalArgs,
    trained: &TrainedModel,
    items: &[EvalItem],
    normalize: bool,
    (backend, device): (Backend, &burn::tensor::Device),
) -> Result<ExitCode, TrainError> {
    if args.strategy.samples > 0 {
        return Err(TrainError::Input(format!(
            "--graph-probe decodes greedily (greedy, multistart, aug8); got --strategy {}",
            args.strategy
        )));
    }
    let n = items[0].instance.n();
    let rows_each = args.strategy.rows_per_instance(n);
    let instances: Vec<&Instance> = (items.iter().map(|it| &it.instance))
        .filter(|inst| inst.n() == n)
        .take((args.max_rows / rows_each).max(1))
        .collect();
    let check_every = trained.config.training.decode_check_every;
    let mut rng = InstanceRng::new(args.seed);
    let (_, problem, options) = upload_batch(
        &instances,
        args.strategy,
        normalize,
        check_every,
        &mut rng,
        device,
    )?;
    let found = recorded_decode::probe(&trained.model, &problem, &options, PROBE_RUNS);
    let rows = instances.len() * rows_each;
    println!(
        "graph probe    {backend}, {} instances of n = {n}, {}: {rows} rows",
        instances.len(),
        args.strategy
    );
    let eager = Data::new(found.eager_seconds.clone()).median();
    println!("eager decode   {eager:.4} s (median of {PROBE_RUNS}, tours read back)");
    if let Some(why) = &found.refused {
        println!("device graph   not recorded: {why}");
        return Ok(ExitCode::SUCCESS);
    }
    let replay = Data::new(found.replay_seconds.clone()).median();
    let same = found.replay_seconds.len() - found.replays_differing;
    println!(
        "device graph   replay {replay:.4} s (median of {PROBE_RUNS}), {:.1}x the eager decode; tours as the eager decode's in {same} of {} replays",
        eager / replay,
        found.replay_seconds.len()
    );
    Ok(if found.replays_differing == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// The per-instance CSV of `--out`; `tour` is the solution as a decoder's actions
/// (customers, `0` between routes, no padding), the form of Kool's and rl4co's tours.
fn write_results(out: &Path, items: &[EvalItem], results: &[Solved]) -> Result<(), TrainError> {
    let mut csv = String::from("name,n,cost,reference,gap_percent,routes,tour\n");
    for (it, r) in items.iter().zip(results) {
        let routes: Vec<String> = r.solution.routes.iter().map(|route| join(route)).collect();
        let _ = writeln!(
            csv,
            "{},{},{:.6},{},{},{},{}",
            it.instance.name(),
            it.instance.n(),
            r.cost,
            it.reference.map_or(String::new(), |x| format!("{x}")),
            it.reference.map_or(String::new(), |x| format!(
                "{:.4}",
                100.0 * (r.cost / x - 1.0)
            )),
            r.solution.routes.len(),
            routes.join(" 0 ")
        );
    }
    crate::atomic::write_atomic(out, csv.as_bytes())?;
    eprintln!("per-instance results in {}", out.display());
    Ok(())
}

fn join(route: &[u32]) -> String {
    let customers: Vec<String> = route.iter().map(u32::to_string).collect();
    customers.join(" ")
}
