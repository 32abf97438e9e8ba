//! Keys that moved when the config was split into per-method sections, in one table: a
//! user's config that still uses one is an error saying where it went; a run directory
//! written before the split is migrated when it is read (resume, eval, solve).

use toml::{Table, Value};

use super::ModelKind;

/// `(section, key, new section)`: the REINFORCE settings left `[training]`.
const MOVED: [(&str, &str, &str); 5] = [
    ("training", "baseline", "reinforce"),
    ("training", "exp_beta", "reinforce"),
    ("training", "warmup_epochs", "reinforce"),
    ("training", "baseline_eval_size", "reinforce"),
    ("training", "baseline_alpha", "reinforce"),
];

/// Keys of the old flat `[model]` section that belong to one model only.
const ATTENTION_KEYS: [&str; 5] = [
    "embed_dim",
    "num_heads",
    "num_layers",
    "feed_forward_dim",
    "normalization",
];
const POINTER_KEYS: [&str; 3] = ["hidden_dim", "lstm_layers", "dropout"];

fn has(table: &Table, section: &str, key: &str) -> bool {
    table
        .get(section)
        .and_then(Value::as_table)
        .is_some_and(|t| t.contains_key(key))
}

/// An error message for the first key of the old layout in `table`, if any.
pub(super) fn reject_moved_keys(table: &Table) -> Result<(), String> {
    for (section, key, to) in MOVED {
        if has(table, section, key) {
            return Err(format!(
                "`{section}.{key}` moved to `{to}.{key}` (put it under a `[{to}]` section)"
            ));
        }
    }
    if has(table, "training", "batches_per_epoch") {
        return Err("`training.batches_per_epoch` moved: to `reinforce.batches_per_epoch` for the attention model, or `supervised.max_batches_per_epoch` for the pointer network".into());
    }
    if has(table, "model", "lstm_layers") {
        return Err(
            "`model.lstm_layers` is now `model.num_layers` (with kind = \"pointer\")".into(),
        );
    }
    Ok(())
}

/// Fills in `model.kind`: `kind` (the command line's `--model`) or else the attention model.
/// When the file names the other model, its section is replaced by `kind`'s defaults.
pub(super) fn set_model_kind(table: &mut Table, kind: Option<ModelKind>) {
    let model = table
        .entry("model")
        .or_insert_with(|| Value::Table(Table::new()));
    let Some(model) = model.as_table_mut() else {
        return; // not a table: deserialisation reports it
    };
    let name = |k: ModelKind| Value::String(k.to_string());
    match kind {
        Some(k) => {
            let same = model
                .get("kind")
                .and_then(Value::as_str)
                .and_then(|s| <ModelKind as clap::ValueEnum>::from_str(s, false).ok())
                .is_none_or(|file_kind| file_kind == k);
            if !same {
                model.clear();
            }
            model.insert("kind".into(), name(k));
        }
        None => {
            model
                .entry("kind")
                .or_insert_with(|| name(ModelKind::Attention));
        }
    }
    // The old names of the two models.
    if let Some(Value::String(s)) = model.get_mut("kind") {
        if let Ok(k) = <ModelKind as clap::ValueEnum>::from_str(s, false) {
            *s = k.to_string();
        }
    }
}

/// Rewrites a config of the flat layout (before the per-method sections) in place.
pub(super) fn migrate_flat_layout(table: &mut Table) {
    if !has(table, "training", "baseline") {
        return;
    }
    let kind = table
        .get("model")
        .and_then(|m| m.get("kind"))
        .and_then(Value::as_str)
        .and_then(|s| <ModelKind as clap::ValueEnum>::from_str(s, false).ok())
        .unwrap_or_default();
    let mut moved = Table::new();
    let mut cap = None;
    if let Some(Value::Table(training)) = table.get_mut("training") {
        for (_, key, _) in MOVED {
            if let Some(v) = training.remove(key) {
                moved.insert(key.into(), v);
            }
        }
        cap = training.remove("batches_per_epoch");
    }
    match (kind, cap) {
        (ModelKind::Attention, cap) => {
            if let Some(v) = cap {
                moved.insert("batches_per_epoch".into(), v);
            }
            table.insert("reinforce".into(), Value::Table(moved));
        }
        (ModelKind::Pointer, Some(v)) => {
            if let Value::Table(s) = table
                .entry("supervised")
                .or_insert_with(|| Value::Table(Table::new()))
            {
                s.insert("max_batches_per_epoch".into(), v);
            }
        }
        (ModelKind::Pointer, None) => {}
    }
    if let Some(Value::Table(model)) = table.get_mut("model") {
        let drop: &[&str] = match kind {
            ModelKind::Attention => &POINTER_KEYS,
            ModelKind::Pointer => &ATTENTION_KEYS,
        };
        for key in drop {
            model.remove(*key);
        }
        if let Some(v) = model.remove("lstm_layers") {
            model.insert("num_layers".into(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::config::{BaselineKind, Config, ModelConfig};

    /// What `routeburn train` wrote as a run's `config.toml` before the per-method sections.
    const FLAT_ATTENTION: &str = r#"
[problem]
n = 10

[problem.generator]
distribution = "uniform"
min_demand = 1
max_demand = 9

[model]
kind = "gt-rl"
embed_dim = 128
num_heads = 8
num_layers = 3
feed_forward_dim = 512
normalization = "batch"
tanh_clipping = 10.0
hidden_dim = 256
lstm_layers = 2
dropout = 0.2

[training]
epochs = 2
batch_size = 128
batches_per_epoch = 25
lr = 0.0001
lr_decay = 1.0
max_grad_norm = 1.0
seed = 1234
baseline = "rollout"
exp_beta = 0.8
warmup_epochs = 1
baseline_eval_size = 1000
baseline_alpha = 0.05
decode_check_every = 4
precision = "f32"

[validation]
size = 1000
file = "data/validation/cvrp10.jsonl"
strategy = "greedy"
batch_size = 128
seed = 4321

[supervised]
labels = 10000
label_seed = 7
heuristic_rounds = 200
teacher_forcing = 1.0
teacher_forcing_decay = 1.0

[checkpointing]
dir = "checkpoints"
every_epochs = 1
keep_last = 2

[logging]
progress = true
summary = true
"#;

    const FLAT_POINTER: &str = r#"
[problem]
n = 10

[problem.generator]
distribution = "uniform"
min_demand = 1
max_demand = 9

[model]
kind = "ptrnet"
embed_dim = 128
num_heads = 8
num_layers = 3
feed_forward_dim = 512
normalization = "batch"
tanh_clipping = 10.0
hidden_dim = 32
lstm_layers = 1
dropout = 0.1

[training]
epochs = 3
batch_size = 32
batches_per_epoch = 0
lr = 0.001
lr_decay = 1.0
max_grad_norm = 1.0
seed = 11
baseline = "rollout"
exp_beta = 0.8
warmup_epochs = 1
baseline_eval_size = 10000
baseline_alpha = 0.05
decode_check_every = 4
precision = "f32"

[validation]
size = 1000
file = "data/validation/cvrp10.jsonl"
strategy = "greedy"
batch_size = 64
seed = 4321

[supervised]
labels = 160
label_seed = 7
heuristic_rounds = 5
teacher_forcing = 0.9
teacher_forcing_decay = 0.9

[checkpointing]
dir = "checkpoints"
every_epochs = 1
keep_last = 2

[logging]
progress = false
summary = true
"#;

    fn load_run(text: &str) -> Config {
        // One directory per call: the tests run in parallel in one process.
        static CALLS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir =
            std::env::temp_dir().join(format!("routeburn-migrate-{}-{call}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("config.toml");
        std::fs::write(&path, text).unwrap();
        let config = Config::load_run(&path);
        std::fs::remove_dir_all(&dir).ok();
        config.unwrap()
    }

    #[test]
    fn flat_run_configs_are_migrated() {
        let a = load_run(FLAT_ATTENTION);
        let ModelConfig::Attention(m) = &a.model else {
            panic!("{:?}", a.model)
        };
        assert_eq!((m.embed_dim, m.num_layers), (128, 3));
        assert_eq!(a.reinforce.batches_per_epoch, 25);
        assert_eq!(a.reinforce.baseline, BaselineKind::Rollout);
        assert_eq!(a.reinforce.baseline_eval_size, 1000);
        assert_eq!(a.training.epochs, 2);

        let p = load_run(FLAT_POINTER);
        let ModelConfig::Pointer(m) = &p.model else {
            panic!("{:?}", p.model)
        };
        assert_eq!((m.hidden_dim, m.num_layers, m.dropout), (32, 1, 0.1));
        assert_eq!(p.supervised.max_batches_per_epoch, 0);
        assert_eq!(p.supervised.labels, 160);
        // The migrated config is a valid config of the new layout.
        assert_eq!(Config::from_toml(&p.to_toml(), "round trip").unwrap(), p);
        assert_eq!(Config::from_toml(&a.to_toml(), "round trip").unwrap(), a);
    }

    #[test]
    fn a_user_config_of_the_flat_layout_says_where_keys_went() {
        let err = Config::from_toml(FLAT_ATTENTION, "old.toml")
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("old.toml"), "{err}");
        assert!(err.contains("moved to `reinforce."), "{err}");
    }
}
