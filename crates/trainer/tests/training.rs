//! Training runs end to end on a tiny config: every baseline, exact resume after a kill,
//! the NaN guard, numbers pinned to the code before the trainer's restructuring, and
//! config errors.

use std::path::{Path, PathBuf};

use burn::module::{Module, ModuleVisitor, Param};
use burn::tensor::Tensor;
use routeburn_model::Backend;
use routeburn_trainer::config::{Config, ModelConfig};
use routeburn_trainer::{train, TrainOptions};

const TINY: &str = r#"
[problem]
n = 6

[model]
embed_dim = 16
num_heads = 2
num_layers = 1
feed_forward_dim = 32

[training]
epochs = 3
batch_size = 16
lr = 1e-3
seed = 5

[reinforce]
batches_per_epoch = 3
baseline = "rollout"
warmup_epochs = 1
baseline_eval_size = 32

[validation]
size = 24
batch_size = 16

[logging]
progress = false
summary = false
"#;

/// Training tests run one at a time: two trainings in one process share Burn's global RNG
/// and rayon's pool, and bitwise reproducibility is only promised for one run per process.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("routeburn-train-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn options(config: Config, run_dir: &Path, resume: bool, stop: Option<usize>) -> TrainOptions {
    TrainOptions {
        config,
        run_dir: run_dir.to_path_buf(),
        backend: Backend::first_on_host().unwrap(),
        resume,
        resume_from: None,
        stop_after_epochs: stop,
        verbose: false,
        config_dir: None,
        init_weights: None,
        validate_initial: false,
        after_epoch: None,
    }
}

fn tiny(baseline: &str) -> Config {
    Config::from_toml(
        &TINY.replace("\"rollout\"", &format!("\"{baseline}\"")),
        "tiny",
    )
    .unwrap()
}

/// Metrics without the wall-time columns.
fn numbers(run_dir: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(run_dir.join("metrics.csv")).unwrap();
    let header: Vec<&str> = text.lines().next().unwrap().split(',').collect();
    text.lines()
        .skip(1)
        .map(|l| {
            l.split(',')
                .zip(&header)
                .filter(|(_, h)| {
                    !(h.starts_with("t_")
                        || ["seconds", "elapsed_seconds", "instances_per_s"].contains(h))
                })
                .map(|(v, _)| v)
                .collect::<Vec<_>>()
                .join(",")
        })
        .collect()
}

/// Every parameter value (and BatchNorm statistic) of a checkpointed model, in visiting
/// order. (The `.bpk` bytes also hold random parameter ids, so they are not compared.)
fn final_model(run_dir: &Path) -> Vec<f32> {
    final_weights(run_dir, &tiny("exponential"))
}

fn final_weights(run_dir: &Path, config: &Config) -> Vec<f32> {
    let ckpt = run_dir.join("checkpoints");
    let latest = std::fs::read_to_string(ckpt.join("latest")).unwrap();
    weights_in(&ckpt.join(latest.trim()).join("model.bpk"), config)
}

/// Every parameter value (and BatchNorm statistic) of a model file of `config`'s model.
fn weights_in(file: &Path, config: &Config) -> Vec<f32> {
    struct Collect(Vec<f32>);
    impl ModuleVisitor for Collect {
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            self.0
                .extend(param.val().into_data().try_into_vec_as::<f32>().unwrap());
        }
    }
    let device = Backend::first_on_host().unwrap().device().unwrap();
    let mut c = Collect(vec![]);
    match &config.model {
        ModelConfig::Attention(a) => a.model_config().init(&device).load_file(file).visit(&mut c),
        ModelConfig::Pointer(p) => p.model_config().init(&device).load_file(file).visit(&mut c),
    }
    assert!(c.0.len() > 100);
    c.0
}

#[test]
fn killed_and_resumed_run_matches_uninterrupted_run() {
    let _serial = serial();
    for baseline in ["rollout", "exponential", "pomo"] {
        let (a, b) = (tmp(&format!("a-{baseline}")), tmp(&format!("b-{baseline}")));
        let full = train(options(tiny(baseline), &a, false, None)).unwrap();
        assert_eq!(full.epochs.len(), 3);
        for m in &full.epochs {
            assert!(m.train_cost.is_finite() && m.val_cost.is_finite() && m.loss.is_finite());
        }
        // "Killed" after epoch 2, then resumed from its checkpoint.
        train(options(tiny(baseline), &b, false, Some(2))).unwrap();
        assert_eq!(numbers(&b).len(), 2);
        let resumed = train(options(tiny(baseline), &b, true, None)).unwrap();
        assert_eq!(resumed.epochs.len(), 1);
        assert_eq!(numbers(&a), numbers(&b), "{baseline}: metrics differ");
        assert_eq!(
            final_model(&a),
            final_model(&b),
            "{baseline}: weights differ"
        );
        // Same seed, same numbers.
        let c = tmp(&format!("c-{baseline}"));
        train(options(tiny(baseline), &c, false, None)).unwrap();
        assert_eq!(numbers(&a), numbers(&c), "{baseline}: not deterministic");
        for d in [a, b, c] {
            std::fs::remove_dir_all(d).ok();
        }
    }
}

#[test]
fn weight_averaging_keeps_the_mean_of_the_epochs_and_resumes_exactly() {
    let _serial = serial();
    // Four epochs averaged from half-way: the weights at the ends of epochs 2, 3 and 4.
    let config = |average_from: Option<f64>| {
        let mut c = tiny("rollout");
        c.training.epochs = 4;
        c.training.average_from = average_from;
        c.checkpointing.keep_last = 4;
        c
    };
    let (plain, averaged, resumed) = (tmp("avg-plain"), tmp("avg-on"), tmp("avg-resumed"));
    train(options(config(None), &plain, false, None)).unwrap();
    train(options(config(Some(0.5)), &averaged, false, None)).unwrap();
    let file = |run: &Path, epoch: usize, name: &str| {
        let path = run.join(format!("checkpoints/epoch-{epoch:04}/{name}"));
        weights_in(&path, &config(None))
    };
    // Averaging leaves training alone: the weights it goes on from are the plain run's.
    assert_eq!(
        file(&averaged, 4, "training-model.bpk"),
        file(&plain, 4, "model.bpk")
    );
    // Before it begins the checkpoint is as without it; an average of one is its set.
    assert_eq!(
        file(&averaged, 1, "model.bpk"),
        file(&plain, 1, "model.bpk")
    );
    assert!(!averaged
        .join("checkpoints/epoch-0001/training-model.bpk")
        .exists());
    assert_eq!(
        file(&averaged, 2, "model.bpk"),
        file(&plain, 2, "model.bpk")
    );
    let live: Vec<Vec<f32>> = (2..=4).map(|e| file(&plain, e, "model.bpk")).collect();
    let mean = file(&averaged, 4, "model.bpk");
    assert_eq!(mean.len(), live[0].len());
    let mut moved = 0;
    for (i, &got) in mean.iter().enumerate() {
        let want = (live[0][i] + live[1][i] + live[2][i]) / 3.0;
        assert!(
            (got - want).abs() <= 1e-6 * (1.0 + want.abs()),
            "{i}: {got} vs {want}"
        );
        moved += usize::from(got != live[2][i]);
    }
    assert!(
        moved > mean.len() / 2,
        "the mean is not the last epoch's weights"
    );
    // The metrics: the same training columns; validation scores the average from epoch 3.
    let (p, a) = (numbers(&plain), numbers(&averaged));
    let column = |row: &str, k: usize| row.split(',').nth(k).unwrap().to_string();
    for (e, (p, a)) in p.iter().zip(&a).enumerate() {
        for k in [1, 2, 3, 4, 5, 8] {
            assert_eq!(column(p, k), column(a, k), "epoch {}, column {k}", e + 1);
        }
    }
    assert_eq!(p[..2], a[..2]);
    assert_ne!(p[2..], a[2..], "validation did not score the average");
    // Stopped after epoch 3 (the average holding 2 sets) and resumed: the same run.
    train(options(config(Some(0.5)), &resumed, false, Some(3))).unwrap();
    train(options(config(Some(0.5)), &resumed, true, None)).unwrap();
    assert_eq!(numbers(&resumed), a);
    assert_eq!(file(&resumed, 4, "model.bpk"), mean);
    assert_eq!(file(&resumed, 4, "training-model.bpk"), live[2]);
    for d in [plain, averaged, resumed] {
        std::fs::remove_dir_all(d).ok();
    }
}

const TINY_PTRNET: &str = r#"
[problem]
n = 6

[model]
kind = "pointer"
hidden_dim = 16

[training]
epochs = 3
batch_size = 16
lr = 5e-3
seed = 5

[supervised]
labels = 40
heuristic_rounds = 20
teacher_forcing = 1.0
teacher_forcing_decay = 0.5

[validation]
size = 24
batch_size = 16

[logging]
progress = false
summary = false
"#;

#[test]
fn pointer_network_learns_and_resumes_exactly() {
    let _serial = serial();
    let config = Config::from_toml(TINY_PTRNET, "tiny ptrnet").unwrap();
    let (a, b) = (tmp("ptr-a"), tmp("ptr-b"));
    let full = train(options(config.clone(), &a, false, None)).unwrap();
    assert_eq!(full.epochs.len(), 3);
    assert!(
        full.epochs[2].loss < full.epochs[0].loss,
        "the NLL falls: {:?}",
        full.epochs.iter().map(|m| m.loss).collect::<Vec<_>>()
    );
    for m in &full.epochs {
        // Validation decodes went through the validator; the labels cost what they say.
        assert!(m.val_cost.is_finite() && m.train_cost.is_finite());
    }
    let labels = routeburn_data::read_jsonl(a.join("labels.jsonl")).unwrap();
    assert_eq!(labels.len(), 40);
    for r in &labels {
        let routes = r.reference_routes.as_ref().unwrap();
        let cost = r
            .instance
            .cost(routes, routeburn_cost::Metric::Exact)
            .unwrap();
        assert!((cost - r.reference_cost.unwrap()).abs() < 1e-9);
        assert_eq!(&routeburn_data::canonical(&r.instance, routes), routes);
    }

    // Killed after epoch 2 and resumed: the labels are read back, dropout is reseeded.
    train(options(config.clone(), &b, false, Some(2))).unwrap();
    let labels_written = std::fs::metadata(b.join("labels.jsonl"))
        .unwrap()
        .modified()
        .unwrap();
    train(options(config.clone(), &b, true, None)).unwrap();
    assert_eq!(
        std::fs::metadata(b.join("labels.jsonl"))
            .unwrap()
            .modified()
            .unwrap(),
        labels_written,
        "labels are computed once"
    );
    assert_eq!(numbers(&a), numbers(&b), "metrics differ");
    assert_eq!(
        final_weights(&a, &config),
        final_weights(&b, &config),
        "weights differ"
    );
    for d in [a, b] {
        std::fs::remove_dir_all(d).ok();
    }
}

#[test]
fn nan_loss_stops_the_run_and_keeps_the_checkpoint() {
    let _serial = serial();
    let dir = tmp("nan");
    train(options(tiny("exponential"), &dir, false, Some(1))).unwrap();
    let before = final_model(&dir);
    let mut config = tiny("exponential");
    config.training.lr = 1e30;
    let err = train(options(config, &dir, true, None)).unwrap_err();
    let msg = err.to_string();
    assert!(msg.contains("NaN") || msg.contains("inf"), "{msg}");
    assert_eq!(routeburn_trainer::cli::exit_code(&err), 1);
    assert_eq!(
        final_model(&dir),
        before,
        "the last good checkpoint is intact"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// The metrics (loss, costs, gradient norm, validation) of short runs, as the code before
/// the trainer was split into a run skeleton and training methods computed them (flex, this
/// machine's CPU). A change that moves them changes what training does; if that is meant,
/// say so and pin the new numbers. The tolerance covers other CPUs' SIMD rounding only.
#[test]
fn short_runs_keep_their_pinned_numbers() {
    let _serial = serial();
    let mut ptrnet = Config::from_toml(TINY_PTRNET, "tiny pointer").unwrap();
    ptrnet.training.shards = Some(1);
    let pinned = [
        (
            one_shard(tiny("rollout")),
            [
                "1,4.918866,5.018008,0.424522,13.662384,1e-3,3.943310,,0",
                "2,4.534924,3.869915,-4.836236,9.787572,1e-3,4.005531,,0",
                "3,4.269258,3.739069,-4.225967,6.089743,1e-3,4.031029,,0",
            ],
        ),
        (
            ptrnet,
            [
                "1,3.176547,3.176547,1.002811,0.224353,5e-3,4.237921,,0",
                "2,3.176547,3.176547,0.966575,0.116084,5e-3,4.184679,,0",
                "3,3.176547,3.176547,0.974835,0.122978,5e-3,4.189320,,0",
            ],
        ),
    ];
    for (i, (config, expected)) in pinned.into_iter().enumerate() {
        let dir = tmp(&format!("pinned-{i}"));
        train(options(config, &dir, false, None)).unwrap();
        let got = numbers(&dir);
        assert_eq!(got.len(), expected.len());
        for (g, e) in got.iter().zip(expected) {
            for (a, b) in g.split(',').zip(e.split(',')) {
                let close = match (a.parse::<f64>(), b.parse::<f64>()) {
                    (Ok(x), Ok(y)) => (x - y).abs() <= 1e-3 * y.abs().max(1.0),
                    _ => a == b,
                };
                assert!(close, "run {i}: got {g}, pinned {e}");
            }
        }
        std::fs::remove_dir_all(dir).ok();
    }
}

/// `training.lr_final` without a time limit: the rate of each epoch's last step, in the
/// metrics' `lr` column, is `lr · (lr_final / lr)^progress` with progress counted in
/// steps (2 epochs of 3 steps: 2/6 and 5/6 of the run), and the run is repeatable.
#[test]
fn lr_final_decays_over_the_runs_steps() {
    let _serial = serial();
    let mut config = one_shard(tiny("exponential"));
    config.training.epochs = 2;
    config.training.lr_final = Some(1e-5);
    let dir = tmp("lr-final");
    train(options(config.clone(), &dir, false, None)).unwrap();
    let rates: Vec<f64> = numbers(&dir)
        .iter()
        .map(|row| row.split(',').nth(5).unwrap().parse().unwrap())
        .collect();
    let expected = [
        1e-3 * 1e-2f64.powf(2.0 / 6.0),
        1e-3 * 1e-2f64.powf(5.0 / 6.0),
    ];
    assert_eq!(rates.len(), 2);
    for (got, want) in rates.iter().zip(expected) {
        assert!(
            (got - want).abs() <= 1e-6 * want,
            "lr {got}, expected {want}"
        );
    }
    // Constant-rate numbers would differ; the same config gives the same ones.
    let again = tmp("lr-final-again");
    train(options(config.clone(), &again, false, None)).unwrap();
    assert_eq!(numbers(&dir), numbers(&again));
    config.training.lr_final = None;
    let constant = tmp("lr-final-constant");
    train(options(config, &constant, false, None)).unwrap();
    assert_ne!(numbers(&dir)[1], numbers(&constant)[1]);
    for d in [dir, again, constant] {
        std::fs::remove_dir_all(d).ok();
    }
}

/// `reinforce.leader_alpha` reaches POMO's loss (the advantages themselves are checked by
/// hand in `reinforce::pomo`): α = 1 is POMO's run exactly, α = 4 learns otherwise from the
/// same first batch.
#[test]
fn leader_alpha_changes_pomo_training_and_1_is_pomo() {
    let _serial = serial();
    let mut plain = one_shard(tiny("pomo"));
    plain.training.epochs = 2;
    let runs: Vec<Vec<String>> = [None, Some(1.0), Some(4.0)]
        .into_iter()
        .enumerate()
        .map(|(i, alpha)| {
            let mut config = plain.clone();
            if let Some(a) = alpha {
                config.reinforce.leader_alpha = a;
            }
            let dir = tmp(&format!("leader-{i}"));
            train(options(config, &dir, false, None)).unwrap();
            let got = numbers(&dir);
            std::fs::remove_dir_all(dir).ok();
            got
        })
        .collect();
    assert_eq!(runs[0], runs[1]);
    // The loss column differs from the first epoch; the costs once the weights move.
    let loss = |run: &[String], epoch: usize| run[epoch].split(',').nth(3).unwrap().to_string();
    assert_ne!(loss(&runs[0], 0), loss(&runs[2], 0));
    assert_ne!(runs[0][1], runs[2][1]);
}

/// `reinforce.entropy_weight`: 0 is POMO's run exactly; with β > 0 every sampled tour is
/// valued at its cost plus β times its (negative) log-likelihood, so each epoch's shared
/// baseline, the mean of those values, lies below the mean cost it trained on, and the
/// loss differs from the first batch.
#[test]
fn entropy_weight_values_tours_below_their_cost_and_0_is_pomo() {
    let _serial = serial();
    let run = |weight: Option<f64>, name: &str| {
        tiny_pomo_numbers(1, name, |c| {
            if let Some(w) = weight {
                c.reinforce.entropy_weight = w;
            }
        })
    };
    let pomo = run(None, "entropy-none");
    assert_eq!(pomo, run(Some(0.0), "entropy-0"));
    let entropy = run(Some(0.05), "entropy-005");
    let column = |row: &str, i: usize| row.split(',').nth(i).unwrap().parse::<f64>().unwrap();
    for (plain, shaped) in pomo.iter().zip(&entropy) {
        // Columns: epoch, train cost, baseline cost, loss.
        assert!(
            (column(plain, 1) - column(plain, 2)).abs() < 1e-5,
            "{plain}"
        );
        assert!(column(shaped, 2) < column(shaped, 1), "{shaped}");
    }
    assert_ne!(column(&pomo[0], 3), column(&entropy[0], 3));
}

/// `reinforce.learn_from`: the whole is POMO's run exactly; half learns from half the
/// tours (the loss differs from the first epoch on) and the run repeats; two shards train
/// with it too.
#[test]
fn learning_from_the_furthest_tours_trains_and_1_is_pomo() {
    let _serial = serial();
    let run = |fraction: Option<f64>, shards: usize, name: &str| {
        tiny_pomo_numbers(shards, name, |c| c.reinforce.learn_from = fraction)
    };
    let all = run(None, 1, "learn-all");
    assert_eq!(all, run(Some(1.0), 1, "learn-1"));
    let half = run(Some(0.5), 1, "learn-half");
    let column = |row: &str, i: usize| row.split(',').nth(i).unwrap().to_string();
    // Columns: epoch, train cost, baseline cost, loss.
    assert_ne!(column(&all[0], 3), column(&half[0], 3));
    assert_eq!(half, run(Some(0.5), 1, "learn-half-again"));
    assert_eq!(run(Some(0.5), 2, "learn-half-sharded").len(), 2);
}

/// `reinforce.preference_alpha`: preference optimisation trains in POMO's place (the loss
/// differs from the first epoch, the costs once the weights move), repeats exactly, and
/// trains on two shards and from a quarter of the tours.
#[test]
fn preference_optimisation_trains_and_repeats() {
    let _serial = serial();
    let run = |alpha: Option<f64>, shards: usize, name: &str| {
        tiny_pomo_numbers(shards, name, |c| c.reinforce.preference_alpha = alpha)
    };
    let pomo = run(None, 1, "preference-none");
    let preferred = run(Some(0.1), 1, "preference-01");
    let column = |row: &str, i: usize| row.split(',').nth(i).unwrap().to_string();
    // Columns: epoch, train cost, baseline cost, loss.
    assert_ne!(column(&pomo[0], 3), column(&preferred[0], 3));
    assert_ne!(pomo[1], preferred[1]);
    assert_eq!(preferred, run(Some(0.1), 1, "preference-01-again"));
    assert_eq!(run(Some(0.1), 2, "preference-01-sharded").len(), 2);
    let quarter = tiny_pomo_numbers(1, "preference-quarter", |c| {
        c.reinforce.preference_alpha = Some(0.1);
        c.reinforce.learn_from = Some(0.25);
    });
    assert_ne!(column(&quarter[0], 3), column(&preferred[0], 3));
}

/// `reinforce.starts`: n starts is POMO's run exactly; fewer train from fewer tours (each
/// epoch's costs are the means of the first customers' tours alone), and the run repeats;
/// two shards split the batch by instance, each with its starts.
#[test]
fn fewer_pomo_starts_train_and_n_starts_is_pomo() {
    let _serial = serial();
    let run = |starts: Option<usize>, shards: usize, name: &str| {
        tiny_pomo_numbers(shards, name, |c| c.reinforce.starts = starts)
    };
    let all = run(None, 1, "starts-all");
    assert_eq!(all, run(Some(6), 1, "starts-6"));
    let three = run(Some(3), 1, "starts-3");
    assert_ne!(all[0], three[0]);
    assert_eq!(three, run(Some(3), 1, "starts-3-again"));
    assert_eq!(run(Some(3), 2, "starts-3-sharded").len(), 2);
}

/// The non-timing `metrics.csv` rows of 2 epochs of the tiny POMO config on `shards`,
/// with `edit` made to its config.
fn tiny_pomo_numbers(shards: usize, name: &str, edit: impl FnOnce(&mut Config)) -> Vec<String> {
    let mut config = tiny("pomo");
    config.training.epochs = 2;
    config.training.shards = Some(shards);
    edit(&mut config);
    let dir = tmp(name);
    train(options(config, &dir, false, None)).unwrap();
    let got = numbers(&dir);
    std::fs::remove_dir_all(dir).ok();
    got
}

fn one_shard(mut config: Config) -> Config {
    config.training.shards = Some(1);
    config
}

/// Trains `config` with rayon's pool limited to `threads`; the run's metrics and weights.
fn train_on_threads(config: &Config, threads: usize, name: &str) -> (Vec<String>, Vec<f32>) {
    let dir = tmp(&format!("{name}-{threads}"));
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| train(options(config.clone(), &dir, false, None)))
        .unwrap();
    let out = (numbers(&dir), final_weights(&dir, config));
    std::fs::remove_dir_all(dir).ok();
    out
}

/// Two shards give the same metrics and weights whether they run on one thread or two,
/// for REINFORCE (a rollout baseline, POMO) and supervised training (with dropout).
#[test]
fn shards_give_the_same_numbers_on_one_and_two_threads() {
    let _serial = serial();
    let mut ptrnet = Config::from_toml(TINY_PTRNET, "tiny pointer").unwrap();
    if let ModelConfig::Pointer(p) = &mut ptrnet.model {
        p.dropout = 0.1;
    }
    for (name, mut config) in [
        ("shards-rollout", tiny("rollout")),
        ("shards-pomo", tiny("pomo")),
        ("shards-ptrnet", ptrnet),
    ] {
        config.training.shards = Some(2);
        config.training.epochs = 2;
        let one = train_on_threads(&config, 1, name);
        let two = train_on_threads(&config, 2, name);
        assert_eq!(
            one.0, two.0,
            "{name}: metrics differ between 1 and 2 threads"
        );
        assert_eq!(
            one.1, two.1,
            "{name}: weights differ between 1 and 2 threads"
        );
    }
}

/// A run with two shards, killed after an epoch and resumed (its config read back from the
/// run directory, as `--resume` does), matches the uninterrupted run; and a config that
/// leaves the shard count out gets one written into the run's config.
#[test]
fn resume_with_shards_is_exact() {
    let _serial = serial();
    let mut config = tiny("exponential");
    config.training.epochs = 2;
    let (a, b) = (tmp("shards-a"), tmp("shards-b"));
    train(options(config.clone(), &a, false, None)).unwrap();
    let written = Config::load_run(&a.join("config.toml")).unwrap();
    assert_eq!(
        written.training.shards,
        Some(rayon::current_num_threads()),
        "the default shard count is recorded"
    );
    config.training.shards = written.training.shards;
    train(options(config.clone(), &b, false, Some(1))).unwrap();
    let mut resumed = config.clone();
    resumed.training.shards = None; // read back from the run directory
    train(options(resumed, &b, true, None)).unwrap();
    assert_eq!(numbers(&a), numbers(&b), "metrics differ");
    assert_eq!(final_model(&a), final_model(&b), "weights differ");
    for d in [a, b] {
        std::fs::remove_dir_all(d).ok();
    }
}

/// The error of a run of `config` refused before it trains, its run directory two levels
/// below one that does not exist yet: it must leave none of the three behind.
fn refused(config: Config, name: &str) -> String {
    let parent = tmp(name);
    let err = train(options(config, &parent.join("runs/run-001"), false, None))
        .unwrap_err()
        .to_string();
    assert!(
        !parent.exists(),
        "a refused run leaves no run directory, nor the parents it made"
    );
    err
}

#[test]
fn half_precision_needs_cuda() {
    let _serial = serial();
    let mut config = tiny("exponential");
    config.training.precision = routeburn_trainer::config::Precision::Bf16;
    let err = refused(config, "bf16");
    assert!(
        err.contains("training.precision") && err.contains("cuda"),
        "{err}"
    );
}

#[test]
fn a_missing_validation_file_is_named_and_leaves_nothing() {
    let _serial = serial();
    let mut config = tiny("exponential");
    config.validation.file = Some(PathBuf::from("no/such/validation.jsonl"));
    let err = refused(config, "missing-validation");
    assert!(
        err.contains("validation.file") && err.contains("no/such/validation.jsonl"),
        "{err}"
    );
}

#[test]
fn every_shipped_config_parses() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../configs");
    let mut count = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "toml") {
            Config::load(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            count += 1;
        }
    }
    assert!(count >= 6);
    let default = Config::embedded_default();
    assert_eq!(
        Config::from_toml(&default.to_toml(), "round trip").unwrap(),
        default
    );
}

#[test]
fn config_errors_name_the_key() {
    let cases = [
        (
            TINY.replace("batch_size = 16", "batch_sise = 16"),
            "batch_sise",
        ),
        (TINY.replace("lr = 1e-3", "lr = -1.0"), "training.lr"),
        (
            TINY.replace("lr = 1e-3", "lr = 1e-3\nlr_final = 0.0"),
            "training.lr_final",
        ),
        (
            TINY.replace("lr = 1e-3", "lr = 1e-3\nlr_final = 1e-5\nlr_decay = 0.9"),
            "both schedule the rate",
        ),
        (
            TINY.replace("batch_size = 16", "batch_size = 0"),
            "training.batch_size",
        ),
        (
            TINY.replace("lr = 1e-3", "lr = 1e-3\naverage_from = 1.0"),
            "`training.average_from` must be a fraction of the run, at least 0 and below 1, got 1",
        ),
        (
            TINY.replace("lr = 1e-3", "lr = 1e-3\naverage_from = -0.5"),
            "training.average_from",
        ),
        (
            TINY.replace("lr = 1e-3", "lr = 1e-3\naverage_from = nan"),
            "training.average_from",
        ),
        // Keys of the flat layout say where they went.
        (
            TINY.replace("seed = 5", "seed = 5\nbaseline = \"pomo\""),
            "`training.baseline` moved to `reinforce.baseline`",
        ),
        (
            TINY.replace("seed = 5", "seed = 5\nbatches_per_epoch = 4"),
            "reinforce.batches_per_epoch",
        ),
        (
            TINY_PTRNET.replace("hidden_dim = 16", "hidden_dim = 16\nlstm_layers = 2"),
            "model.num_layers",
        ),
        // A key of the other model.
        (
            TINY_PTRNET.replace("hidden_dim = 16", "hidden_dim = 16\nembed_dim = 8"),
            "embed_dim",
        ),
        (
            TINY.replace("num_heads = 2", "num_heads = 3"),
            "model.num_heads",
        ),
        (TINY.replace("\"rollout\"", "\"greedy\""), "baseline"),
        (TINY.replace("n = 6", "n = \"six\""), "n"),
        (TINY.replace("[logging]", "[loging]"), "loging"),
        (
            TINY.replace("seed = 5", "seed = 5\nprecision = \"fp8\""),
            "precision",
        ),
    ];
    assert_errors_name_the_file_and_key(&cases);
}

/// The `[reinforce]` section's checks, each naming its key.
#[test]
fn reinforce_config_errors_name_the_key() {
    let cases = [
        // Leader Reward needs POMO's multi-start tours, and an α of at least 1.
        (
            TINY.replace("warmup_epochs = 1", "warmup_epochs = 1\nleader_alpha = 4.0"),
            "reinforce.leader_alpha",
        ),
        (
            TINY.replace("\"rollout\"", "\"pomo\"\nleader_alpha = 0.5"),
            "reinforce.leader_alpha",
        ),
        // POMO's starts: with POMO only, from 2 to n.
        (
            TINY.replace("warmup_epochs = 1", "warmup_epochs = 1\nstarts = 3"),
            "reinforce.starts",
        ),
        (
            TINY.replace("\"rollout\"", "\"pomo\"\nstarts = 7"),
            "reinforce.starts` must be from 2 (a tour against the mean of its instance's) to `problem.n`, got 7 with n = 6",
        ),
        (
            TINY.replace("\"rollout\"", "\"pomo\"\nstarts = 1"),
            "reinforce.starts",
        ),
        (
            TINY.replace("batches_per_epoch = 3", "batches_per_epoch = 0"),
            "reinforce.batches_per_epoch",
        ),
        // Maximum-entropy REINFORCE's β: a number, 0 or more.
        (
            TINY.replace("warmup_epochs = 1", "warmup_epochs = 1\nentropy_weight = -0.01"),
            "reinforce.entropy_weight` must be a number at least 0 (0: plain REINFORCE), got -0.01",
        ),
        (
            TINY.replace("warmup_epochs = 1", "warmup_epochs = 1\nentropy_weight = nan"),
            "reinforce.entropy_weight",
        ),
        // The tours learned from: with POMO only, a fraction in (0, 1].
        (
            TINY.replace("warmup_epochs = 1", "warmup_epochs = 1\nlearn_from = 0.5"),
            "reinforce.learn_from",
        ),
        (
            TINY.replace("\"rollout\"", "\"pomo\"\nlearn_from = 0"),
            "reinforce.learn_from` must be a fraction in (0, 1] of each instance's tours, got 0",
        ),
        (
            TINY.replace("\"rollout\"", "\"pomo\"\nlearn_from = 1.5"),
            "reinforce.learn_from",
        ),
        // Preference optimisation's α: with POMO only, above 0, and in place of the
        // advantage's other shapings.
        (
            TINY.replace("warmup_epochs = 1", "warmup_epochs = 1\npreference_alpha = 0.1"),
            "reinforce.preference_alpha` must be left out unless `reinforce.baseline = \"pomo\"`",
        ),
        (
            TINY.replace("\"rollout\"", "\"pomo\"\npreference_alpha = 0"),
            "reinforce.preference_alpha` must be a number above 0, got 0",
        ),
        (
            TINY.replace("\"rollout\"", "\"pomo\"\npreference_alpha = inf"),
            "reinforce.preference_alpha",
        ),
        (
            TINY.replace("\"rollout\"", "\"pomo\"\npreference_alpha = 0.1\nentropy_weight = 0.01"),
            "reinforce.preference_alpha` must be left out with `reinforce.entropy_weight`",
        ),
        (
            TINY.replace("\"rollout\"", "\"pomo\"\npreference_alpha = 0.1\nleader_alpha = 2"),
            "reinforce.preference_alpha` must be left out with",
        ),
    ];
    assert_errors_name_the_file_and_key(&cases);
}

/// Each config text is refused with an error that starts with its file's name and
/// contains the expected words.
#[track_caller]
fn assert_errors_name_the_file_and_key(cases: &[(String, &str)]) {
    for (text, key) in cases {
        let err = Config::from_toml(text, "my.toml").unwrap_err().to_string();
        assert!(err.starts_with("my.toml"), "{err}");
        assert!(err.contains(key), "expected `{key}` in: {err}");
    }
}

/// The rows of `docs/config.md`: (model kind the table is for, key, default cell).
fn documented_keys() -> Vec<(Option<&'static str>, String, String)> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../docs/config.md");
    let text = std::fs::read_to_string(path).unwrap();
    let mut kind = None;
    let mut rows = Vec::new();
    for line in text.lines() {
        if line.starts_with("## ") {
            kind = ["attention", "pointer"]
                .into_iter()
                .find(|k| line.contains(&format!("kind = \"{k}\"")));
        }
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        if cells.len() >= 4 && cells[1].starts_with('`') {
            let key = cells[1].trim_matches('`').to_string();
            rows.push((kind, key, cells[2].trim_matches('`').to_string()));
        }
    }
    rows
}

/// Dotted keys of a TOML table, with their values.
fn flatten(value: &toml::Value, prefix: &str, out: &mut Vec<(String, toml::Value)>) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(v, &key, out);
            }
        }
        other => out.push((prefix.to_string(), other.clone())),
    }
}

/// `docs/config.md` lists every key of the config structs, and each default it gives is
/// the one the structs apply: setting a key to its documented default changes nothing.
#[test]
fn config_reference_matches_the_config_structs() {
    let rows = documented_keys();
    for kind in ["attention", "pointer"] {
        let minimal = format!("[problem]\nn = 20\n[model]\nkind = \"{kind}\"\n");
        let defaults = Config::from_toml(&minimal, "minimal").unwrap();
        let table: toml::Value = toml::from_str(&defaults.to_toml()).unwrap();
        let mut serialized = Vec::new();
        flatten(&table, "", &mut serialized);
        let ours: Vec<_> = rows
            .iter()
            .filter(|(k, _, _)| k.is_none() || *k == Some(kind))
            .collect();
        for (key, _) in &serialized {
            assert!(
                ours.iter().any(|(_, k, _)| k == key),
                "docs/config.md does not document `{key}` ({kind} model)"
            );
        }
        for (_, key, default) in ours {
            let present = serialized.iter().any(|(k, _)| k == key);
            match default.as_str() {
                "(required)" => assert!(present, "{key}"),
                "—" => assert!(!present, "`{key}` is documented as unset by default"),
                literal => {
                    let value: toml::Value =
                        toml::from_str::<toml::Table>(&format!("v = {literal}")).unwrap()["v"]
                            .clone();
                    let mut edited = table.clone();
                    let (path, last) = key.rsplit_once('.').unwrap();
                    let mut at = &mut edited;
                    for part in path.split('.') {
                        at = at
                            .as_table_mut()
                            .unwrap()
                            .entry(part)
                            .or_insert(toml::Value::Table(Default::default()));
                    }
                    at.as_table_mut().unwrap().insert(last.to_string(), value);
                    let text = toml::to_string(&edited).unwrap();
                    let with_key = Config::from_toml(&text, "documented default")
                        .unwrap_or_else(|e| panic!("`{key} = {literal}`: {e}"));
                    assert_eq!(
                        with_key, defaults,
                        "`{key}`: the documented default {literal} is not the default ({kind} model)"
                    );
                }
            }
        }
    }
}
