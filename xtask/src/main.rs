//! `cargo xtask`: the project's tasks, in Rust so they run wherever cargo does.
//!
//! - `cargo xtask test`: the test suite (`cargo test --workspace`).
//! - `cargo xtask ci`: what `.ci/run` runs (fmt, clippy, tests, CUDA type-check).
//! - `cargo xtask bench [criterion args]`: every bench, on every compiled CPU backend.
//! - `cargo xtask [--backend ndarray|flex|cuda] <routeburn subcommand> ...`: builds
//!   `routeburn` in release mode with that backend's feature and runs it, e.g.
//!   `cargo xtask train --config configs/tiny_1.toml`. With no arguments after `train`, it
//!   trains the embedded default config.

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
  bench [args]         run every criterion bench on every CPU backend
  <routeburn command>  build routeburn in release mode and run it: train, gen, check, ...";

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
    if let Some(b) = backend {
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
    matches!(subcommand, "train" | "eval" | "solve" | "compare-backends")
}

fn ci() -> bool {
    run(Command::new("bash").arg(".ci/run"))
}

fn bench(rest: &[String]) -> bool {
    let mut ok = true;
    for features in ["ndarray", "flex"] {
        ok &= run(Command::new(env!("CARGO"))
            .args([
                "bench",
                "--package",
                "routeburn-benches",
                "--no-default-features",
                "--features",
                features,
            ])
            .arg("--")
            .args(rest));
    }
    ok
}
