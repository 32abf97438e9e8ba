//! The README's quick start, run as a user copies it: its `routeburn` command lines in
//! order, in a fresh directory that holds the repository's `data/` and `configs/` (as a
//! clone does), each exiting 0. Before each command runs, every path it reads must exist:
//! one the repository has or an earlier command wrote. Training runs the embedded default
//! config for a few batches (`--epochs 1 --time-limit 2s` appended) and evaluation a few
//! instances (`--max-rows 16`), so the test takes seconds, not the minute a user waits.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The `routeburn` command lines of the README's "Quick start" section, in order, as
/// words.
fn quick_start() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(repository().join("README.md")).unwrap();
    let section = readme
        .split("\n## ")
        .find(|s| s.starts_with("Quick start"))
        .expect("README.md has a `## Quick start` section");
    let mut in_shell = false;
    let mut commands = Vec::new();
    for line in section.lines() {
        if line.starts_with("```") {
            in_shell = line == "```sh";
            continue;
        }
        let command = line.split(" #").next().unwrap_or("").trim();
        if in_shell && command.starts_with("routeburn ") {
            commands.push(command.split_whitespace().map(String::from).collect());
        }
    }
    commands
}

/// Flags whose value a command writes rather than reads.
const OUTPUT_FLAGS: [&str; 3] = ["--out", "--out-dir", "--run-dir"];

/// The paths `words` reads: every argument that names a file or folder (it has a `/`),
/// except the values of [`OUTPUT_FLAGS`].
fn paths_read(words: &[String]) -> Vec<&str> {
    words
        .iter()
        .enumerate()
        .skip(2)
        .filter(|(i, word)| word.contains('/') && !OUTPUT_FLAGS.contains(&words[i - 1].as_str()))
        .map(|(_, word)| word.as_str())
        .collect()
}

/// What the test adds to a command so that it runs in seconds.
fn shortened(words: &[String]) -> Vec<String> {
    let mut words = words.to_vec();
    match words[1].as_str() {
        "train" => words.extend(["--epochs", "1", "--time-limit", "2s", "-q"].map(String::from)),
        "eval" => words.extend(["--max-rows", "16"].map(String::from)),
        _ => {}
    }
    words
}

/// A fresh directory holding links to the repository's `data/` and `configs/`.
fn clone_like() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("routeburn-quickstart-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for shipped in ["data", "configs"] {
        let target = repository().join(shipped).canonicalize().unwrap();
        std::os::unix::fs::symlink(target, dir.join(shipped)).unwrap();
    }
    dir
}

#[test]
fn the_quick_start_runs_as_written() {
    let commands = quick_start();
    let names: Vec<&str> = commands.iter().map(|c| c[1].as_str()).collect();
    for step in ["train", "eval", "solve", "check", "plot"] {
        assert!(
            names.contains(&step),
            "the quick start runs `{step}`: {names:?}"
        );
    }
    let dir = clone_like();
    for words in &commands {
        let line = words.join(" ");
        for path in paths_read(words) {
            assert!(
                dir.join(path).exists(),
                "`{line}` reads {path}, which neither the repository has nor an earlier command wrote"
            );
        }
        let words = shortened(words);
        let out = Command::new(env!("CARGO_BIN_EXE_routeburn"))
            .args(&words[1..])
            .current_dir(&dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "`{line}` exited with {}:\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        if words[1] == "check" {
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(stdout.starts_with("cost "), "`{line}` printed {stdout}");
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
