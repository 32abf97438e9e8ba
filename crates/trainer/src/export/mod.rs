//! Trained attention models as Kool et al.'s PyTorch checkpoints
//! (wouterkool/attention-learn-to-route): `epoch-N.pt` holding `{"model": state_dict}` and
//! the `args.json` his `load_model` builds the model from. The inverse of
//! [`crate::import::kool`]: the same table of names, read from right to left, so that
//! Kool's published models come back out as the tensors they went in as.
//!
//! Kool's code fixes 8 heads and a 512-wide feed-forward, and knows batch and instance
//! normalisation only; models without attention biases are the ones it can hold.

pub(crate) mod torch_file;

use std::collections::HashMap;

use burn::store::ModuleSnapshot;
use burn::tensor::DType;
use routeburn_model::{AttentionModel, LoadArithmetic, Normalization};
use serde::Serialize;

use crate::config::AttentionConfig;
use crate::import::kool::DECODER_PROJECTIONS;
use crate::import::norm_parameters;
use torch_file::NamedTensor;

/// Heads and feed-forward width of Kool's `AttentionModel` (`n_heads=8`, and its
/// `GraphAttentionEncoder`'s `feed_forward_hidden=512`): `load_model` passes neither.
const KOOL_HEADS: usize = 8;
const KOOL_FEED_FORWARD: usize = 512;

/// A model as Kool's files, and what a user of them should know.
pub(crate) struct KoolCheckpoint {
    /// `args.json`.
    pub(crate) args: String,
    /// `epoch-N.pt`.
    pub(crate) weights: Vec<u8>,
    /// Where Kool's code would not decode as routeburn does without a change.
    pub(crate) warnings: Vec<String>,
}

/// The keys of `args.json` that Kool's `load_model` and routeburn's import read.
#[derive(Serialize)]
struct KoolArgs {
    problem: &'static str,
    model: &'static str,
    graph_size: usize,
    embedding_dim: usize,
    hidden_dim: usize,
    n_encode_layers: usize,
    normalization: &'static str,
    tanh_clipping: f64,
}

/// Kool's files for `model` (built from `config`) trained on `graph_size` customers, or
/// why Kool's model cannot hold it.
pub(crate) fn kool_checkpoint(
    model: &AttentionModel,
    config: &AttentionConfig,
    graph_size: usize,
) -> Result<KoolCheckpoint, String> {
    let normalization = match config.normalization {
        Normalization::Batch => "batch",
        Normalization::Instance => "instance",
        Normalization::Layer => {
            return Err(
                "layer normalisation: Kool's code has batch and instance normalisation only".into(),
            )
        }
    };
    if config.attention_bias {
        return Err("attention biases (`model.attention_bias`, rl4co's models): Kool's attention projections have none".into());
    }
    let args = KoolArgs {
        problem: "cvrp",
        model: "attention",
        graph_size,
        embedding_dim: config.embed_dim,
        hidden_dim: config.embed_dim,
        n_encode_layers: config.num_layers,
        normalization,
        tanh_clipping: config.tanh_clipping,
    };
    let tensors = kool_state_dict(model, config)?;
    let weights = torch_file::state_dict_file("model", &tensors)
        .map_err(|e| format!("writing the PyTorch archive: {e}"))?;
    Ok(KoolCheckpoint {
        args: serde_json::to_string_pretty(&args).expect("plain values serialise") + "\n",
        weights,
        warnings: warnings(config),
    })
}

fn warnings(config: &AttentionConfig) -> Vec<String> {
    let mut warnings = vec![];
    if (config.num_heads, config.feed_forward_dim) != (KOOL_HEADS, KOOL_FEED_FORWARD) {
        warnings.push(format!(
            "this model has {} heads and a {}-wide feed-forward; Kool's `load_model` builds {KOOL_HEADS} and {KOOL_FEED_FORWARD} and will report a size mismatch: it loads there with `n_heads={}` passed to `AttentionModel` and `feed_forward_hidden={}` to its `GraphAttentionEncoder` (routeburn's `import` reads it as it is)",
            config.num_heads, config.feed_forward_dim, config.num_heads, config.feed_forward_dim
        ));
    }
    if config.load_arithmetic == LoadArithmetic::Exact {
        warnings.push(
            "this model was trained with exact integer loads (`model.load_arithmetic = \"exact\"`); Kool's code compares loads as float32 fractions of the capacity, so its tours can differ where a customer exactly fills the vehicle"
                .into(),
        );
    }
    warnings
}

/// Kool's state dict, in his model's order, from routeburn's parameters: every one of
/// them placed exactly once.
fn kool_state_dict(
    model: &AttentionModel,
    config: &AttentionConfig,
) -> Result<Vec<NamedTensor>, String> {
    let mut params = Params::of(model)?;
    params.linear("encoder.depot_embedding", "init_embed_depot", true)?;
    params.linear("encoder.customer_embedding", "init_embed", true)?;
    for i in 0..config.num_layers {
        params.encoder_layer(i, config)?;
    }
    for name in DECODER_PROJECTIONS {
        params.linear(name, name, false)?;
    }
    match params.remaining.keys().min() {
        Some(left) => Err(format!("routeburn's `{left}` has no place in Kool's model")),
        None => Ok(params.out),
    }
}

/// routeburn's parameters not yet placed, and Kool's tensors made from them so far.
struct Params {
    remaining: HashMap<String, (Vec<usize>, Vec<f32>)>,
    out: Vec<NamedTensor>,
}

impl Params {
    fn of(model: &AttentionModel) -> Result<Self, String> {
        let mut remaining = HashMap::new();
        for t in model.collect(None, None, false) {
            if t.dtype != DType::F32 {
                return Err(format!(
                    "`{}` is {:?}; Kool's model is float32",
                    t.name, t.dtype
                ));
            }
            let (name, _, shape, _, bytes) = t.into_parts().map_err(|e| e.to_string())?;
            let values = bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            remaining.insert(name, (shape.to_vec(), values));
        }
        Ok(Self {
            remaining,
            out: vec![],
        })
    }

    fn take(&mut self, name: &str) -> Result<(Vec<usize>, Vec<f32>), String> {
        self.remaining
            .remove(name)
            .ok_or_else(|| format!("routeburn's attention model has no `{name}`"))
    }

    fn push(&mut self, name: String, shape: Vec<usize>, values: Vec<f32>) {
        self.out.push(NamedTensor {
            name,
            shape,
            values,
        });
    }

    /// Burn's `[in, out]` linear weight as PyTorch's `[out, in]`, the bias as it is.
    fn linear(&mut self, from: &str, to: &str, bias: bool) -> Result<(), String> {
        let (shape, w) = self.take(&format!("{from}.weight"))?;
        let [rows, cols] = shape[..] else {
            return Err(format!(
                "`{from}.weight` has shape {shape:?}, not [in, out]"
            ));
        };
        let transposed = (0..cols)
            .flat_map(|c| (0..rows).map(move |r| (r, c)))
            .map(|(r, c)| w[r * cols + c])
            .collect();
        self.push(format!("{to}.weight"), vec![cols, rows], transposed);
        if bias {
            let (shape, b) = self.take(&format!("{from}.bias"))?;
            self.push(format!("{to}.bias"), shape, b);
        }
        Ok(())
    }

    /// A normaliser as Kool's `normalizer`: batch norm with its running statistics.
    fn norm(&mut self, from: &str, to: &str, norm: Normalization) -> Result<(), String> {
        let (variant, stats) = norm_parameters(norm);
        for (ours, kools) in [("gamma", "weight"), ("beta", "bias")]
            .into_iter()
            .chain(stats.iter().map(|s| (*s, *s)))
        {
            let (shape, values) = self.take(&format!("{from}.{variant}.{ours}"))?;
            self.push(format!("{to}.{kools}"), shape, values);
        }
        Ok(())
    }

    /// Encoder layer `i`: the attention's column blocks as Kool's per-head projections,
    /// then the normalisations and the feed-forward pair around it.
    fn encoder_layer(&mut self, i: usize, config: &AttentionConfig) -> Result<(), String> {
        let (from, to) = (
            format!("encoder.layers.{i}"),
            format!("embedder.layers.{i}"),
        );
        let (shape, qkv) = self.take(&format!("{from}.attention.qkv.weight"))?;
        let heads = config.num_heads;
        let [d, width] = shape[..] else {
            return Err(format!(
                "`{from}.attention.qkv.weight` has shape {shape:?}, not [d, 3d]"
            ));
        };
        let dk = width / (3 * heads);
        for (g, w) in ["W_query", "W_key", "W_val"].into_iter().enumerate() {
            let values = columns_to_heads(&qkv, d, heads, dk, g);
            self.push(format!("{to}.0.module.{w}"), vec![heads, d, dk], values);
        }
        // `[H·dk, d]` and Kool's `[H, dk, d]` share their row-major layout.
        let (_, out) = self.take(&format!("{from}.attention.out.weight"))?;
        self.push(format!("{to}.0.module.W_out"), vec![heads, dk, d], out);
        let norm = config.normalization;
        self.norm(
            &format!("{from}.attention_norm"),
            &format!("{to}.1.normalizer"),
            norm,
        )?;
        self.linear(
            &format!("{from}.feed_forward_in"),
            &format!("{to}.2.module.0"),
            true,
        )?;
        self.linear(
            &format!("{from}.feed_forward_out"),
            &format!("{to}.2.module.2"),
            true,
        )?;
        self.norm(
            &format!("{from}.feed_forward_norm"),
            &format!("{to}.3.normalizer"),
            norm,
        )
    }
}

/// Projection `g` (0 queries, 1 keys, 2 values) of the `[d, 3·H·dk]` weight as Kool's
/// `[H, d, dk]`: `W_g[h][i][k]` is column `(g·H + h)·dk + k` of row `i`, the inverse of
/// the import's `heads_to_columns`.
fn columns_to_heads(qkv: &[f32], d: usize, heads: usize, dk: usize, g: usize) -> Vec<f32> {
    let width = 3 * heads * dk;
    (0..heads)
        .flat_map(|h| (0..d).flat_map(move |i| (0..dk).map(move |k| (h, i, k))))
        .map(|(h, i, k)| qkv[i * width + (g * heads + h) * dk + k])
        .collect()
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use burn::store::pytorch::PytorchReader;
    use routeburn_model::Backend;

    use super::*;
    use crate::import::import;

    fn kool(n: usize) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../../data/kool-pretrained/cvrp_{n}"))
    }

    fn scratch(name: &str) -> PathBuf {
        let dir =
            std::env::temp_dir().join(format!("routeburn-export-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// Every tensor of the file's `model` state dict: its bytes by name, and its shape.
    fn state_dict(path: &Path) -> HashMap<String, (Vec<usize>, Vec<u8>)> {
        PytorchReader::with_top_level_key(path, "model")
            .unwrap()
            .into_tensors()
            .into_iter()
            .map(|(name, t)| (name, (t.shape().to_vec(), t.read().unwrap())))
            .collect()
    }

    /// The hand case of the import's `heads_become_column_blocks`, read back: H = 2 heads,
    /// d = 2, dk = 1, `W_g[h][i][0] = 100 g + 10 h + i`.
    #[test]
    fn column_blocks_become_heads() {
        let qkv = [
            0., 10., 100., 110., 200., 210., 1., 11., 101., 111., 201., 211.,
        ];
        for g in 0..3 {
            let expected: Vec<f32> = (0..2)
                .flat_map(|h| (0..2).map(move |i| (100 * g + 10 * h + i) as f32))
                .collect();
            assert_eq!(
                columns_to_heads(&qkv, 2, 2, 1, g),
                expected,
                "projection {g}"
            );
        }
    }

    /// Kool's published CVRP models, imported and exported, are Kool's files again: the
    /// same names, shapes and float32 bits (read by burn-store's PyTorch reader from his
    /// legacy file and from the zip file written here), and his `args.json`'s architecture.
    #[test]
    fn kools_models_come_back_out_as_his_files() {
        let device = Backend::default_compiled().unwrap().device().unwrap();
        for n in [20, 100] {
            let original = kool(n).join("epoch-99.pt");
            let imported = import(&original, &device).unwrap();
            let out = kool_checkpoint(&imported.model, &imported.config, n).unwrap();
            assert!(out.warnings.is_empty(), "{:?}", out.warnings);
            let dir = scratch(&format!("kool{n}"));
            std::fs::write(dir.join("epoch-99.pt"), &out.weights).unwrap();
            std::fs::write(dir.join("args.json"), &out.args).unwrap();

            let (ours, his) = (state_dict(&dir.join("epoch-99.pt")), state_dict(&original));
            assert_eq!(ours.len(), his.len(), "cvrp_{n}: tensor count");
            for (name, tensor) in &his {
                assert!(ours.get(name) == Some(tensor), "cvrp_{n}: `{name}` differs");
            }
            let args = |p: &Path| -> serde_json::Value {
                serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
            };
            let (ours, his) = (
                args(&dir.join("args.json")),
                args(&kool(n).join("args.json")),
            );
            for key in [
                "problem",
                "model",
                "graph_size",
                "embedding_dim",
                "hidden_dim",
                "n_encode_layers",
                "normalization",
                "tanh_clipping",
            ] {
                assert_eq!(ours[key], his[key], "cvrp_{n}: args.json `{key}`");
            }
            // routeburn's own import reads the export as it read Kool's file.
            let again = import(&dir.join("epoch-99.pt"), &device).unwrap();
            assert_eq!(again.config, imported.config);
            std::fs::remove_dir_all(dir).ok();
        }
    }

    #[test]
    fn what_kools_model_cannot_hold_is_refused_or_warned_about() {
        let device = Backend::default_compiled().unwrap().device().unwrap();
        let export = |config: &AttentionConfig| {
            let model = config.model_config().init(&device);
            kool_checkpoint(&model, config, 20)
        };
        let small = AttentionConfig {
            embed_dim: 16,
            num_heads: 4,
            num_layers: 1,
            feed_forward_dim: 32,
            ..AttentionConfig::default()
        };
        let layer = AttentionConfig {
            normalization: Normalization::Layer,
            ..small.clone()
        };
        let e = export(&layer).err().unwrap();
        assert!(e.contains("layer normalisation"), "{e}");
        let biased = AttentionConfig {
            attention_bias: true,
            ..small.clone()
        };
        let e = export(&biased).err().unwrap();
        assert!(e.contains("attention_bias"), "{e}");
        // Another width of heads and feed-forward, exact loads: written, with both said.
        let out = export(&small).unwrap();
        assert_eq!(out.warnings.len(), 2, "{:?}", out.warnings);
        assert!(
            out.warnings[0].contains("n_heads=4")
                && out.warnings[0].contains("feed_forward_hidden=32")
        );
        assert!(out.warnings[1].contains("float32"));
    }
}
