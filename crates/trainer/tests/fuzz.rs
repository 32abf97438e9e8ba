//! Configs fed byte-level mutations of the shipped ones: a config or an error naming the
//! file, never a panic.

use proptest::prelude::*;
use routeburn_trainer::config::Config;

#[path = "../../data/tests/common/mutate.rs"]
mod mutate;
use mutate::{config, mutated};

fn shipped() -> Vec<Vec<u8>> {
    let dir = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    [
        "default.toml",
        "tiny_1.toml",
        "ptrnet_20.toml",
        "cvrp20.toml",
    ]
    .iter()
    .map(|f| std::fs::read(dir.join(f)).unwrap())
    .collect()
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn configs_never_panic(bytes in mutated(shipped())) {
        if let Err(e) = Config::from_toml(&String::from_utf8_lossy(&bytes), "fuzz.toml") {
            prop_assert!(e.to_string().starts_with("fuzz.toml"), "{}", e);
        }
    }
}
