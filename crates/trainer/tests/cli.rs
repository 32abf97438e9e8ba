//! The `routeburn` binary as a user runs it: `gen` and `check`, exit codes and messages.

use std::path::{Path, PathBuf};
use std::process::Command;

fn routeburn() -> Command {
    Command::new(env!("CARGO_BIN_EXE_routeburn"))
}

fn data() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data")
}

/// Asserts the command exited 0, showing its stderr where it did not.
#[track_caller]
fn assert_success(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("routeburn-cli-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `routeburn check` reproduces the cost of every classical CVRPLIB solution (the optimum,
/// or for P-n55-k8 the 7-route solution's 576; INDEX.tsv says which).
#[test]
fn check_reproduces_every_cvrplib_cost() {
    let index = std::fs::read_to_string(data().join("cvrplib/INDEX.tsv")).unwrap();
    let mut lines = index.lines();
    let header: Vec<&str> = lines.next().unwrap().split('\t').collect();
    let col = |n: &str| header.iter().position(|h| *h == n).unwrap();
    let mut count = 0;
    for line in lines {
        let f: Vec<&str> = line.split('\t').collect();
        let dir = data().join("cvrplib").join(f[col("set")]);
        let out = routeburn()
            .arg("check")
            .arg(dir.join(format!("{}.vrp", f[col("name")])))
            .arg(dir.join(format!("{}.sol", f[col("name")])))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}: {}",
            f[0],
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert_eq!(
            stdout.trim(),
            format!("cost {}", f[col("sol_cost")]),
            "{}",
            f[0]
        );
        if f[col("status")] == "sol==BKS" {
            assert_eq!(f[col("sol_cost")], f[col("bks")]);
        }
        count += 1;
    }
    assert_eq!(count, 87);
}

/// `routeburn check VRP SOL` with `extra` flags.
fn check(vrp: &Path, sol: &Path, extra: &[&str]) -> std::process::Output {
    routeburn()
        .arg("check")
        .args(extra)
        .arg(vrp)
        .arg(sol)
        .output()
        .unwrap()
}

/// Infeasible solutions exit 1 and say why; `--metric exact` gives the unrounded cost.
#[test]
fn check_exit_codes() {
    let dir = tmp("check");
    let vrp = data().join("cvrplib/A/A-n32-k5.vrp");
    // Infeasible: drop a customer.
    let bad_sol = dir.join("bad.sol");
    std::fs::write(&bad_sol, "Route #1: 21 31 19 17 13 7 26\nRoute #2: 12 1 16 30\nRoute #3: 27 24\nRoute #4: 29 18 8 9 22 15 10 25 5 20\nRoute #5: 14 28 11 4 23 3 2\nCost 784\n").unwrap();
    let out = check(&vrp, &bad_sol, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("never visited"));
    // Over capacity: everything on one route.
    let all: Vec<String> = (1..=31).map(|c| c.to_string()).collect();
    std::fs::write(&bad_sol, format!("Route #1: {}\n", all.join(" "))).unwrap();
    let out = check(&vrp, &bad_sol, &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stdout).contains("above the capacity 100"));
    // Exact metric on a CVRPLIB instance: the unrounded cost from INDEX.tsv (787.8083).
    let out = check(
        &vrp,
        &data().join("cvrplib/A/A-n32-k5.sol"),
        &["--metric", "exact"],
    );
    assert!(out.status.success());
    let cost: f64 = String::from_utf8_lossy(&out.stdout)
        .trim()
        .trim_start_matches("cost ")
        .parse()
        .unwrap();
    assert!((cost - 787.8083).abs() < 1e-3, "{cost}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Malformed files, a missing file and a bad flag exit 2, naming the file and line.
#[test]
fn check_refuses_bad_input() {
    let dir = tmp("check-input");
    let vrp = data().join("cvrplib/A/A-n32-k5.vrp");
    let bad_sol = dir.join("bad.sol");
    std::fs::write(&bad_sol, "Route #1: 1 2 x\n").unwrap();
    let out = check(&vrp, &bad_sol, &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("bad.sol:1") && err.contains("customer `x`"),
        "{err}"
    );
    let bad_vrp = dir.join("bad.vrp");
    std::fs::write(
        &bad_vrp,
        "NAME : x\nDIMENSION : 3\nCAPACITY : 5\nNODE_COORD_SECTION\n1 0 0\n2 1 oops\n",
    )
    .unwrap();
    let out = check(&bad_vrp, &bad_sol, &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.vrp:6"), "{err}");
    // Missing file (named once, the OS's reason said once) and bad flag.
    let out = check(&dir.join("nope.vrp"), &bad_sol, &[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        (
            err.matches("nope.vrp").count(),
            err.matches("No such file").count()
        ),
        (1, 1),
        "{err}"
    );
    let out = check(&vrp, &bad_sol, &["--metric", "manhattan"]);
    assert_eq!(out.status.code(), Some(2));
    std::fs::remove_dir_all(&dir).ok();
}

fn gen(args: &[&str], out: &Path) -> std::process::Output {
    routeburn()
        .arg("gen")
        .args(args)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn gen_is_byte_identical_for_a_seed() {
    let dir = tmp("gen");
    let (a, b, c) = (
        dir.join("a.jsonl"),
        dir.join("b.jsonl"),
        dir.join("c.jsonl"),
    );
    assert!(gen(&["--n", "20", "--count", "50", "--seed", "7"], &a)
        .status
        .success());
    assert!(gen(&["--n", "20", "--count", "50", "--seed", "7"], &b)
        .status
        .success());
    assert!(gen(&["--n", "20", "--count", "50", "--seed", "8"], &c)
        .status
        .success());
    let (a, b, c) = (
        std::fs::read(a).unwrap(),
        std::fs::read(b).unwrap(),
        std::fs::read(c).unwrap(),
    );
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert_eq!(a.iter().filter(|&&x| x == b'\n').count(), 50);

    let (d1, d2) = (dir.join("v1"), dir.join("v2"));
    assert!(gen(
        &["--n", "5", "--count", "3", "--seed", "1", "--format", "vrp"],
        &d1
    )
    .status
    .success());
    assert!(gen(
        &["--n", "5", "--count", "3", "--seed", "1", "--format", "vrp"],
        &d2
    )
    .status
    .success());
    let mut names: Vec<_> = std::fs::read_dir(&d1)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    names.sort();
    assert_eq!(names.len(), 3);
    for name in names {
        assert_eq!(
            std::fs::read(d1.join(&name)).unwrap(),
            std::fs::read(d2.join(&name)).unwrap()
        );
        let inst = routeburn_data::read_vrp(d1.join(&name)).unwrap();
        assert_eq!(inst.n(), 5);
    }
    // Bad flags are errors, not panics.
    let out = gen(&["--n", "0"], &dir.join("x.jsonl"));
    assert_eq!(out.status.code(), Some(2));
    let out = gen(&["--n", "5", "--capacity", "3"], &dir.join("x.jsonl"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("capacity"));
    std::fs::remove_dir_all(&dir).ok();
}

/// A user's whole path: train a tiny model, evaluate it with every strategy, solve CVRPLIB
/// instances with pictures, and check the written solutions; then what each command
/// refuses. One trained run serves every part.
#[test]
fn train_eval_solve_check() {
    let dir = tmp("e2e");
    let config = dir.join("tiny.toml");
    std::fs::write(
        &config,
        "[problem]\nn = 10\n[model]\nembed_dim = 16\nnum_heads = 2\nnum_layers = 1\nfeed_forward_dim = 32\n\
[training]\nepochs = 1\nbatch_size = 16\nlr = 1e-3\n[reinforce]\nbatches_per_epoch = 2\nbaseline = \"exponential\"\n\
[validation]\nsize = 16\n[logging]\nprogress = false\n",
    )
    .unwrap();
    let run = dir.join("run");
    let out = routeburn()
        .arg("train")
        .arg("--config")
        .arg(&config)
        .arg("--run-dir")
        .arg(&run)
        .arg("-q")
        .output()
        .unwrap();
    assert_success(&out);
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    assert!(metrics.starts_with("epoch,train_cost,baseline_cost"));
    assert_eq!(metrics.lines().count(), 2);

    evaluates_with_every_strategy(&run, &dir);
    probes_device_graphs(&run);
    evaluates_through_device_graphs(&run, &dir);
    solves_cvrplib_instances_with_pictures(&run, &dir);
    #[cfg(target_os = "linux")]
    refuses_decodes_larger_than_the_memory(&run, &dir);
    plots_and_writes_into_new_directories(&run, &dir);
    refuses_what_is_not_a_run_or_a_strategy(&run, &dir, &config);
    std::fs::remove_dir_all(&dir).ok();
}

/// `eval` with every strategy: each succeeds and writes a row per instance.
fn evaluates_with_every_strategy(run: &Path, dir: &Path) {
    for strategy in [
        "greedy",
        "sample:4",
        "multistart",
        "aug8",
        "multistart+aug8",
        "sample:2+aug8",
    ] {
        let csv = dir.join("eval.csv");
        let out = routeburn()
            .args(["eval", "--strategy", strategy, "--checkpoint"])
            .arg(run)
            .arg("--data")
            .arg(data().join("validation/cvrp10.jsonl"))
            .arg("--out")
            .arg(&csv)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{strategy}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(stdout.contains("mean gap"), "{stdout}");
        assert_eq!(std::fs::read_to_string(&csv).unwrap().lines().count(), 129);
    }
}

/// The device-graph probe: flex has no device graphs, so it decodes eagerly, says why
/// nothing was recorded, and exits 0; a sampled decode is refused by name.
fn probes_device_graphs(run: &Path) {
    let probe = |strategy: &str| {
        routeburn()
            .args([
                "eval",
                "--graph-probe",
                "--strategy",
                strategy,
                "--checkpoint",
            ])
            .arg(run)
            .arg("--data")
            .arg(data().join("validation/cvrp10.jsonl"))
            .output()
            .unwrap()
    };
    let out = probe("multistart");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    assert!(
        stdout.contains("128 instances of n = 10, multistart: 1280 rows"),
        "{stdout}"
    );
    assert!(
        stdout.contains("device graph   not recorded: opening the capture"),
        "{stdout}"
    );
    let out = probe("sample:2");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--graph-probe decodes greedily"),
        "{stderr}"
    );
}

/// `--graph`: without device graphs every batch decodes eagerly, with the reason said
/// once; the per-instance results are the eager evaluation's, byte for byte.
fn evaluates_through_device_graphs(run: &Path, dir: &Path) {
    let graph_eval = |strategy: &str, graph: bool, csv: &Path| {
        let mut cmd = routeburn();
        cmd.args([
            "eval",
            "--strategy",
            strategy,
            "--max-rows",
            "500",
            "--checkpoint",
        ])
        .arg(run)
        .arg("--data")
        .arg(data().join("validation/cvrp10.jsonl"))
        .arg("--out")
        .arg(csv);
        if graph {
            cmd.arg("--graph");
        }
        cmd.output().unwrap()
    };
    let (eager_csv, graph_csv) = (dir.join("eager.csv"), dir.join("graph.csv"));
    let out = graph_eval("multistart", true, &graph_csv);
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("device graph   replayed on 0 of 3 batches"),
        "{stdout}"
    );
    assert_eq!(
        stderr.matches("device graph: not recorded").count(),
        1,
        "{stderr}"
    );
    assert!(graph_eval("multistart", false, &eager_csv).status.success());
    assert_eq!(
        std::fs::read_to_string(&graph_csv).unwrap(),
        std::fs::read_to_string(&eager_csv).unwrap()
    );
    let out = graph_eval("sample:2", true, &graph_csv);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--graph decodes greedily"), "{stderr}");
}

/// `solve` with pictures, each solution passing `check`; an instance that cannot be solved
/// fails on its own.
fn solves_cvrplib_instances_with_pictures(run: &Path, dir: &Path) {
    let sols = dir.join("sols");
    let instances = ["P/P-n16-k8", "A/A-n32-k5"];
    let out = routeburn()
        .args([
            "solve",
            "--strategy",
            "multistart+aug8",
            "--plot",
            "--checkpoint",
        ])
        .arg(run)
        .arg("--out-dir")
        .arg(&sols)
        .args(
            instances
                .iter()
                .map(|i| data().join(format!("cvrplib/{i}.vrp"))),
        )
        .output()
        .unwrap();
    assert_success(&out);
    for i in instances {
        let name = i.split('/').nth(1).unwrap();
        let out = routeburn()
            .arg("check")
            .arg(data().join(format!("cvrplib/{i}.vrp")))
            .arg(sols.join(format!("{name}.sol")))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{name}: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let svg = std::fs::read_to_string(sols.join(format!("{name}.svg"))).unwrap();
        assert!(
            svg.contains("<svg") && svg.contains("polyline"),
            "{name}.svg"
        );
    }

    // An instance without coordinates and a missing file fail on their own, each named
    // once; the others are still solved.
    let mixed = dir.join("mixed");
    let out = routeburn()
        .args(["solve", "--strategy", "greedy", "--checkpoint"])
        .arg(run)
        .arg("--out-dir")
        .arg(&mixed)
        .arg(data().join("cvrplib/E/E-n13-k4.vrp"))
        .arg(data().join("cvrplib/P/P-n16-k8.vrp"))
        .arg(dir.join("missing.vrp"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("E-n13-k4.vrp: instance `E-n13-k4` has no coordinates")
            && err.matches("missing.vrp").count() == 1
            && err.contains("2 of 3 instances could not be solved"),
        "{err}"
    );
    assert!(mixed.join("P-n16-k8.sol").exists());
}

/// A decode larger than the machine's memory (CVRP60000, multi-start ×8: 60,000 rollouts
/// of each of the symmetries decoded at once, ~240 GiB each) is refused before it starts,
/// with its size and the way out, rather than killed by the OS.
#[cfg(target_os = "linux")]
fn refuses_decodes_larger_than_the_memory(run: &Path, dir: &Path) {
    let xxl = dir.join("xxl");
    let out = gen(&["--n", "60000", "--count", "1", "--format", "vrp"], &xxl);
    assert_success(&out);
    let out = routeburn()
        .args(["solve", "--strategy", "multistart+aug8", "--checkpoint"])
        .arg(run)
        .arg("--out-dir")
        .arg(dir.join("xxl-sols"))
        .arg(xxl.join("cvrp60000_s0_000000.vrp"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cvrp60000_s0_000000.vrp: --strategy multistart+aug8 decodes")
            && err.contains("rollouts of 60001 nodes at once")
            && err.contains("use a strategy with fewer rollouts"),
        "{err}"
    );
    // So is training whose encoder alone would keep more than the memory for the
    // backward (CVRP100000 at batch 512: ~10⁵ GiB), before anything is written.
    let config = dir.join("xxl.toml");
    std::fs::write(&config, "[problem]\nn = 100000\n").unwrap();
    let out = routeburn()
        .args(["train", "-q", "--config"])
        .arg(&config)
        .arg("--run-dir")
        .arg(dir.join("xxl-run"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("xxl.toml: problem.n = 100000 with training.batch_size = 512")
            && err.contains("lower training.batch_size or problem.n"),
        "{err}"
    );
    assert!(!dir.join("xxl-run").exists());
}

/// `plot` draws the run's curves; output files go into directories made for them.
fn plots_and_writes_into_new_directories(run: &Path, dir: &Path) {
    let out = routeburn().arg("plot").arg(run).output().unwrap();
    assert_success(&out);
    assert!(std::fs::read_to_string(run.join("curves.svg"))
        .unwrap()
        .contains("<svg"));
    // Output files go into directories made for them, as `gen --out` does.
    let (svg, csv) = (dir.join("new/curves.svg"), dir.join("new/deeper/eval.csv"));
    let out = routeburn()
        .arg("plot")
        .arg(run)
        .arg("--out")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(out.status.success() && svg.exists());
    let out = eval_checkpoint(run, &data().join("validation/cvrp10.jsonl"), Some(&csv));
    assert!(out.status.success() && csv.exists());
}

/// A run directory that is not one, a bad strategy and a corrupt checkpoint: errors, not
/// panics.
fn refuses_what_is_not_a_run_or_a_strategy(run: &Path, dir: &Path, config: &Path) {
    let out = routeburn().arg("plot").arg(dir).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a run directory (no metrics.csv)"));
    let out = routeburn()
        .args(["eval", "--strategy", "greedy", "--checkpoint"])
        .arg(dir)
        .arg("--data")
        .arg(data().join("validation/cvrp10.jsonl"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = routeburn()
        .args(["eval", "--strategy", "beam:3", "--checkpoint"])
        .arg(run)
        .arg("--data")
        .arg(config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    // A corrupt checkpoint names the file (eval reads the run's best one).
    let best = std::fs::read_to_string(run.join("checkpoints/best")).unwrap();
    let ckpt = run.join("checkpoints").join(best).join("model.bpk");
    std::fs::write(&ckpt, b"not a burnpack").unwrap();
    let out = routeburn()
        .args(["eval", "--checkpoint"])
        .arg(run)
        .arg("--data")
        .arg(data().join("validation/cvrp10.jsonl"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("model.bpk"));
}

/// The pointer network through the same commands: `train --model ptrnet` (the old name of
/// `pointer`, still accepted) labels its instances, trains, and its checkpoint evaluates and solves like the attention model's.
#[test]
fn pointer_network_train_eval_solve() {
    let dir = tmp("ptrnet");
    let config = dir.join("tiny_ptrnet.toml");
    std::fs::write(
        &config,
        "[problem]\nn = 10\n[model]\nhidden_dim = 16\n\
[training]\nepochs = 2\nbatch_size = 16\nlr = 1e-3\n\
[supervised]\nlabels = 32\nheuristic_rounds = 10\n\
[validation]\nfile = \"data/validation/cvrp10.jsonl\"\n[logging]\nprogress = false\n",
    )
    .unwrap();
    let run = dir.join("run");
    let out = routeburn()
        .current_dir(data().parent().unwrap())
        .args(["train", "--model", "ptrnet", "--config"])
        .arg(&config)
        .arg("--run-dir")
        .arg(&run)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("labelled 32 instances"), "{stderr}");
    assert!(stderr.contains("gap"), "{stderr}");
    let labels = routeburn_data::read_jsonl(run.join("labels.jsonl")).unwrap();
    assert_eq!(labels.len(), 32);
    let resolved = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(resolved.contains("kind = \"pointer\""), "{resolved}");
    assert!(resolved.contains("hidden_dim = 16"), "{resolved}");

    for strategy in ["greedy", "sample:2", "multistart+aug8"] {
        let out = routeburn()
            .args(["eval", "--strategy", strategy, "--checkpoint"])
            .arg(&run)
            .arg("--data")
            .arg(data().join("validation/cvrp10.jsonl"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{strategy}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    solve_greedy_and_check(&run, "P/P-n16-k8", &dir.join("sols"));

    // `eval` of the run refused with exit status 2; its stderr.
    let refused = |extra: &[&str]| {
        let val = data().join("validation/cvrp10.jsonl");
        let out = eval_checkpoint_with(&run, &val, None, extra);
        assert_eq!(out.status.code(), Some(2));
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // The pointer network has no split products: an error, not a silent no-op.
    let stderr = refused(&["--matmul-precision", "highest"]);
    assert!(
        stderr.contains("--matmul-precision highest") && stderr.contains("pointer network"),
        "{stderr}"
    );

    // An attention-model config pointed at the pointer network's checkpoint: an error that
    // names the file, not a panic.
    let ckpt_config = run.join("config.toml");
    std::fs::write(&ckpt_config, attention_model_section(&resolved)).unwrap();
    let stderr = refused(&[]);
    assert!(
        stderr.contains("model.bpk") && stderr.contains("attention"),
        "{stderr}"
    );
    std::fs::write(&ckpt_config, &resolved).unwrap();

    // Kool's format holds his attention model only: a clear refusal, nothing written.
    let out = export_to(&run, &dir.join("export"), &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("pointer network"), "{stderr}");
    assert!(!dir.join("export").exists());
    std::fs::remove_dir_all(&dir).ok();
}

/// `config` with its `[model]` section replaced by the attention model's defaults.
fn attention_model_section(config: &str) -> String {
    let start = config.find("[model]").unwrap();
    let end = start + config[start..].find("\n[").unwrap();
    format!(
        "{}[model]\nkind = \"attention\"\n{}",
        &config[..start],
        &config[end + 1..]
    )
}

/// `compare-backends` with the default backend twice: the same seed, weights and inputs
/// on the same backend must agree exactly, step by step.
#[test]
fn compare_backends_same_backend_agrees_exactly() {
    let dir = tmp("compare");
    let config = dir.join("tiny.toml");
    std::fs::write(
        &config,
        "[problem]\nn = 8\n[model]\nembed_dim = 16\nnum_heads = 2\nnum_layers = 1\nfeed_forward_dim = 32\n\
[training]\nepochs = 1\nbatch_size = 16\nlr = 1e-3\n[reinforce]\nbatches_per_epoch = 2\n\
[validation]\nsize = 16\n",
    )
    .unwrap();
    let default = routeburn_model::Backend::first_on_host().unwrap().name();
    // compare-backends with `default` twice; its table, after asserting success.
    let compare_with_itself = |args: &[&std::ffi::OsStr]| -> String {
        let out = routeburn()
            .arg("compare-backends")
            .arg("--backends")
            .arg(format!("{default},{default}"))
            .args(args)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(
            out.status.success(),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        stdout
    };
    let os = |s: &'static str| std::ffi::OsStr::new(s);
    let stdout = compare_with_itself(&[
        os("--steps"),
        os("3"),
        os("--agreement-instances"),
        os("32"),
        os("--config"),
        config.as_os_str(),
    ]);
    let rows: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with(&format!("| {default} |")))
        .collect();
    assert_eq!(rows.len(), 2, "{stdout}");
    assert!(
        rows[1].contains("| 0.00e0 | 0.00e0 | 0 | ok"),
        "{}",
        rows[1]
    );
    // The loss curves: three steps, both columns identical.
    let steps: Vec<&str> = stdout
        .lines()
        .filter(|l| l.starts_with("| 1 |") || l.starts_with("| 2 |") || l.starts_with("| 3 |"))
        .collect();
    assert_eq!(steps.len(), 3, "{stdout}");
    for line in steps {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        assert_eq!(cells[2], cells[3], "{line}");
    }

    // A trained model (Kool's CVRP20, a `.pt`): its config (n = 20) and weights on both,
    // its products at `highest` (the same as `high` on a CPU backend).
    let kool = data().join("kool-pretrained/cvrp_20/epoch-99.pt");
    let stdout = compare_with_itself(&[
        os("--steps"),
        os("1"),
        os("--agreement-instances"),
        os("16"),
        os("--checkpoint"),
        kool.as_os_str(),
        os("--matmul-precision"),
        os("highest"),
    ]);
    assert!(stdout.contains("n = 20, batch 512"), "{stdout}");
    assert!(stdout.contains("matmul precision highest"), "{stdout}");
    assert!(stdout.contains("| 0.00e0 | 0.00e0 | 0 | ok"), "{stdout}");

    std::fs::remove_dir_all(&dir).ok();
}

/// `compare-backends` refuses bad flags with exit status 2 and a message saying why.
#[test]
fn compare_backends_refuses_bad_flags() {
    let refusals: [(&[&str], &str); 7] = [
        (
            &["--checkpoint", "a.pt", "--config", "b.toml"],
            "cannot be used with",
        ),
        (&["--steps", "0"], "--steps must be at least 1"),
        (
            &["--matmul-precision", "fastest"],
            "invalid value 'fastest' for '--matmul-precision",
        ),
        (
            &["--backends", "tpu"],
            "invalid value 'tpu' for '--backends <BACKENDS>'",
        ),
        // The CPU backends compile nothing: counting needs cuda or cpu (CubeCL) compiled in.
        (
            &["--count-compiles", "--steps", "3"],
            "no CubeCL backend (cuda, cpu)",
        ),
        (
            &["--count-compiles", "--steps", "2"],
            "needs --steps 3 or more",
        ),
        // Asking for a backend this binary lacks names the feature to build with.
        (
            &["--backends", "cpu", "--no-kernel-cache"],
            "--features cpu",
        ),
    ];
    for (args, message) in refusals {
        let out = routeburn()
            .arg("compare-backends")
            .args(args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(message), "{args:?}: {stderr}");
    }
}

/// `solve` (greedy) one CVRPLIB instance (`SET/NAME`) with `checkpoint`, then `check` the
/// written solution: both must succeed.
fn solve_greedy_and_check(checkpoint: &Path, instance: &str, sols: &Path) {
    let vrp = data().join(format!("cvrplib/{instance}.vrp"));
    let out = routeburn()
        .args(["solve", "--strategy", "greedy", "--checkpoint"])
        .arg(checkpoint)
        .arg("--out-dir")
        .arg(sols)
        .arg(&vrp)
        .output()
        .unwrap();
    assert_success(&out);
    let name = instance.rsplit('/').next().unwrap();
    let check = routeburn()
        .arg("check")
        .arg(&vrp)
        .arg(sols.join(format!("{name}.sol")))
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "{}",
        String::from_utf8_lossy(&check.stdout)
    );
}

fn stdout_value(out: &std::process::Output, key: &str) -> String {
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no `{key}` in {text}"));
    line[key.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// `routeburn eval --checkpoint CHECKPOINT --data DATA [--out CSV]` (greedy).
fn eval_checkpoint(checkpoint: &Path, data: &Path, csv: Option<&Path>) -> std::process::Output {
    eval_checkpoint_with(checkpoint, data, csv, &[])
}

/// [`eval_checkpoint`] with `extra` flags.
fn eval_checkpoint_with(
    checkpoint: &Path,
    data: &Path,
    csv: Option<&Path>,
    extra: &[&str],
) -> std::process::Output {
    let mut cmd = routeburn();
    cmd.arg("eval")
        .args(extra)
        .arg("--checkpoint")
        .arg(checkpoint)
        .arg("--data")
        .arg(data);
    if let Some(csv) = csv {
        cmd.arg("--out").arg(csv);
    }
    cmd.output().unwrap()
}

/// The `tour` column of `eval --out`'s CSV, one action list per instance.
fn csv_tours(csv: &Path) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(csv).unwrap();
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap().split(',').collect();
    let column = header
        .iter()
        .position(|&c| c == "tour")
        .expect("a tour column");
    lines
        .map(|line| {
            let cell = line.split(',').nth(column).unwrap();
            cell.split(' ').map(|a| a.parse().unwrap()).collect()
        })
        .collect()
}

/// The `actions` of each line of a JSONL file of tours (Kool's and rl4co's decodes).
fn jsonl_actions(path: &Path) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .map(|line| {
            let value: serde_json::Value = serde_json::from_str(line).unwrap();
            let actions = value["actions"].as_array().unwrap();
            actions.iter().map(|a| a.as_u64().unwrap() as u32).collect()
        })
        .collect()
}

/// `routeburn import CHECKPOINT --out RUN`.
fn import_to(checkpoint: &Path, run: &Path) -> std::process::Output {
    routeburn()
        .arg("import")
        .arg(checkpoint)
        .arg("--out")
        .arg(run)
        .output()
        .unwrap()
}

/// `routeburn export --checkpoint CHECKPOINT --out DIR` with `extra` flags.
fn export_to(checkpoint: &Path, dir: &Path, extra: &[&str]) -> std::process::Output {
    routeburn()
        .arg("export")
        .args(extra)
        .arg("--checkpoint")
        .arg(checkpoint)
        .arg("--out")
        .arg(dir)
        .output()
        .unwrap()
}

/// Kool's published CVRP20 model: evaluated straight from the `.pt`, imported into a run
/// directory (the same gap), solved, and fine-tuned with `--init-from`, whose validation
/// of the starting weights equals the imported model's.
#[test]
fn kool_checkpoint_import_eval_solve_init_from() {
    let dir = tmp("kool");
    let pt = data().join("kool-pretrained/cvrp_20/epoch-99.pt");
    let val = data().join("validation/cvrp20.jsonl");
    let eval = |checkpoint: &Path| {
        let out = eval_checkpoint(checkpoint, &val, None);
        assert_success(&out);
        out
    };
    let csv = dir.join("k20.csv");
    let direct = eval_checkpoint(&pt, &val, Some(&csv));
    assert_success(&direct);
    // Kool's own greedy decode of this set: 4.92% (data/kool-pretrained).
    assert_eq!(stdout_value(&direct, "mean gap"), "4.921%");
    // --out's tours are his code's tours, but for at most 1% of rounding-decided ties
    // (the import tests' allowance).
    let ours = csv_tours(&csv);
    let kool =
        jsonl_actions(&data().join("kool-pretrained/cvrp_20/greedy-validation-cvrp20.jsonl"));
    assert_eq!(ours.len(), kool.len());
    let same = ours.iter().zip(&kool).filter(|(a, b)| a == b).count();
    assert!(
        same * 100 >= 99 * kool.len(),
        "{same} of {} tours are Kool's",
        kool.len()
    );
    // At `highest` (products split in three for CUDA's tensor cores; the same as `high`
    // on the CPU backends, whose products are exact) the same solutions.
    let highest = eval_checkpoint_with(&pt, &val, None, &["--matmul-precision", "highest"]);
    assert_success(&highest);
    assert_eq!(
        stdout_value(&highest, "mean cost"),
        stdout_value(&direct, "mean cost")
    );

    let run = dir.join("k20");
    let out = import_to(&pt, &run);
    assert_success(&out);
    let imported = eval(&run);
    assert_eq!(
        stdout_value(&imported, "mean cost"),
        stdout_value(&direct, "mean cost")
    );
    // Importing over a run is refused.
    let again = import_to(&pt, &run);
    assert_eq!(again.status.code(), Some(2));

    exports_back_to_kools_format(&run, &dir, &ours);
    solve_greedy_and_check(&pt, "A/A-n32-k5", &dir.join("sols"));
    let mean: f64 = stdout_value(&direct, "mean cost").parse().unwrap();
    fine_tunes_from_the_imported_run(&run, &dir, mean);
    std::fs::remove_dir_all(&dir).ok();
}

/// Exported back to Kool's format (his file's tensors again: the export's unit tests),
/// the file decodes his code's tours as the import did, and nothing needs a warning.
fn exports_back_to_kools_format(run: &Path, dir: &Path, ours: &[Vec<u32>]) {
    let val = data().join("validation/cvrp20.jsonl");
    let export = dir.join("k20-export");
    let out = export_to(run, &export, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("warning"), "{stderr}");
    let exported_csv = dir.join("export.csv");
    let exported = eval_checkpoint(&export.join("epoch-0.pt"), &val, Some(&exported_csv));
    assert!(exported.status.success());
    assert_eq!(csv_tours(&exported_csv), ours);
    // A directory that holds a Kool checkpoint already is not written into.
    let before = std::fs::read(export.join("epoch-0.pt")).unwrap();
    let out = export_to(run, &export, &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("export into a new directory"), "{stderr}");
    assert_eq!(std::fs::read(export.join("epoch-0.pt")).unwrap(), before);
    let out = export_to(run, &dir.join("model.pt"), &[]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("names a directory"), "{stderr}");
}

/// `--init-from` the imported run: its validation of the starting weights is the imported
/// model's (`mean`, the gap 4.92%), and the resolved config keeps Kool's load arithmetic.
fn fine_tunes_from_the_imported_run(run: &Path, dir: &Path, mean: f64) {
    let val = data().join("validation/cvrp20.jsonl");
    let config = dir.join("finetune.toml");
    std::fs::write(
        &config,
        format!(
            "[problem]\nn = 20\n[training]\nepochs = 1\nbatch_size = 16\nlr = 1e-5\n\
[reinforce]\nbatches_per_epoch = 2\nbaseline = \"exponential\"\n\
[validation]\nfile = \"{}\"\n[logging]\nprogress = false\n",
            val.display()
        ),
    )
    .unwrap();
    let stderr = fine_tune(&config, run, &dir.join("finetune"));
    assert!(
        stderr.contains(&format!("initial weights: val {mean:.4} (gap 4.92%)")),
        "{stderr}"
    );
    let resolved = std::fs::read_to_string(dir.join("finetune/config.toml")).unwrap();
    assert!(
        resolved.contains("load_arithmetic = \"float32\""),
        "{resolved}"
    );
    fine_tunes_with_exact_loads(run, dir, &config);
}

/// A config that states `model.load_arithmetic = "exact"` keeps it over the imported
/// model's float32: the starting weights validate as the imported run does when its own
/// config is switched to exact loads, which decode other tours than Kool's code.
fn fine_tunes_with_exact_loads(run: &Path, dir: &Path, float32_config: &Path) {
    let config = dir.join("finetune-exact.toml");
    let text = std::fs::read_to_string(float32_config).unwrap();
    std::fs::write(
        &config,
        format!("[model]\nload_arithmetic = \"exact\"\n{text}"),
    )
    .unwrap();
    let stderr = fine_tune(&config, run, &dir.join("finetune-exact"));
    assert!(
        stderr.contains("keeping its load_arithmetic = \"exact\""),
        "{stderr}"
    );
    let resolved = std::fs::read_to_string(dir.join("finetune-exact/config.toml")).unwrap();
    assert!(
        resolved.contains("load_arithmetic = \"exact\""),
        "{resolved}"
    );
    // The imported run with exact loads, evaluated as a run directory.
    let exact_run = dir.join("k20-exact");
    copy_tree(run, &exact_run);
    let imported = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        imported.contains("load_arithmetic = \"float32\""),
        "{imported}"
    );
    std::fs::write(
        exact_run.join("config.toml"),
        imported.replace(
            "load_arithmetic = \"float32\"",
            "load_arithmetic = \"exact\"",
        ),
    )
    .unwrap();
    let eval = eval_checkpoint(&exact_run, &data().join("validation/cvrp20.jsonl"), None);
    assert_success(&eval);
    let mean: f64 = stdout_value(&eval, "mean cost").parse().unwrap();
    let gap = stdout_value(&eval, "mean gap");
    assert_ne!(gap, "4.921%", "exact loads decode some other tours");
    assert!(
        stderr.contains(&format!("initial weights: val {mean:.4} (gap")),
        "{stderr}"
    );
}

/// `train --config config --init-from run --run-dir run_dir`, which must succeed; its
/// stderr.
fn fine_tune(config: &Path, run: &Path, run_dir: &Path) -> String {
    let out = routeburn()
        .args(["train", "--config"])
        .arg(config)
        .arg("--init-from")
        .arg(run)
        .arg("--run-dir")
        .arg(run_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    stderr
}

/// Copies the files under `from` into `to`, directories included.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        match entry.file_type().unwrap().is_dir() {
            true => copy_tree(&entry.path(), &target),
            false => {
                std::fs::copy(entry.path(), target).unwrap();
            }
        }
    }
}

const TINY_RUN: &str = "[problem]\nn = 6\n[model]\nembed_dim = 16\nnum_heads = 2\nnum_layers = 1\nfeed_forward_dim = 32\n\
[training]\nepochs = 2\nbatch_size = 16\nlr = 1e-3\nseed = 3\n\
[reinforce]\nbatches_per_epoch = 5\nbaseline = \"rollout\"\nbaseline_eval_size = 32\n\
[validation]\nsize = 32\n[logging]\nprogress = false\n";

/// `metrics.csv` without its wall-time columns.
fn metric_numbers(run: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    text.lines()
        .map(|l| l.split(',').take(9).collect::<Vec<_>>().join(","))
        .collect()
}

/// Every parameter value of a run's latest checkpoint.
fn run_weights(run: &Path) -> Vec<f32> {
    use burn::module::{Module, ModuleVisitor, Param};
    use burn::tensor::Tensor;
    use routeburn_trainer::config::{Config, ModelConfig};
    struct Collect(Vec<f32>);
    impl ModuleVisitor for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0
                .extend(param.val().into_data().try_into_vec_as::<f32>().unwrap());
        }
    }
    let config = Config::load_run(&run.join("config.toml")).unwrap();
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    let file = run
        .join("checkpoints")
        .join(latest.trim())
        .join("model.bpk");
    let device = routeburn_model::Backend::first_on_host()
        .unwrap()
        .device()
        .unwrap();
    let mut c = Collect(vec![]);
    match &config.model {
        ModelConfig::Attention(a) => a.model_config().init(&device).load_file(file).visit(&mut c),
        ModelConfig::Pointer(p) => p.model_config().init(&device).load_file(file).visit(&mut c),
    }
    c.0
}

fn train_run(config: &Path, run: &Path, env: &[(&str, &str)]) -> std::process::Output {
    routeburn()
        .args(["train", "--config"])
        .arg(config)
        .arg("--run-dir")
        .arg(run)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

fn resume(run: &Path, extra: &[&str]) -> std::process::Output {
    routeburn()
        .args(["train", "--resume"])
        .arg(run)
        .args(extra)
        .output()
        .unwrap()
}

/// SIGINT and SIGTERM (through the real handlers, raised after the 7th of 10 steps) stop
/// the run with 130/143 and a checkpoint of the epoch in progress; resuming ends with the
/// metrics and weights of an uninterrupted run. A second Ctrl-C exits at once.
#[test]
fn interrupted_runs_resume_exactly() {
    let dir = tmp("signals");
    let config = dir.join("tiny.toml");
    std::fs::write(&config, TINY_RUN).unwrap();
    let whole = dir.join("whole");
    assert!(train_run(&config, &whole, &[]).status.success());

    for (signals, code) in [("INT", 130), ("TERM", 143)] {
        let run = dir.join(format!("run-{signals}"));
        let out = train_run(
            &config,
            &run,
            &[
                ("ROUTEBURN_RAISE_AFTER_STEPS", "7"),
                ("ROUTEBURN_RAISE_SIGNALS", signals),
            ],
        );
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{stderr}");
        assert!(
            stderr.contains("epoch 2, batch 2")
                && stderr.contains("Resume with: routeburn train --resume"),
            "{stderr}"
        );
        let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
        assert_eq!(latest, "epoch-0001-step-000002");
        let out = resume(&run, &[]);
        assert_success(&out);
        assert_eq!(
            metric_numbers(&run),
            metric_numbers(&whole),
            "{signals}: metrics"
        );
        assert_eq!(run_weights(&run), run_weights(&whole), "{signals}: weights");
    }

    // A second Ctrl-C: no checkpoint of the epoch in progress, the last one stays.
    let run = dir.join("run-twice");
    let out = train_run(
        &config,
        &run,
        &[
            ("ROUTEBURN_RAISE_AFTER_STEPS", "7"),
            ("ROUTEBURN_RAISE_SIGNALS", "INT,INT"),
        ],
    );
    assert_eq!(out.status.code(), Some(130));
    let latest = std::fs::read_to_string(run.join("checkpoints/latest")).unwrap();
    assert_eq!(latest, "epoch-0001");
    assert!(resume(&run, &[]).status.success());
    assert_eq!(metric_numbers(&run), metric_numbers(&whole));

    // Resuming a finished run says so, trains nothing and keeps its metrics.
    let out = resume(&run, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            && stderr.contains("has finished its training (epochs = 2): nothing to do"),
        "{stderr}"
    );
    assert_eq!(metric_numbers(&run), metric_numbers(&whole));
    std::fs::remove_dir_all(&dir).ok();
}

/// Supervised training stopped by SIGINT abandons the epoch in progress and, resumed,
/// redoes it: the metrics and weights of an uninterrupted run.
#[test]
fn interrupted_supervised_epochs_are_redone() {
    let dir = tmp("signals-supervised");
    let pointer = dir.join("pointer.toml");
    std::fs::write(
        &pointer,
        "[problem]\nn = 6\n[model]\nkind = \"pointer\"\nhidden_dim = 16\n\
[training]\nepochs = 2\nbatch_size = 16\nlr = 1e-3\nseed = 3\n\
[supervised]\nlabels = 32\nheuristic_rounds = 5\n[validation]\nsize = 32\n[logging]\nprogress = false\n",
    )
    .unwrap();
    let (whole_pointer, run) = (dir.join("pointer-whole"), dir.join("pointer-run"));
    assert!(train_run(&pointer, &whole_pointer, &[]).status.success());
    let out = train_run(&pointer, &run, &[("ROUTEBURN_RAISE_AFTER_STEPS", "3")]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(130), "{stderr}");
    assert!(
        stderr.contains("epoch 2 abandoned after 1 batches"),
        "{stderr}"
    );
    assert!(resume(&run, &[]).status.success());
    assert_eq!(metric_numbers(&run), metric_numbers(&whole_pointer));
    assert_eq!(run_weights(&run), run_weights(&whole_pointer));
    std::fs::remove_dir_all(&dir).ok();
}

/// A second `train` on a run directory another process is training is refused, naming the
/// directory and the process; the lock of a killed process does not block a resume; a new
/// run is not started in an existing run's directory.
#[test]
fn one_writer_per_run_directory() {
    let dir = tmp("lock");
    let config = dir.join("long.toml");
    std::fs::write(&config, TINY_RUN.replace("epochs = 2", "epochs = 500")).unwrap();
    let run = dir.join("run");
    let mut first = routeburn()
        .args(["train", "-q", "--config"])
        .arg(&config)
        .arg("--run-dir")
        .arg(&run)
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !run.join("checkpoints/latest").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "no checkpoint after 120 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let second = resume(&run, &[]);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!("another routeburn process (pid {})", first.id()))
            && stderr.contains(&run.display().to_string()),
        "{stderr}"
    );
    first.kill().unwrap(); // SIGKILL: no handler runs, the lock file stays behind
    first.wait().unwrap();
    assert!(run.join("train.lock").exists());
    let out = resume(&run, &["--epochs", "3"]);
    assert_success(&out);
    // A new run in the finished run's directory is refused; the run is kept as it was.
    let metrics = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let out = train_run(&config, &run, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.code() == Some(2)
            && stderr.contains("already a run directory")
            && stderr.contains("--resume"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(run.join("metrics.csv")).unwrap(),
        metrics
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A write error while checkpointing (a file-size limit standing in for a full disk) is a
/// clear error and the previous checkpoint still resumes; a damaged checkpoint is an error
/// naming its file, and `--resume-from` picks an earlier one.
#[test]
fn failed_writes_and_damaged_checkpoints_lose_nothing() {
    let dir = tmp("disk");
    let config = dir.join("tiny.toml");
    std::fs::write(&config, TINY_RUN.replace("epochs = 2", "epochs = 1")).unwrap();
    let run = dir.join("run");
    assert!(train_run(&config, &run, &[]).status.success());
    // Epoch 2's checkpoint needs more than 4 KiB per file.
    let out = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -f 8; exec {} train --resume {} --epochs 2",
            env!("CARGO_BIN_EXE_routeburn"),
            run.display()
        ))
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(".bpk") && stderr.contains("File too large"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(run.join("checkpoints/latest")).unwrap(),
        "epoch-0001"
    );
    let names: Vec<_> = std::fs::read_dir(run.join("checkpoints"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(
        names.iter().all(|n| !n.to_string_lossy().contains("tmp")),
        "{names:?}"
    );
    let out = resume(&run, &["--epochs", "2"]);
    assert_success(&out);

    // Truncate epoch 2's model: resuming names the file; --resume-from goes back.
    let model = run.join("checkpoints/epoch-0002/model.bpk");
    let bytes = std::fs::read(&model).unwrap();
    std::fs::write(&model, &bytes[..bytes.len() / 2]).unwrap();
    let out = resume(&run, &["--epochs", "3"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("epoch-0002/model.bpk"), "{stderr}");
    let out = resume(&run, &["--epochs", "3", "--resume-from", "epoch-0001"]);
    assert_success(&out);
    let out = resume(&run, &["--resume-from", "epoch-0042"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no checkpoint `epoch-0042`"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

/// Every enumerated flag lists its values in `--help` and answers a typo with a suggestion.
#[test]
fn enumerated_flags_suggest_the_value_meant() {
    for (args, meant) in [
        (vec!["train", "--backend", "flx"], "'flex'"),
        (vec!["train", "--model", "atention"], "'attention'"),
        (
            vec![
                "solve",
                "--metric",
                "cvrplb",
                "--out-dir",
                "x",
                "y.vrp",
                "--checkpoint",
                "z",
            ],
            "'cvrplib'",
        ),
        (
            vec![
                "gen", "--n", "5", "--count", "1", "--format", "jsnl", "--out", "x",
            ],
            "'jsonl'",
        ),
        (
            vec![
                "eval",
                "--checkpoint",
                "x",
                "--data",
                "y",
                "--strategy",
                "multistrat",
            ],
            "`multistart`",
        ),
    ] {
        let out = routeburn().args(&args).output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(meant), "{args:?}: {stderr}");
    }
    for (command, values) in [
        ("train", "[possible values: ndarray, flex, cuda, cpu]"),
        ("train", "- attention: The attention model"),
        ("solve", "[possible values: cvrplib, exact]"),
        ("eval", "greedy, sample:K, multistart, aug8"),
    ] {
        let out = routeburn().args([command, "--help"]).output().unwrap();
        let help = String::from_utf8_lossy(&out.stdout);
        assert!(help.contains(values), "{command}: {help}");
    }
}

/// Rows of `metrics.csv` as (epoch, val_cost, elapsed_seconds).
fn metric_rows(run: &Path) -> Vec<(usize, f64, f64)> {
    let text = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    text.lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (
                f[0].parse().unwrap(),
                f[6].parse().unwrap(),
                f[11].parse().unwrap(),
            )
        })
        .collect()
}

/// A time limit ends the run by itself (validated, checkpointed), a resume counts the time
/// already spent, and the best validation is kept as `checkpoints/best`, which `eval`
/// takes by default.
#[test]
fn time_limits_and_the_best_checkpoint() {
    let dir = tmp("budget");
    let config = dir.join("budget.toml");
    std::fs::write(
        &config,
        TINY_RUN
            .replace("epochs = 2", "epochs = 500\ntime_limit = \"2s\"")
            .replace("batches_per_epoch = 5", "batches_per_epoch = 4"),
    )
    .unwrap();
    let run = dir.join("run");
    let out = train_run(&config, &run, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("time limit 2s reached"), "{stderr}");
    let rows = metric_rows(&run);
    assert!(rows.len() < 500, "the limit was ignored");
    let spent = rows.last().unwrap().2;
    assert!((1.5..10.0).contains(&spent), "stopped after {spent} s");

    // The best validation so far is the one `best` names, and eval takes it.
    let best_epoch = rows.iter().min_by(|a, b| a.1.total_cmp(&b.1)).unwrap().0;
    let best = std::fs::read_to_string(run.join("checkpoints/best")).unwrap();
    assert!(best.starts_with("best-epoch-"), "{best}");
    let state =
        std::fs::read_to_string(run.join("checkpoints").join(&best).join("state.json")).unwrap();
    assert!(
        state.contains(&format!("\"epoch\": {best_epoch},")),
        "{best}: {state}"
    );
    let eval = |checkpoint: &Path| {
        let out = routeburn()
            .args(["eval", "--data"])
            .arg(
                data()
                    .join("validation/cvrp10.jsonl")
                    .parent()
                    .unwrap()
                    .join("cvrp10.jsonl"),
            )
            .arg("--checkpoint")
            .arg(checkpoint)
            .output()
            .unwrap();
        assert_success(&out);
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let said = eval(&run);
    assert!(
        said.contains(&format!("the run's best: epoch {best_epoch},")),
        "{said}"
    );
    let said = eval(&run.join("checkpoints/latest"));
    assert!(said.contains("(after "), "{said}");

    // Resuming with the same budget: nothing left to train.
    let out = resume(&run, &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("already reached"),
        "{stderr}"
    );
    assert_eq!(metric_rows(&run).len(), rows.len());
    // A larger budget continues where the time ran out, counting the time already spent.
    let out = resume(&run, &["--time-limit", "4s"]);
    assert_success(&out);
    let more = metric_rows(&run);
    assert!(more.len() > rows.len());
    let spent = more.last().unwrap().2;
    assert!(
        (3.5..6.5).contains(&spent),
        "stopped after {spent} s in all"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// rl4co's AttentionModel (the extracted fixture): `eval` straight from the `.ckpt` gives
/// rl4co's own mean greedy cost; `import` writes a run with `attention_bias` that
/// evaluates the same; Lightning's own file is refused with the extraction command.
#[test]
fn rl4co_checkpoint_eval_and_import() {
    let dir = tmp("rl4co");
    let ckpt = data().join("rl4co/am-cvrp20.ckpt");
    let val = data().join("validation/cvrp20.jsonl");
    let rl4co: Vec<f64> = std::fs::read_to_string(data().join("rl4co/greedy-cvrp20.jsonl"))
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["cost"]
                .as_f64()
                .unwrap()
        })
        .collect();
    let expected = rl4co.iter().sum::<f64>() / rl4co.len() as f64;
    let eval = |checkpoint: &Path| {
        let out = eval_checkpoint(checkpoint, &val, None);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        (out, stderr)
    };
    // rl4co's costs are float32 sums; routeburn's evaluator is exact.
    let close = |out: &std::process::Output| {
        let mean: f64 = stdout_value(out, "mean cost").parse().unwrap();
        assert!(
            (mean - expected).abs() < 1e-4 * expected,
            "{mean} vs rl4co's {expected}"
        );
    };
    let (direct, stderr) = eval(&ckpt);
    assert!(direct.status.success(), "{stderr}");
    close(&direct);

    let run = dir.join("am");
    let out = import_to(&ckpt, &run);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.contains("[problem] n = 20"),
        "{stderr}"
    );
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(config.contains("attention_bias = true"), "{config}");
    let (imported, _) = eval(&run);
    assert_eq!(
        stdout_value(&imported, "mean cost"),
        stdout_value(&direct, "mean cost")
    );

    // Exported back to rl4co's form (the fixture's tensors again: the export's unit
    // tests), the file decodes rl4co's own greedy tours.
    let export = dir.join("am-export");
    let out = export_to(&run, &export, &["--format", "rl4co"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("AttentionModelPolicy"), "{stderr}");
    let csv = dir.join("export.csv");
    let exported = eval_checkpoint(&export.join("policy.ckpt"), &val, Some(&csv));
    assert!(exported.status.success());
    close(&exported);
    let ours = csv_tours(&csv);
    let theirs = jsonl_actions(&data().join("rl4co/greedy-cvrp20.jsonl"));
    assert_eq!(ours, theirs);

    let (lightning, stderr) = eval(&data().join("rl4co/am-cvrp20-lightning.ckpt"));
    assert_eq!(lightning.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("torch.save({'state_dict'"), "{stderr}");
    std::fs::remove_dir_all(&dir).ok();
}

/// `routeburn train ARGS` run in `cwd`: whether it succeeded, and its stderr.
fn train_in(cwd: &Path, args: &[&std::ffi::OsStr]) -> (bool, String) {
    let out = routeburn()
        .current_dir(cwd)
        .arg("train")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `routeburn train` with the embedded default config works in a directory without the
/// repository's data: it validates on the built-in copy of `data/validation/cvrp10.jsonl`,
/// which gives the numbers `eval` gets from the repository's file.
#[test]
fn runs_start_in_any_working_directory() {
    let dir = tmp("anywhere");
    let run = dir.join("default");
    let (ok, stderr) = train_in(
        &dir,
        &[
            "--epochs".as_ref(),
            "1".as_ref(),
            "--run-dir".as_ref(),
            run.as_os_str(),
        ],
    );
    assert!(
        ok && stderr.contains("using the copy built into routeburn"),
        "{stderr}"
    );
    let row = std::fs::read_to_string(run.join("metrics.csv")).unwrap();
    let fields: Vec<String> = row
        .lines()
        .nth(1)
        .unwrap()
        .split(',')
        .map(String::from)
        .collect();
    let (val_cost, val_gap) = (&fields[6], &fields[7]);
    let eval = eval_checkpoint_with(
        &run,
        &data().join("validation/cvrp10.jsonl"),
        None,
        &["--strategy", "multistart"],
    );
    assert!(eval.status.success());
    let cost: f64 = stdout_value(&eval, "mean cost").parse().unwrap();
    assert_eq!(&format!("{cost:.6}"), val_cost);
    let gap: f64 = stdout_value(&eval, "mean gap")
        .trim_end_matches('%')
        .parse()
        .unwrap();
    let recorded: f64 = val_gap.parse().unwrap();
    assert!(
        (gap - recorded).abs() < 6e-3,
        "eval {gap}% against {recorded}%"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// A run started in the repository with a shipped config resumes from another working
/// directory: its `config.toml` names the validation file by its absolute path.
#[test]
fn runs_resume_in_another_working_directory() {
    let dir = tmp("elsewhere");
    let config = dir.join("tiny.toml");
    let tiny = TINY_RUN
        .replace("[problem]\nn = 6\n", "[problem]\nn = 10\n")
        .replace(
            "[validation]\nsize = 32\n",
            "[validation]\nfile = \"data/validation/cvrp10.jsonl\"\n",
        );
    std::fs::write(&config, tiny).unwrap();
    let run = dir.join("from-repo");
    let (ok, stderr) = train_in(
        &data().join(".."),
        &[
            "--epochs".as_ref(),
            "1".as_ref(),
            "--config".as_ref(),
            config.as_os_str(),
            "--run-dir".as_ref(),
            run.as_os_str(),
        ],
    );
    assert!(ok, "{stderr}");
    let written = std::fs::read_to_string(run.join("config.toml")).unwrap();
    let pinned = std::fs::canonicalize(data().join("validation/cvrp10.jsonl")).unwrap();
    assert!(
        written.contains(&format!("file = \"{}\"", pinned.display())),
        "{written}"
    );
    let (ok, stderr) = train_in(
        &dir,
        &[
            "--epochs".as_ref(),
            "2".as_ref(),
            "--resume".as_ref(),
            run.as_os_str(),
        ],
    );
    assert!(ok && !stderr.contains("built into"), "{stderr}");
    assert_eq!(metric_rows(&run).len(), 2);
    std::fs::remove_dir_all(&dir).ok();
}
