//! `cargo xtask build-cuda`: `routeburn` with the CUDA backend (and both CPU backends),
//! built without any download outside the package registries, stripped and packed with
//! the `gpu-check` script into one archive, whose path is printed on the last line.
//!
//! Burn's CUDA backend compiles kernels through LLVM (cubecl-cuda → cubecl-llvm), and the
//! build script of `tracel-llvm-bundler` 23.1.0-4 downloads a prebuilt LLVM unless its
//! install directory, `$XDG_DATA_HOME/tracel/tracel-llvm-23.1.0-4`, already holds the
//! sentinel `.tracel-llvm-installed` (its `src/config.rs`: `llvm_path`, `sentinel_name`;
//! `build.rs`: "Already installed?"). The Python registry has the same LLVM 23.1 as
//! `mlc-llvm-static` (+ `mlc-llvm-static-extra-targets`, which holds NVPTX); both wheels
//! are unzipped into one directory, given the sentinel and linked as that install
//! directory. Its `llvm-config` is a Python script, so `python3` is needed to build.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

const LLVM_WHEELS: [&str; 2] = [
    "mlc-llvm-static==23.1.1.post0",
    "mlc-llvm-static-extra-targets==23.1.1.post0",
];
/// Where `tracel-llvm-bundler` 23.1.0-4 looks for its LLVM, under `$XDG_DATA_HOME`.
const BUNDLER_DIR: &str = "tracel/tracel-llvm-23.1.0-4";
/// cudarc's bindings for a CUDA 13.0 driver (its default, 13.4, needs a newer one).
const CUDA_VERSION: &str = "13000";

/// The features of the bundle's `routeburn-trainer`; `test_cpu` builds with the same
/// ones, so the two share every compiled dependency.
const FEATURES: &str = "cuda,cpu,ndarray";

pub fn build_cuda(root: &Path) -> Result<PathBuf, String> {
    let start = Instant::now();
    eprintln!(
        "build-cuda: building routeburn with cuda, cpu (CubeCL's CPU runtime), flex and ndarray (about an hour on one core)"
    );
    let target_dir = root.join("target/cuda");
    let ok = cargo_with_llvm(root)?
        .args(["build", "--release", "--locked", "-p", "routeburn-trainer"])
        .args(["--features", FEATURES])
        .status()
        .map_err(|e| format!("cargo: {e}"))?
        .success();
    if !ok {
        return Err("the CUDA build failed (see above)".into());
    }
    let bundle = pack(root, &target_dir.join("release/routeburn"), &work_dir(root))?;
    eprintln!(
        "build-cuda: done in {:.1} min",
        start.elapsed().as_secs_f64() / 60.0
    );
    Ok(bundle)
}

/// `cargo xtask test-cpu [filter]`: the model crate's tests (by default those of the
/// CubeCL kernels, `cube`) on CubeCL's CPU runtime, built in the bundle's environment and
/// target directory with its features, so only the model and trainer crates compile again.
/// A `cargo test --features cpu` outside it changes build-script inputs and rebuilds
/// CubeCL's LLVM crates (25 minutes here), and the next `build-cuda` rebuilds them back.
pub fn test_cpu(root: &Path, filter: &[String]) -> Result<(), String> {
    let qualified: Vec<String> = FEATURES
        .split(',')
        .map(|f| format!("routeburn-trainer/{f}"))
        .collect();
    let filter: Vec<String> = if filter.is_empty() {
        vec!["cube".into()]
    } else {
        filter.to_vec()
    };
    // The trainer is selected too (its lib tests filtered out by the same name) so that
    // features unify as in the bundle's build.
    let ok = cargo_with_llvm(root)?
        .args(["test", "--release", "--locked", "--lib"])
        .args(["-p", "routeburn-model", "-p", "routeburn-trainer"])
        .args(["--features", &qualified.join(",")])
        .arg("--")
        .args(&filter)
        .status()
        .map_err(|e| format!("cargo: {e}"))?
        .success();
    if ok {
        Ok(())
    } else {
        Err("tests failed (see above)".into())
    }
}

fn work_dir(root: &Path) -> PathBuf {
    root.join("target/cuda-build")
}

const ARCHIVE: &str = "routeburn-cuda-linux-x64.tar.xz";

/// Where `build-cuda` leaves its archive.
pub(crate) fn bundle_archive(root: &Path) -> PathBuf {
    work_dir(root).join(ARCHIVE)
}

/// `cargo`, in the root, with the LLVM install the bundler looks for, cudarc's CUDA
/// version and the bundle's target directory.
fn cargo_with_llvm(root: &Path) -> Result<Command, String> {
    let work = work_dir(root);
    let llvm = fetch_llvm(&work)?;
    let xdg = work.join("xdg");
    let install = xdg.join(BUNDLER_DIR);
    std::fs::create_dir_all(install.parent().unwrap()).map_err(io(&install))?;
    let _ = std::fs::remove_file(&install);
    std::os::unix::fs::symlink(&llvm, &install).map_err(io(&install))?;
    let mut cargo = Command::new(env!("CARGO"));
    cargo
        .current_dir(root)
        .env("XDG_DATA_HOME", &xdg)
        .env("CUDARC_CUDA_VERSION", CUDA_VERSION)
        .env("CARGO_TARGET_DIR", root.join("target/cuda"));
    Ok(cargo)
}

pub(crate) fn io(path: &Path) -> impl Fn(std::io::Error) -> String + '_ {
    move |e| format!("{}: {e}", path.display())
}

pub(crate) fn run(cmd: &mut Command, what: &str) -> Result<(), String> {
    let status = cmd.status().map_err(|e| format!("{what}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{what} failed ({status})"))
    }
}

/// The LLVM wheels from the Python registry, unzipped into one tree with the sentinel;
/// returns the directory the bundler expects (`…/mlc_llvm_static/static`).
fn fetch_llvm(work: &Path) -> Result<PathBuf, String> {
    let llvm = work.join("llvm/mlc_llvm_static/static");
    let sentinel = llvm.join(".tracel-llvm-installed");
    if sentinel.exists() {
        return Ok(llvm);
    }
    let wheels = work.join("wheels");
    run(
        Command::new("python3")
            .args([
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
            ])
            .arg(&wheels)
            .args(LLVM_WHEELS),
        "pip download of the LLVM wheels (python3 with pip is needed)",
    )?;
    for entry in std::fs::read_dir(&wheels).map_err(io(&wheels))? {
        let wheel = entry.map_err(io(&wheels))?.path();
        if wheel.extension().is_some_and(|e| e == "whl") {
            run(
                Command::new("python3")
                    .args(["-m", "zipfile", "-e"])
                    .arg(&wheel)
                    .arg(work.join("llvm")),
                "unzipping a wheel",
            )?;
        }
    }
    // Zip archives keep no permissions: the tools must run.
    let bin = llvm.join("bin");
    for entry in std::fs::read_dir(&bin).map_err(io(&bin))? {
        let path = entry.map_err(io(&bin))?.path();
        run(Command::new("chmod").arg("+x").arg(&path), "chmod")?;
    }
    std::fs::write(&sentinel, b"").map_err(io(&sentinel))?;
    Ok(llvm)
}

/// `routeburn` (stripped) and `gpu-check` in one `.tar.xz`.
fn pack(root: &Path, binary: &Path, work: &Path) -> Result<PathBuf, String> {
    let dir = work.join("bundle/routeburn-cuda");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(io(&dir))?;
    run(
        Command::new("strip")
            .arg("-o")
            .arg(dir.join("routeburn"))
            .arg(binary),
        "strip",
    )?;
    std::fs::copy(root.join("scripts/gpu-check"), dir.join("gpu-check")).map_err(io(&dir))?;
    let archive = work.join(ARCHIVE);
    run(
        Command::new("tar")
            .arg("-cJf")
            .arg(&archive)
            .arg("-C")
            .arg(&dir)
            .args(["routeburn", "gpu-check"]),
        "tar",
    )?;
    Ok(archive)
}
