//! PyTorch checkpoints of Kool et al.'s attention model (wouterkool/attention-learn-to-route)
//! as routeburn attention models: the same weights give the same tours.
//!
//! The file is read by burn-store's PyTorch reader (the legacy pickle format of Kool's
//! published `epoch-99.pt` as well as the zip format), the architecture from the
//! `args.json` Kool's `run.py` writes beside it (embedding size, layers, normalisation,
//! tanh clipping); heads and the feed-forward width come from the tensors' shapes. Every
//! parameter is mapped by name and checked against the shape routeburn expects before
//! anything is applied:
//!
//! | Kool (`state_dict["model"]`) | routeburn |
//! |---|---|
//! | `init_embed_depot`, `init_embed` (`Linear`) | `encoder.depot_embedding`, `encoder.customer_embedding` |
//! | `embedder.layers.{i}.0.module.W_{query,key,val}` `[H, d, dk]` | `…layers.{i}.attention.qkv.weight` `[d, 3d]`: head h of each at columns `(g·H + h)·dk ..` |
//! | `embedder.layers.{i}.0.module.W_out` `[H, dk, d]` | `…attention.out.weight` `[H·dk, d]` |
//! | `embedder.layers.{i}.{1,3}.normalizer` (BatchNorm1d with running statistics) | `…attention_norm`, `…feed_forward_norm` |
//! | `embedder.layers.{i}.2.module.{0,2}` (`Linear`) | `…feed_forward_in`, `…feed_forward_out` |
//! | `project_node_embeddings`, `project_fixed_context`, `project_step_context`, `project_out` | the same names |
//!
//! PyTorch's `Linear` weights are `[out, in]` and Burn's `[in, out]`: they are transposed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use burn::store::pytorch::PytorchReader;
use burn::store::pytorch_reader::DType;
use burn::store::{bridge, ModuleSnapshot};
use burn::tensor::{Device, TensorData};
use routeburn_model::{AttentionModel, LoadArithmetic, Normalization};
use serde::Deserialize;

use crate::config::AttentionConfig;
use crate::error::TrainError;

/// An imported model and what it was trained for.
pub(crate) struct Imported {
    pub(crate) config: AttentionConfig,
    /// Customers per instance of Kool's training run (`graph_size`).
    pub(crate) graph_size: usize,
    pub(crate) model: AttentionModel,
}

/// The keys of Kool's `args.json` that shape the model.
#[derive(Debug, Deserialize)]
struct KoolArgs {
    problem: String,
    model: String,
    embedding_dim: usize,
    n_encode_layers: usize,
    normalization: String,
    tanh_clipping: f64,
    graph_size: usize,
}

/// A float tensor of the checkpoint: shape and values, and the name it had there.
struct Weights {
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

/// Reads the checkpoint at `path` (with `args.json` beside it) into an attention model on
/// `device`.
pub(crate) fn import(path: &Path, device: &Device) -> Result<Imported, TrainError> {
    let args = read_args(path)?;
    let tensors = read_state_dict(path)?;
    let source = KoolTensors { path, tensors };
    let heads = source.get("embedder.layers.0.0.module.W_query")?.shape[0];
    let feed_forward_dim = source.get("embedder.layers.0.2.module.0.bias")?.shape[0];
    let normalization = match args.normalization.as_str() {
        "batch" => Normalization::Batch,
        "instance" => Normalization::Instance,
        other => {
            return Err(TrainError::checkpoint(
                args_path(path),
                format!("normalization `{other}`: routeburn imports `batch` or `instance`"),
            ))
        }
    };
    let config = AttentionConfig {
        embed_dim: args.embedding_dim,
        num_heads: heads,
        num_layers: args.n_encode_layers,
        feed_forward_dim,
        normalization,
        tanh_clipping: args.tanh_clipping,
        load_arithmetic: LoadArithmetic::Float32,
    };
    let mut model = config.model_config().init(device);
    let mapped = source.mapped(args.n_encode_layers, normalization)?;
    apply(&mut model, mapped, path)?;
    Ok(Imported {
        config,
        graph_size: args.graph_size,
        model,
    })
}

fn args_path(path: &Path) -> PathBuf {
    path.with_file_name("args.json")
}

fn read_args(path: &Path) -> Result<KoolArgs, TrainError> {
    let args_path = args_path(path);
    let text = std::fs::read_to_string(&args_path).map_err(|e| {
        TrainError::checkpoint(
            path,
            format!(
                "cannot read {} beside it ({e}): Kool's run.py writes the architecture there",
                args_path.display()
            ),
        )
    })?;
    let args: KoolArgs = serde_json::from_str(&text)
        .map_err(|e| TrainError::checkpoint(&args_path, format!("not Kool's args.json: {e}")))?;
    if args.problem != "cvrp" || args.model != "attention" {
        return Err(TrainError::checkpoint(
            &args_path,
            format!(
                "a `{}` model for `{}`: routeburn imports Kool's `attention` model for `cvrp`",
                args.model, args.problem
            ),
        ));
    }
    Ok(args)
}

/// Every float tensor of the checkpoint's `model` state dict.
fn read_state_dict(path: &Path) -> Result<HashMap<String, Weights>, TrainError> {
    let not_pytorch = |e: &dyn std::fmt::Display| {
        TrainError::checkpoint(
            path,
            format!("not a PyTorch checkpoint with a `model` state dict: {e}"),
        )
    };
    let reader = PytorchReader::with_top_level_key(path, "model").map_err(|e| not_pytorch(&e))?;
    let mut tensors = HashMap::new();
    for (name, tensor) in reader.into_tensors() {
        if tensor.dtype() != DType::F32 {
            return Err(TrainError::checkpoint(
                path,
                format!(
                    "`{name}` is {:?}; routeburn imports float32 weights",
                    tensor.dtype()
                ),
            ));
        }
        let shape = tensor.shape().to_vec();
        let bytes = tensor.read().map_err(|e| not_pytorch(&e))?;
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        if values.len() != shape.iter().product::<usize>() {
            return Err(not_pytorch(&format!(
                "`{name}` holds {} values for shape {shape:?}",
                values.len()
            )));
        }
        tensors.insert(
            name.clone(),
            Weights {
                shape,
                values,
                from: name,
            },
        );
    }
    Ok(tensors)
}

/// The checkpoint's tensors, looked up by Kool's names.
struct KoolTensors<'a> {
    path: &'a Path,
    tensors: HashMap<String, Weights>,
}

impl KoolTensors<'_> {
    fn get(&self, name: &str) -> Result<&Weights, TrainError> {
        self.tensors.get(name).ok_or_else(|| {
            TrainError::checkpoint(
                self.path,
                format!("no parameter `{name}`: not a checkpoint of Kool's attention model"),
            )
        })
    }

    /// Kool's tensors under routeburn's names and in routeburn's layout.
    fn mapped(
        &self,
        layers: usize,
        norm: Normalization,
    ) -> Result<Vec<(String, Weights)>, TrainError> {
        let mut out = vec![];
        self.linear(
            &mut out,
            "init_embed_depot",
            "encoder.depot_embedding",
            true,
        )?;
        self.linear(&mut out, "init_embed", "encoder.customer_embedding", true)?;
        for i in 0..layers {
            self.encoder_layer(&mut out, i, norm)?;
        }
        for name in [
            "project_node_embeddings",
            "project_fixed_context",
            "project_step_context",
            "project_out",
        ] {
            self.linear(&mut out, name, name, false)?;
        }
        Ok(out)
    }

    /// Encoder layer `i`: attention (per-head projections as column blocks), the two
    /// normalisations and the feed-forward pair.
    fn encoder_layer(
        &self,
        out: &mut Vec<(String, Weights)>,
        i: usize,
        norm: Normalization,
    ) -> Result<(), TrainError> {
        let (from, to) = (
            format!("embedder.layers.{i}"),
            format!("encoder.layers.{i}"),
        );
        let names = ["W_query", "W_key", "W_val"].map(|w| format!("{from}.0.module.{w}"));
        let qkv = [
            self.get(&names[0])?,
            self.get(&names[1])?,
            self.get(&names[2])?,
        ];
        let per_head = qkv[0].shape.len() == 3 && qkv.iter().all(|w| w.shape == qkv[0].shape);
        if !per_head {
            return Err(self.shape_error(
                &names[0],
                "[heads, d, dk] (the same for W_key and W_val)",
                &qkv[0].shape,
            ));
        }
        out.push((format!("{to}.attention.qkv.weight"), heads_to_columns(&qkv)));
        let w_out = self.get(&format!("{from}.0.module.W_out"))?;
        let [h, dk, d] = w_out.shape[..] else {
            return Err(self.shape_error(
                &format!("{from}.0.module.W_out"),
                "[heads, dk, d]",
                &w_out.shape,
            ));
        };
        out.push((
            format!("{to}.attention.out.weight"),
            Weights {
                shape: vec![h * dk, d],
                values: w_out.values.clone(),
                from: w_out.from.clone(),
            },
        ));
        self.norm(
            out,
            &format!("{from}.1.normalizer"),
            &format!("{to}.attention_norm"),
            norm,
        )?;
        self.linear(
            out,
            &format!("{from}.2.module.0"),
            &format!("{to}.feed_forward_in"),
            true,
        )?;
        self.linear(
            out,
            &format!("{from}.2.module.2"),
            &format!("{to}.feed_forward_out"),
            true,
        )?;
        self.norm(
            out,
            &format!("{from}.3.normalizer"),
            &format!("{to}.feed_forward_norm"),
            norm,
        )?;
        Ok(())
    }

    /// A PyTorch `Linear`: the weight transposed, the bias as it is.
    fn linear(
        &self,
        out: &mut Vec<(String, Weights)>,
        from: &str,
        to: &str,
        bias: bool,
    ) -> Result<(), TrainError> {
        let name = format!("{from}.weight");
        let w = self.get(&name)?;
        let [rows, cols] = w.shape[..] else {
            return Err(self.shape_error(&name, "[out, in]", &w.shape));
        };
        let values = (0..cols)
            .flat_map(|c| (0..rows).map(move |r| w.values[r * cols + c]))
            .collect();
        out.push((
            format!("{to}.weight"),
            Weights {
                shape: vec![cols, rows],
                values,
                from: name,
            },
        ));
        if bias {
            out.push((format!("{to}.bias"), self.copy(&format!("{from}.bias"))?));
        }
        Ok(())
    }

    /// Kool's normaliser: batch norm with its running statistics, or instance norm.
    fn norm(
        &self,
        out: &mut Vec<(String, Weights)>,
        from: &str,
        to: &str,
        norm: Normalization,
    ) -> Result<(), TrainError> {
        let (variant, stats): (&str, &[&str]) = match norm {
            Normalization::Batch => ("Batch", &["running_mean", "running_var"]),
            _ => ("Instance", &[]),
        };
        out.push((
            format!("{to}.{variant}.gamma"),
            self.copy(&format!("{from}.weight"))?,
        ));
        out.push((
            format!("{to}.{variant}.beta"),
            self.copy(&format!("{from}.bias"))?,
        ));
        for s in stats {
            out.push((
                format!("{to}.{variant}.{s}"),
                self.copy(&format!("{from}.{s}"))?,
            ));
        }
        Ok(())
    }

    fn copy(&self, name: &str) -> Result<Weights, TrainError> {
        let w = self.get(name)?;
        Ok(Weights {
            shape: w.shape.clone(),
            values: w.values.clone(),
            from: w.from.clone(),
        })
    }

    fn shape_error(&self, name: &str, expected: &str, found: &[usize]) -> TrainError {
        TrainError::checkpoint(
            self.path,
            format!("`{name}`: expected a {expected} tensor, found shape {found:?}"),
        )
    }
}

/// Per-head projections `[H, d, dk]` (queries, keys, values) as one `[d, 3·H·dk]` linear
/// weight whose output splits into `[3H, dk]`: column `(g·H + h)·dk + k` is `W_g[h][:, k]`.
fn heads_to_columns(projections: &[&Weights; 3]) -> Weights {
    let (h, d, dk) = (
        projections[0].shape[0],
        projections[0].shape[1],
        projections[0].shape[2],
    );
    let width = 3 * h * dk;
    let mut values = vec![0.0; d * width];
    for (g, w) in projections.iter().enumerate() {
        for head in 0..h {
            for i in 0..d {
                for k in 0..dk {
                    values[i * width + (g * h + head) * dk + k] = w.values[(head * d + i) * dk + k];
                }
            }
        }
    }
    let from = projections.map(|w| w.from.as_str()).join(", ");
    Weights {
        shape: vec![d, width],
        values,
        from,
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
                    "`{name}`: routeburn expects shape {shape:?}, the checkpoint's `{}` gives {:?} (args.json and the weights disagree?)",
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
    use burn::tensor::TensorData;
    use routeburn_data::{read_jsonl, Batch};
    use routeburn_model::{Backend, DecodeOptions, DeviceBatch};

    use super::*;
    use crate::evaluate::{download_ints, validated_costs};

    fn data(rel: &str) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../data")
            .join(rel)
    }

    fn device() -> Device {
        Backend::default_compiled().unwrap().device().unwrap()
    }

    /// What Kool's own code decodes greedily with his published model (PyTorch, CPU):
    /// `data/kool-pretrained/cvrp_N/greedy-validation-cvrpN.jsonl`.
    struct KoolTour {
        cost: f64,
        actions: Vec<i64>,
    }

    fn kool_tours(n: usize) -> Vec<KoolTour> {
        let path = data(&format!(
            "kool-pretrained/cvrp_{n}/greedy-validation-cvrp{n}.jsonl"
        ));
        std::fs::read_to_string(path)
            .unwrap()
            .lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                KoolTour {
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

    /// The imported model's greedy tours on a validation set: the same actions as Kool's
    /// code for every instance, and (through the cost crate's validator) the same costs.
    fn same_tours_as_kool(n: usize) {
        let device = device();
        let pt = data(&format!("kool-pretrained/cvrp_{n}/epoch-99.pt"));
        let imported = import(&pt, &device).unwrap();
        assert_eq!(imported.graph_size, n);
        let records = read_jsonl(data(&format!("validation/cvrp{n}.jsonl"))).unwrap();
        let instances: Vec<_> = records.iter().map(|r| &r.instance).collect();
        let batch = Batch::from_instances(instances.iter().copied()).unwrap();
        let out = imported.model.decode(
            &DeviceBatch::upload(&batch, None, &device),
            &DecodeOptions::greedy(),
        );
        let [(actions, [_, steps])] = download_ints(vec![out.actions]).try_into().unwrap();
        let costs = validated_costs(&batch, &actions, steps, 1).unwrap();
        let expected = kool_tours(n);
        assert_eq!(expected.len(), records.len());
        for (i, e) in expected.iter().enumerate() {
            let mut ours = actions[i * steps..(i + 1) * steps].to_vec();
            while ours.last() == Some(&0) {
                ours.pop();
            }
            assert_eq!(ours, e.actions, "n = {n}, instance {i}: tours differ");
            let rel = (costs[i] - e.cost).abs() / e.cost;
            assert!(
                rel < 1e-4,
                "n = {n}, instance {i}: cost {} vs {}",
                costs[i],
                e.cost
            );
        }
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
        let [(a, _), (b, _)] = download_ints(vec![a, b]).try_into().unwrap();
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

    #[test]
    fn heads_become_column_blocks() {
        // H = 2 heads, d = 2, dk = 1: W_g[h][i][0] = 100 g + 10 h + i.
        let w = |g: usize| Weights {
            from: format!("W{g}"),
            shape: vec![2, 2, 1],
            values: (0..2)
                .flat_map(|h| (0..2).map(move |i| (100 * g + 10 * h + i) as f32))
                .collect(),
        };
        let (q, k, v) = (w(0), w(1), w(2));
        let out = heads_to_columns(&[&q, &k, &v]);
        assert_eq!(out.shape, vec![2, 6]);
        // Row i, column (g·H + h)·dk.
        assert_eq!(
            out.values,
            vec![0., 10., 100., 110., 200., 210., 1., 11., 101., 111., 201., 211.]
        );
        let _ = TensorData::new(out.values, out.shape);
    }
}

#[cfg(test)]
mod fuzz {
    use proptest::prelude::*;

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
            let device = routeburn_model::Backend::default_compiled().unwrap().device().unwrap();
            if let Err(e) = import(&dir.join("m.pt"), &device) {
                prop_assert!(e.to_string().contains("m.pt") || e.to_string().contains("args.json"), "{}", e);
            }
        }
    }
}
