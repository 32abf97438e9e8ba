//! PyTorch checkpoints of the attention model as routeburn attention models: Kool et al.'s
//! (wouterkool/attention-learn-to-route, `.pt` with `args.json` beside it: [`kool`]) and
//! rl4co's (`AttentionModel` Lightning checkpoints, `.ckpt`: [`rl4co`]). The same weights
//! give the same tours.
//!
//! Files are read by burn-store's PyTorch reader (the legacy pickle format of Kool's
//! published `epoch-99.pt` as well as the zip format). Every parameter is mapped by name
//! and checked against the shape routeburn expects before anything is applied. PyTorch's
//! `Linear` weights are `[out, in]` and Burn's `[in, out]`: they are transposed.

pub(crate) mod kool;
pub(crate) mod rl4co;

use std::collections::HashMap;
use std::path::Path;

use burn::store::pytorch::PytorchReader;
use burn::store::pytorch_reader::DType;
use burn::store::{bridge, ModuleSnapshot};
use burn::tensor::{Device, TensorData};
use routeburn_model::{AttentionModel, Normalization};

use crate::config::AttentionConfig;
use crate::error::TrainError;

/// An imported model and what it was trained for.
pub(crate) struct Imported {
    pub(crate) config: AttentionConfig,
    /// Customers per instance of the source's training run, where the file says.
    pub(crate) graph_size: Option<usize>,
    pub(crate) model: AttentionModel,
}

impl Imported {
    /// `[problem] n` for runs made from the model: its training size, or
    /// [`rl4co::ASSUMED_GRAPH_SIZE`] where the file does not say.
    pub(crate) fn problem_size(&self) -> usize {
        self.graph_size.unwrap_or(rl4co::ASSUMED_GRAPH_SIZE)
    }
}

/// The names Kool's and rl4co's code give the normalisations.
const NORMALIZATION_NAMES: [(Normalization, &str); 3] = [
    (Normalization::Batch, "batch"),
    (Normalization::Instance, "instance"),
    (Normalization::Layer, "layer"),
];

/// The normalisation a source names `batch`, `instance` or `layer`.
fn normalization_named(name: &str) -> Option<Normalization> {
    NORMALIZATION_NAMES
        .iter()
        .find(|(_, n)| *n == name)
        .map(|(norm, _)| *norm)
}

/// The name a source gives `norm`: the inverse of [`normalization_named`].
pub(crate) fn normalization_name(norm: Normalization) -> &'static str {
    NORMALIZATION_NAMES
        .iter()
        .find(|(n, _)| *n == norm)
        .map(|(_, name)| *name)
        .expect("every normalisation is in the table")
}

/// Little-endian float32 bytes as values.
pub(crate) fn f32s_from_le(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// A row-major `[rows, cols]` matrix transposed: PyTorch's `[out, in]` linear weight as
/// Burn's `[in, out]`, and back.
pub(crate) fn transposed(values: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    (0..cols)
        .flat_map(|c| (0..rows).map(move |r| values[r * cols + c]))
        .collect()
}

/// A float tensor of the checkpoint: shape and values, and the name it had there.
pub(crate) struct Weights {
    shape: Vec<usize>,
    values: Vec<f32>,
    from: String,
}

/// Whether `path` names a PyTorch checkpoint file rather than a routeburn run.
pub(crate) fn is_pytorch_file(path: &Path) -> bool {
    path.is_file()
        && path
            .extension()
            .is_some_and(|e| e == "pt" || e == "pth" || e == "ckpt")
}

/// Reads the checkpoint at `path` into an attention model on `device`: a Lightning
/// `.ckpt` is rl4co's, any other file Kool's (with `args.json` beside it).
pub(crate) fn import(path: &Path, device: &Device) -> Result<Imported, TrainError> {
    if path.extension().is_some_and(|e| e == "ckpt") {
        rl4co::import(path, device)
    } else {
        kool::import(path, device)
    }
}

/// Every float tensor under the checkpoint's `top_key` whose name starts with `prefix`,
/// the prefix dropped; integer tensors (batch norm's `num_batches_tracked`) are skipped.
fn read_state_dict(
    path: &Path,
    top_key: &str,
    prefix: &str,
) -> Result<HashMap<String, Weights>, TrainError> {
    let not_pytorch = |e: &dyn std::fmt::Display| {
        TrainError::checkpoint(
            path,
            format!("not a PyTorch checkpoint with a `{top_key}` state dict: {e}"),
        )
    };
    let reader = PytorchReader::with_top_level_key(path, top_key).map_err(|e| not_pytorch(&e))?;
    let mut tensors = HashMap::new();
    for (name, tensor) in reader.into_tensors() {
        let Some(short) = name.strip_prefix(prefix) else {
            continue;
        };
        match tensor.dtype() {
            DType::F32 => {}
            DType::I64 if short.ends_with("num_batches_tracked") => continue,
            other => {
                return Err(TrainError::checkpoint(
                    path,
                    format!("`{name}` is {other:?}; routeburn imports float32 weights"),
                ))
            }
        }
        let shape = tensor.shape().to_vec();
        let bytes = tensor.read().map_err(|e| not_pytorch(&e))?;
        let values = f32s_from_le(&bytes);
        if values.len() != shape.iter().product::<usize>() {
            return Err(not_pytorch(&format!(
                "`{name}` holds {} values for shape {shape:?}",
                values.len()
            )));
        }
        tensors.insert(
            short.to_string(),
            Weights {
                shape,
                values,
                from: name,
            },
        );
    }
    Ok(tensors)
}

/// A checkpoint's tensors, looked up by the source's names, and the routeburn tensors
/// mapped from them so far.
struct Source<'a> {
    path: &'a Path,
    /// What the checkpoint should hold, for errors: "Kool's attention model".
    model: &'static str,
    tensors: HashMap<String, Weights>,
    out: Vec<(String, Weights)>,
}

impl Source<'_> {
    fn get(&self, name: &str) -> Result<&Weights, TrainError> {
        self.tensors.get(name).ok_or_else(|| {
            TrainError::checkpoint(
                self.path,
                format!("no parameter `{name}`: not a checkpoint of {}", self.model),
            )
        })
    }

    /// A PyTorch `Linear`: the weight transposed, the bias as it is.
    fn linear(&mut self, from: &str, to: &str, bias: bool) -> Result<(), TrainError> {
        let name = format!("{from}.weight");
        let w = self.get(&name)?;
        let [rows, cols] = w.shape[..] else {
            return Err(self.shape_error(&name, "[out, in]", &w.shape));
        };
        let values = transposed(&w.values, rows, cols);
        let weight = Weights {
            shape: vec![cols, rows],
            values,
            from: name,
        };
        self.out.push((format!("{to}.weight"), weight));
        if bias {
            self.copy(&format!("{from}.bias"), &format!("{to}.bias"))?;
        }
        Ok(())
    }

    /// A normaliser: batch norm with its running statistics, instance or layer norm.
    fn norm(&mut self, from: &str, to: &str, norm: Normalization) -> Result<(), TrainError> {
        let (variant, stats) = norm_parameters(norm);
        self.copy(&format!("{from}.weight"), &format!("{to}.{variant}.gamma"))?;
        self.copy(&format!("{from}.bias"), &format!("{to}.{variant}.beta"))?;
        for s in stats {
            self.copy(&format!("{from}.{s}"), &format!("{to}.{variant}.{s}"))?;
        }
        Ok(())
    }

    /// A tensor taken as it is.
    fn copy(&mut self, from: &str, to: &str) -> Result<(), TrainError> {
        let w = self.get(from)?;
        let copied = Weights {
            shape: w.shape.clone(),
            values: w.values.clone(),
            from: w.from.clone(),
        };
        self.out.push((to.to_string(), copied));
        Ok(())
    }

    fn shape_error(&self, name: &str, expected: &str, found: &[usize]) -> TrainError {
        TrainError::checkpoint(
            self.path,
            format!("`{name}`: expected a {expected} tensor, found shape {found:?}"),
        )
    }
}

/// routeburn's name of a normaliser's variant (`…_norm.Batch.gamma`) and the running
/// statistics it keeps besides PyTorch's `weight`/`bias` (its `gamma`/`beta`).
pub(crate) fn norm_parameters(norm: Normalization) -> (&'static str, &'static [&'static str]) {
    match norm {
        Normalization::Batch => ("Batch", &["running_mean", "running_var"]),
        Normalization::Instance => ("Instance", &[]),
        Normalization::Layer => ("Layer", &[]),
    }
}

/// Checks every mapped tensor against the parameter routeburn expects (name and shape),
/// then applies them all.
fn apply(
    model: &mut AttentionModel,
    mapped: Vec<(String, Weights)>,
    path: &Path,
) -> Result<(), TrainError> {
    let expected: HashMap<String, Vec<usize>> = model
        .collect(None, None, false)
        .into_iter()
        .map(|t| (t.name.clone(), t.shape.to_vec()))
        .collect();
    let mismatch = |message: String| TrainError::checkpoint(path, message);
    for (name, w) in &mapped {
        match expected.get(name) {
            None => return Err(mismatch(format!("routeburn's attention model has no parameter `{name}`"))),
            Some(shape) if shape != &w.shape => {
                return Err(mismatch(format!(
                    "`{name}`: routeburn expects shape {shape:?}, the checkpoint's `{}` gives {:?} (the architecture and the weights disagree?)",
                    w.from, w.shape
                )))
            }
            Some(_) => {}
        }
    }
    if let Some(missing) = expected
        .keys()
        .find(|k| !mapped.iter().any(|(n, _)| n == *k))
    {
        return Err(mismatch(format!(
            "nothing in the checkpoint for routeburn's `{missing}`"
        )));
    }
    let tensors = mapped
        .into_iter()
        .map(|(name, w)| bridge::from_data(TensorData::new(w.values, w.shape), name, None))
        .collect();
    let result = model.apply(tensors, None, None, false);
    if !result.errors.is_empty() || !result.missing.is_empty() {
        return Err(mismatch(format!("applying the weights: {result:?}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use routeburn_data::{read_jsonl, Batch};
    use routeburn_model::{
        AttentionModel, Backend, DecodeOptions, DeviceBatch, LoadArithmetic, Normalization,
        StepKernel,
    };

    use super::*;
    use crate::evaluate::{download_ints, validated_costs};

    fn data(rel: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../data")
            .join(rel)
    }

    fn device() -> Device {
        Backend::first_on_host().unwrap().device().unwrap()
    }

    /// What the source's own code decodes greedily with its model (PyTorch, CPU): per
    /// instance, in order, the `cost` and the `actions`.
    struct Tour {
        cost: f64,
        actions: Vec<i64>,
    }

    fn tours(path: &Path) -> Vec<Tour> {
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                Tour {
                    cost: v["cost"].as_f64().unwrap(),
                    actions: v["actions"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|a| a.as_i64().unwrap())
                        .collect(),
                }
            })
            .collect()
    }

    /// The imported model's greedy tours on the first instances of a validation set: the
    /// same actions as the source's code, and (through the cost crate's validator) the
    /// same costs, on every instance but rounding-decided ties.
    ///
    /// A tie is an instance whose tour differs between the model's two forms of the same
    /// arithmetic (the encoder's attention fused and op by op, ~1e-7 apart): there two
    /// nodes are equally likely to within f32 rounding, and the source's tour must be one
    /// of the two. Kool's CVRP100 model has one, instance 74: at step 100 two nodes of
    /// probability ~0.5 each, their log-probabilities 1.1e-5 apart op by op and 3.3e-6 the
    /// other way fused. At most 1% of instances may be ties.
    fn same_tours(checkpoint: &Path, expected: &Path, validation: &str) {
        let device = device();
        let model = import(checkpoint, &device).unwrap().model;
        let expected = tours(expected);
        let records = read_jsonl(data(validation)).unwrap();
        assert!(expected.len() <= records.len());
        let instances = records[..expected.len()].iter().map(|r| &r.instance);
        let batch = Batch::from_instances(instances).unwrap();
        let problem = DeviceBatch::upload(&batch, None, &device);
        let greedy = |model: &AttentionModel| {
            let out = model.decode(&problem, &DecodeOptions::greedy());
            let [(actions, [_, steps])] = download_ints(vec![out.actions], "tours")
                .unwrap()
                .try_into()
                .unwrap();
            let costs = validated_costs(&batch, &actions, steps, 1).unwrap();
            let tour = |i: usize| {
                let mut tour = actions[i * steps..(i + 1) * steps].to_vec();
                while tour.last() == Some(&0) {
                    tour.pop();
                }
                tour
            };
            (0..expected.len())
                .map(|i| (tour(i), costs[i]))
                .collect::<Vec<_>>()
        };
        let ours = greedy(&model);
        let other_rounding = greedy(&model.with_encoder_attention(StepKernel::OpByOp));
        let what = checkpoint.display();
        let mut ties = 0;
        for (i, (e, ((tour, cost), (other, _)))) in expected
            .iter()
            .zip(ours.iter().zip(&other_rounding))
            .enumerate()
        {
            if tour != other {
                ties += 1;
                assert!(
                    e.actions == *tour || e.actions == *other,
                    "{what}, instance {i}: a tie whose sides are neither the source's tour"
                );
                continue;
            }
            assert_eq!(*tour, e.actions, "{what}, instance {i}: tours differ");
            let rel = (cost - e.cost).abs() / e.cost;
            assert!(
                rel < 1e-4,
                "{what}, instance {i}: cost {cost} vs {}",
                e.cost
            );
        }
        assert!(
            ties * 100 <= expected.len(),
            "{what}: {ties} of {} instances are rounding-decided ties",
            expected.len()
        );
    }

    fn same_tours_as_kool(n: usize) {
        let kool = data(&format!("kool-pretrained/cvrp_{n}"));
        let imported = import(&kool.join("epoch-99.pt"), &device()).unwrap();
        assert_eq!(imported.graph_size, Some(n));
        let expected = kool.join(format!("greedy-validation-cvrp{n}.jsonl"));
        assert_eq!(tours(&expected).len(), 128);
        same_tours(
            &kool.join("epoch-99.pt"),
            &expected,
            &format!("validation/cvrp{n}.jsonl"),
        );
    }

    /// rl4co 0.7.0's AttentionModel (d = 64, 4 heads, 2 layers, batch norm), trained
    /// briefly and decoded by rl4co: `benches/reference/rl4co_fixture.py`.
    #[test]
    fn rl4co_model_gives_rl4co_tours() {
        let rl4co = data("rl4co");
        let imported = import(&rl4co.join("am-cvrp20.ckpt"), &device()).unwrap();
        let c = &imported.config;
        assert_eq!((c.embed_dim, c.num_heads, c.num_layers), (64, 4, 2));
        assert_eq!(
            (c.feed_forward_dim, c.normalization),
            (256, Normalization::Batch)
        );
        assert!(c.attention_bias);
        same_tours(
            &rl4co.join("am-cvrp20.ckpt"),
            &rl4co.join("greedy-cvrp20.jsonl"),
            "validation/cvrp20.jsonl",
        );
    }

    /// A Kool checkpoint named `.ckpt` and a damaged rl4co checkpoint: errors that name
    /// the file and what it lacks.
    #[test]
    fn bad_rl4co_checkpoints_are_clear_errors() {
        let dir = scratch("rl4co");
        std::fs::copy(
            data("kool-pretrained/cvrp_20/epoch-99.pt"),
            dir.join("kool.ckpt"),
        )
        .unwrap();
        let e = import_err(&dir.join("kool.ckpt"));
        assert!(
            e.contains("kool.ckpt") && e.contains("hyper_parameters"),
            "{e}"
        );
        // Lightning's own file: what to do about it.
        let e = import_err(&data("rl4co/am-cvrp20-lightning.ckpt"));
        assert!(
            e.contains("am-cvrp20-lightning.ckpt")
                && e.contains("python -c")
                && e.contains("'state_dict'"),
            "{e}"
        );
        let ckpt = std::fs::read(data("rl4co/am-cvrp20.ckpt")).unwrap();
        std::fs::write(dir.join("cut.ckpt"), &ckpt[..ckpt.len() / 2]).unwrap();
        let e = import_err(&dir.join("cut.ckpt"));
        assert!(e.contains("cut.ckpt"), "{e}");
        std::fs::remove_dir_all(dir).ok();
    }

    #[test]
    fn kools_cvrp20_model_gives_kools_tours() {
        same_tours_as_kool(20);
    }

    #[test]
    fn kools_cvrp50_and_cvrp100_models_give_kools_tours() {
        same_tours_as_kool(50);
        same_tours_as_kool(100);
    }

    /// Exact integer loads differ from Kool's float32 fractions exactly where a customer
    /// fills the vehicle: the model decodes other tours on some instances, so the test
    /// above depends on the arithmetic.
    #[test]
    fn exact_loads_change_kools_tours() {
        let device = device();
        let pt = data("kool-pretrained/cvrp_20/epoch-99.pt");
        let mut imported = import(&pt, &device).unwrap();
        imported.config.load_arithmetic = LoadArithmetic::Exact;
        let exact = imported.config.model_config().init(&device);
        let mut exact = exact;
        let weights = imported
            .model
            .collect(None, None, false)
            .into_iter()
            .collect::<Vec<_>>();
        let result = exact.apply(weights, None, None, false);
        assert!(result.errors.is_empty());
        let records = read_jsonl(data("validation/cvrp20.jsonl")).unwrap();
        let batch = Batch::from_instances(records.iter().map(|r| &r.instance)).unwrap();
        let problem = DeviceBatch::upload(&batch, None, &device);
        let a = imported
            .model
            .decode(&problem, &DecodeOptions::greedy())
            .actions;
        let b = exact.decode(&problem, &DecodeOptions::greedy()).actions;
        let [(a, _), (b, _)] = download_ints(vec![a, b], "tours")
            .unwrap()
            .try_into()
            .unwrap();
        assert_ne!(a, b);
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("routeburn-import-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn import_err(path: &Path) -> String {
        match import(path, &device()) {
            Ok(_) => panic!("{} imported", path.display()),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_checkpoints_are_clear_errors() {
        let kool = data("kool-pretrained/cvrp_20");
        let args = std::fs::read_to_string(kool.join("args.json")).unwrap();
        let pt = std::fs::read(kool.join("epoch-99.pt")).unwrap();

        // Not a PyTorch file at all.
        let dir = scratch("garbage");
        std::fs::write(dir.join("args.json"), &args).unwrap();
        std::fs::write(dir.join("model.pt"), b"this is not a pickle").unwrap();
        let e = import_err(&dir.join("model.pt"));
        assert!(
            e.contains("model.pt") && e.contains("not a PyTorch checkpoint"),
            "{e}"
        );

        // A truncated checkpoint.
        std::fs::write(dir.join("cut.pt"), &pt[..pt.len() / 2]).unwrap();
        let e = import_err(&dir.join("cut.pt"));
        assert!(e.contains("cut.pt"), "{e}");

        // No args.json beside it.
        let lonely = scratch("lonely");
        std::fs::write(lonely.join("epoch-99.pt"), &pt).unwrap();
        let e = import_err(&lonely.join("epoch-99.pt"));
        assert!(e.contains("args.json"), "{e}");

        // args.json of another size: the first parameter that disagrees, with both shapes.
        let other = scratch("other-size");
        std::fs::write(other.join("epoch-99.pt"), &pt).unwrap();
        std::fs::write(
            other.join("args.json"),
            args.replace("\"embedding_dim\": 128", "\"embedding_dim\": 64"),
        )
        .unwrap();
        let e = import_err(&other.join("epoch-99.pt"));
        assert!(
            e.contains("expects shape [2, 64]")
                && e.contains("`init_embed_depot.weight` gives [2, 128]"),
            "{e}"
        );

        // A checkpoint of another model or problem.
        std::fs::write(
            other.join("args.json"),
            args.replace("\"problem\": \"cvrp\"", "\"problem\": \"tsp\""),
        )
        .unwrap();
        let e = import_err(&other.join("epoch-99.pt"));
        assert!(e.contains("tsp") && e.contains("args.json"), "{e}");
        for d in [dir, lonely, other] {
            std::fs::remove_dir_all(d).ok();
        }
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

    use std::path::PathBuf;

    use super::*;
    use crate::mutate::{config, mutated};

    fn kool20() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/kool-pretrained/cvrp_20")
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..config() })]

        /// Any mutation of Kool's checkpoint imports or gives an error naming the file.
        #[test]
        fn pytorch_checkpoints_never_panic(bytes in mutated(vec![std::fs::read(kool20().join("epoch-99.pt")).unwrap()])) {
            let dir = std::env::temp_dir().join(format!("routeburn-pt-fuzz-{}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::copy(kool20().join("args.json"), dir.join("args.json")).unwrap();
            std::fs::write(dir.join("m.pt"), &bytes).unwrap();
            let device = routeburn_model::Backend::first_on_host().unwrap().device().unwrap();
            let result = import(&dir.join("m.pt"), &device);
            std::fs::remove_dir_all(&dir).ok();
            if let Err(e) = result {
                prop_assert!(e.to_string().contains("m.pt") || e.to_string().contains("args.json"), "{}", e);
            }
        }
    }
}
