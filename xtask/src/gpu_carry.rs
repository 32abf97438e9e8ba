//! `cargo xtask gpu-carry`: everything a lent GPU machine needs beside the repository, in
//! `.gpu/` (ignored by git, carried by the device tool): the CUDA bundle that `build-cuda`
//! packed, and rl4co's wheels for that machine's Python. `scripts/on-gpu` uses them there.
//!
//! The GPU machine has PyTorch, Lightning and the scientific stack but not rl4co, and it
//! cannot reach a package index; `benches/gpu/rl4co-wheels.txt` pins what it lacks. A
//! device call carries at most 64 MiB with the repository, so the bundle travels packed.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::build_cuda::{bundle_archive, io, run};

/// The GPU machine's Python (device tool, KINDS.md: Python 3.12.3).
const PYTHON_VERSION: &str = "3.12";
/// manylinux tags that Python 3.12 on x86-64 accepts, newest first (pip matches exactly).
const PLATFORMS: [&str; 5] = [
    "manylinux_2_28_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux1_x86_64",
];
/// What one device call may carry: the repository's tracked files and `.gpu/` together.
const CARRY_LIMIT: u64 = 64 << 20;

pub fn gpu_carry(root: &Path) -> Result<PathBuf, String> {
    let archive = bundle_archive(root);
    if !archive.exists() {
        return Err(format!(
            "no CUDA bundle at {}: run `cargo xtask build-cuda` first",
            archive.display()
        ));
    }
    warn_if_stale(root, &archive);
    let carry = root.join(".gpu");
    let _ = std::fs::remove_dir_all(&carry);
    let wheels = carry.join("whl");
    std::fs::create_dir_all(&wheels).map_err(io(&wheels))?;
    let packed = carry.join(archive.file_name().unwrap());
    std::fs::copy(&archive, &packed).map_err(io(&packed))?;
    for requirement in pinned_wheels(root)? {
        fetch_wheel(&requirement, &wheels)?;
    }
    let (tracked, carried) = (tracked_bytes(root)?, dir_bytes(&carry)?);
    eprintln!(
        "gpu-carry: {} ({:.1} MiB) with the repository's tracked files ({:.1} MiB)",
        carry.display(),
        carried as f64 / 1048576.0,
        tracked as f64 / 1048576.0
    );
    if tracked + carried > CARRY_LIMIT {
        return Err(format!(
            "{:.1} MiB would travel, more than a device call carries (64 MiB)",
            (tracked + carried) as f64 / 1048576.0
        ));
    }
    Ok(carry)
}

/// The `name==version` lines of `benches/gpu/rl4co-wheels.txt`.
fn pinned_wheels(root: &Path) -> Result<Vec<String>, String> {
    let list = root.join("benches/gpu/rl4co-wheels.txt");
    let text = std::fs::read_to_string(&list).map_err(io(&list))?;
    let pins: Vec<String> = text
        .lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter(|line| !line.is_empty())
        .map(str::to_string)
        .collect();
    if let Some(bad) = pins.iter().find(|p| !p.contains("==")) {
        return Err(format!(
            "{}: `{bad}` is not pinned (expected name==version)",
            list.display()
        ));
    }
    Ok(pins)
}

/// Downloads one wheel built for the GPU machine's Python; a package published only as a
/// source archive is built into a wheel here, which must then be pure Python to run there.
fn fetch_wheel(requirement: &str, wheels: &Path) -> Result<(), String> {
    let mut download = Command::new("python3");
    download
        .args([
            "-m",
            "pip",
            "download",
            "-q",
            "--no-deps",
            "--only-binary=:all:",
        ])
        .args(["--python-version", PYTHON_VERSION, "--implementation", "cp"]);
    for platform in PLATFORMS {
        download.args(["--platform", platform]);
    }
    download.arg("-d").arg(wheels).arg(requirement);
    if run(&mut download, "pip download").is_ok() {
        return Ok(());
    }
    eprintln!("gpu-carry: no wheel of {requirement} for Python {PYTHON_VERSION}: building one from its source archive");
    let before = wheel_names(wheels)?;
    run(
        Command::new("python3")
            .args(["-m", "pip", "wheel", "-q", "--no-deps", "-w"])
            .arg(wheels)
            .arg(requirement),
        &format!("pip wheel {requirement}"),
    )?;
    let built: Vec<String> = wheel_names(wheels)?
        .into_iter()
        .filter(|w| !before.contains(w))
        .collect();
    match built.as_slice() {
        [wheel] if wheel.ends_with("-py3-none-any.whl") => Ok(()),
        _ => Err(format!(
            "{requirement}: built {built:?}, not one pure-Python wheel; pin a version with a wheel for Python {PYTHON_VERSION}"
        )),
    }
}

fn wheel_names(dir: &Path) -> Result<Vec<String>, String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        names.push(
            entry
                .map_err(io(dir))?
                .file_name()
                .to_string_lossy()
                .into_owned(),
        );
    }
    Ok(names)
}

/// Says so when the bundle is older than the last commit that changed what it compiles.
fn warn_if_stale(root: &Path, archive: &Path) {
    let last_change = Command::new("git")
        .current_dir(root)
        .args([
            "log",
            "-1",
            "--format=%ct",
            "--",
            "crates",
            "Cargo.toml",
            "Cargo.lock",
        ])
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|s| s.trim().parse::<u64>().ok());
    let built = std::fs::metadata(archive)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .map(|d| d.as_secs());
    if let (Some(changed), Some(built)) = (last_change, built) {
        if built < changed {
            eprintln!(
                "gpu-carry: warning: the bundle is older than the last commit to crates/ or Cargo.*; \
                 `cargo xtask build-cuda` measures the current code"
            );
        }
    }
}

/// Bytes of the files git tracks: what travels with every device call.
fn tracked_bytes(root: &Path) -> Result<u64, String> {
    let output = Command::new("git")
        .current_dir(root)
        .args(["ls-files", "-z"])
        .output()
        .map_err(|e| format!("git ls-files: {e}"))?;
    let mut total = 0;
    for name in output.stdout.split(|&b| b == 0).filter(|n| !n.is_empty()) {
        let path = root.join(String::from_utf8_lossy(name).as_ref());
        total += std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    }
    Ok(total)
}

fn dir_bytes(dir: &Path) -> Result<u64, String> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).map_err(io(dir))? {
        let entry = entry.map_err(io(dir))?;
        let meta = entry.metadata().map_err(io(dir))?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}
