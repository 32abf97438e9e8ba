//! `cargo xtask`: the project's tasks, in Rust so they run wherever cargo does.
//!
//! - `cargo xtask test`: the test suite (`cargo test --workspace`).
//! - `cargo xtask ci`: what `.ci/run` runs (fmt, clippy, tests, CUDA type-check).
//! - `cargo xtask build-cuda`: the CUDA build as a bundle (see `build_cuda.rs`).
//! - `cargo xtask gpu-carry`: the bundle and rl4co's wheels in `.gpu/`, for a lent GPU
//!   machine (see `gpu_carry.rs` and `scripts/on-gpu`).
//! - `cargo xtask test-cpu [filter]`: the CubeCL kernels' tests on CubeCL's CPU runtime,
//!   in `build-cuda`'s environment (see `build_cuda.rs`).
//! - `cargo xtask bench [criterion args]`: every bench, on every CPU backend, then one
//!   table of the results.
//! - `cargo xtask compare-backends [--config FILE] [--steps K]`: builds routeburn with
//!   every CPU backend (and CUDA with `--backend cuda`) and compares them.
//! - `cargo xtask [--backend ndarray|flex|cuda] <routeburn subcommand> ...`: builds
//!   `routeburn` in release mode with that backend's feature and runs it, e.g.
//!   `cargo xtask train --config configs/tiny_1.toml`. With no arguments after `train`, it
//!   trains the embedded default config.

mod build_cuda;
mod gpu_carry;

use std::process::{Command, ExitCode};

const BACKENDS: [&str; 3] = ["ndarray", "flex", "cuda"];

fn main() -> ExitCode {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let backend = match take_backend(&mut args) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("xtask: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(task) = args.first().cloned() else {
        eprintln!("{}", USAGE);
        return ExitCode::from(2);
    };
    let rest = &args[1..];
    let ok = match task.as_str() {
        "test" => cargo(&["test", "--workspace"], rest),
        "ci" => ci(),
        "build-cuda" => match build_cuda::build_cuda(&root()) {
            Ok(archive) => {
                println!("{}", archive.display());
                true
            }
            Err(e) => {
                eprintln!("xtask build-cuda: {e}");
                false
            }
        },
        "gpu-carry" => match gpu_carry::gpu_carry(&root()) {
            Ok(carry) => {
                println!("{}", carry.display());
                true
            }
            Err(e) => {
                eprintln!("xtask gpu-carry: {e}");
                false
            }
        },
        "test-cpu" => match build_cuda::test_cpu(&root(), rest) {
            Ok(()) => true,
            Err(e) => {
                eprintln!("xtask test-cpu: {e}");
                false
            }
        },
        "bench" => bench(rest),
        "help" | "--help" | "-h" => {
            println!("{USAGE}");
            true
        }
        _ => routeburn(backend.as_deref(), &args),
    };
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

const USAGE: &str = "usage: cargo xtask [--backend ndarray|flex|cuda] <task> [args...]

tasks:
  test                 run the test suite (cargo test --workspace)
  ci                   run what CI runs: fmt, clippy, tests, CUDA type-check
  build-cuda           routeburn with CUDA (and the CPU backends), built offline but for the
                       package registries, packed with gpu-check; prints the archive's path
  gpu-carry            the bundle and rl4co's wheels in .gpu/, for a lent GPU machine
                       (scripts/on-gpu runs gpu-check there); prints the folder
  test-cpu [filter]    the CubeCL kernels' tests on CubeCL's CPU runtime, built like build-cuda
  bench [args]         run every criterion bench on every CPU backend, print one table
  compare-backends     same seed, config and weights on every backend: time, memory, agreement
  <routeburn command>  build routeburn in release mode and run it: train, gen, check, ...";

/// The workspace root (xtask's parent directory).
fn root() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Removes `--backend X` / `--backend=X` from `args` and returns X, checked.
fn take_backend(args: &mut Vec<String>) -> Result<Option<String>, String> {
    let mut found = None;
    let mut i = 0;
    while i < args.len() {
        let value = if args[i] == "--backend" {
            if i + 1 >= args.len() {
                return Err("--backend needs a value: ndarray, flex or cuda".into());
            }
            let v = args.remove(i + 1);
            args.remove(i);
            v
        } else if let Some(v) = args[i].strip_prefix("--backend=") {
            let v = v.to_string();
            args.remove(i);
            v
        } else {
            i += 1;
            continue;
        };
        if !BACKENDS.contains(&value.as_str()) {
            return Err(format!(
                "unknown backend `{value}`; expected one of: {}",
                BACKENDS.join(", ")
            ));
        }
        found = Some(value);
    }
    Ok(found)
}

fn run(cmd: &mut Command) -> bool {
    eprintln!("xtask: running {cmd:?}");
    match cmd.status() {
        Ok(s) => s.success(),
        Err(e) => {
            eprintln!("xtask: could not start {cmd:?}: {e}");
            false
        }
    }
}

fn cargo(args: &[&str], rest: &[String]) -> bool {
    run(Command::new(env!("CARGO")).args(args).args(rest))
}

/// Builds routeburn in release mode with the backend's feature and runs it with `args`
/// (the backend is passed on, so the binary uses it).
fn routeburn(backend: Option<&str>, args: &[String]) -> bool {
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args([
        "run",
        "--release",
        "--quiet",
        "--package",
        "routeburn-trainer",
        "--bin",
        "routeburn",
    ]);
    if args[0] == "compare-backends" {
        // Every CPU backend, plus CUDA when asked for with --backend cuda.
        let features = match backend {
            Some("cuda") => "ndarray,flex,cuda",
            _ => "ndarray,flex",
        };
        cmd.args(["--no-default-features", "--features", features]);
    } else if let Some(b) = backend {
        cmd.args(["--no-default-features", "--features", b]);
    }
    cmd.arg("--").args(args);
    if let Some(b) = backend {
        if takes_backend_flag(&args[0]) {
            cmd.args(["--backend", b]);
        }
    }
    run(&mut cmd)
}

fn takes_backend_flag(subcommand: &str) -> bool {
    matches!(subcommand, "train" | "eval" | "solve")
}

fn ci() -> bool {
    run(Command::new("bash").arg(".ci/run"))
}

fn bench(rest: &[String]) -> bool {
    let started = std::time::SystemTime::now();
    // One build with both CPU backends (the same features as `compare-backends`, so the
    // release artifacts are shared); the model benches loop over the compiled backends.
    let ok = run(Command::new(env!("CARGO"))
        .args([
            "bench",
            "--package",
            "routeburn-benches",
            "--no-default-features",
            "--features",
            "ndarray,flex",
        ])
        .arg("--")
        .args(rest));
    print_bench_table(std::path::Path::new("target/criterion"), started);
    ok
}

/// One table of every criterion result written since `since`: mean time, and
/// throughput where the bench declares its element count.
fn print_bench_table(root: &std::path::Path, since: std::time::SystemTime) {
    let mut rows = Vec::new();
    collect_results(root, since, &mut rows);
    if rows.is_empty() {
        eprintln!("xtask: no criterion results under {}", root.display());
        return;
    }
    rows.sort_by(|a, b| a.0.cmp(&b.0));
    println!("\n| bench | mean | throughput |");
    println!("|---|---|---|");
    for (name, mean_ns, elements) in rows {
        let throughput = elements.map_or(String::new(), |e| {
            format!("{:.0} elem/s", e as f64 / (mean_ns * 1e-9))
        });
        println!("| {name} | {} | {throughput} |", human_time(mean_ns));
    }
}

fn collect_results(
    dir: &std::path::Path,
    since: std::time::SystemTime,
    rows: &mut Vec<(String, f64, Option<u64>)>,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if !path.is_dir() {
            continue;
        }
        if path.file_name().is_some_and(|n| n == "new") {
            if let Some(row) = read_result(&path, since) {
                rows.push(row);
            }
        } else {
            collect_results(&path, since, rows);
        }
    }
}

fn read_result(
    dir: &std::path::Path,
    since: std::time::SystemTime,
) -> Option<(String, f64, Option<u64>)> {
    let estimates = dir.join("estimates.json");
    let modified = std::fs::metadata(&estimates).ok()?.modified().ok()?;
    if modified < since {
        return None;
    }
    let read = |p: std::path::PathBuf| -> Option<serde_json::Value> {
        serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok()
    };
    let est = read(estimates)?;
    let bench = read(dir.join("benchmark.json"))?;
    let mean = est["mean"]["point_estimate"].as_f64()?;
    let name = bench["full_id"].as_str()?.to_string();
    let elements = bench["throughput"]["Elements"].as_u64();
    Some((name, mean, elements))
}

fn human_time(ns: f64) -> String {
    if ns >= 1e9 {
        format!("{:.3} s", ns * 1e-9)
    } else if ns >= 1e6 {
        format!("{:.3} ms", ns * 1e-6)
    } else if ns >= 1e3 {
        format!("{:.3} µs", ns * 1e-3)
    } else {
        format!("{ns:.0} ns")
    }
}
