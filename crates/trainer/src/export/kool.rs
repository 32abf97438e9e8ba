//! Kool et al.'s checkpoints (wouterkool/attention-learn-to-route): `epoch-N.pt` holding
//! `{"model": state_dict}` and the `args.json` his `load_model` builds the model from; the
//! inverse of [`crate::import::kool`].
//!
//! Kool's code fixes 8 heads and a 512-wide feed-forward, and knows batch and instance
//! normalisation only; models without attention biases are the ones it can hold.

use routeburn_model::{AttentionModel, LoadArithmetic, Normalization};
use serde::Serialize;

use super::torch_file::{self, NamedTensor};
use super::{ExportError, Exported, Params};
use crate::config::AttentionConfig;
use crate::import::kool::{DECODER_PROJECTIONS, EMBEDDINGS};
use crate::import::normalization_name;

/// Heads and feed-forward width of Kool's `AttentionModel` (`n_heads=8`, and its
/// `GraphAttentionEncoder`'s `feed_forward_hidden=512`): `load_model` passes neither.
const KOOL_HEADS: usize = 8;
const KOOL_FEED_FORWARD: usize = 512;

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

/// Kool's files for `model` (built from `config`) trained on `graph_size` customers and
/// checkpointed after `epochs` epochs, or why Kool's model cannot hold it.
pub(super) fn checkpoint(
    model: &AttentionModel,
    config: &AttentionConfig,
    graph_size: usize,
    epochs: usize,
) -> Result<Exported, ExportError> {
    if config.normalization == Normalization::Layer {
        return Err(ExportError::Unsupported(
            "layer normalisation: Kool's code has batch and instance normalisation only",
        ));
    }
    if config.attention_bias {
        return Err(ExportError::Unsupported("attention biases (`model.attention_bias`, rl4co's models): Kool's attention projections have none"));
    }
    let args = KoolArgs {
        problem: "cvrp",
        model: "attention",
        graph_size,
        embedding_dim: config.embed_dim,
        hidden_dim: config.embed_dim,
        n_encode_layers: config.num_layers,
        normalization: normalization_name(config.normalization),
        tanh_clipping: config.tanh_clipping,
    };
    let tensors = state_dict(model, config)?;
    let weights = torch_file::state_dict_file("model", &tensors, &[])?;
    let args = serde_json::to_string_pretty(&args).expect("plain values serialise") + "\n";
    // Kool's runs number their epochs from 0: the checkpoint after 15 is epoch-14.pt.
    // The weights first: a directory with args.json in it is complete.
    let files = vec![
        (format!("epoch-{}.pt", epochs.saturating_sub(1)), weights),
        ("args.json".to_string(), args.into_bytes()),
    ];
    Ok(Exported {
        files,
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
fn state_dict(
    model: &AttentionModel,
    config: &AttentionConfig,
) -> Result<Vec<NamedTensor>, ExportError> {
    let mut params = Params::of(model)?;
    for (kools, ours) in EMBEDDINGS {
        params.linear(ours, kools, true)?;
    }
    for i in 0..config.num_layers {
        encoder_layer(&mut params, i, config)?;
    }
    for name in DECODER_PROJECTIONS {
        params.linear(name, name, false)?;
    }
    params.finish("Kool's model")
}

/// Encoder layer `i`: the attention's column blocks as Kool's per-head projections,
/// then the normalisations and the feed-forward pair around it.
fn encoder_layer(
    params: &mut Params,
    i: usize,
    config: &AttentionConfig,
) -> Result<(), ExportError> {
    let (from, to) = (
        format!("encoder.layers.{i}"),
        format!("embedder.layers.{i}"),
    );
    let (shape, qkv) = params.take(&format!("{from}.attention.qkv.weight"))?;
    let heads = config.num_heads;
    let [d, width] = shape[..] else {
        return Err(ExportError::Shape {
            name: format!("{from}.attention.qkv.weight"),
            shape,
            expected: "[d, 3d]",
        });
    };
    let dk = width / (3 * heads);
    for (g, w) in ["W_query", "W_key", "W_val"].into_iter().enumerate() {
        let values = columns_to_heads(&qkv, d, heads, dk, g);
        params.push(format!("{to}.0.module.{w}"), vec![heads, d, dk], values);
    }
    // `[H·dk, d]` and Kool's `[H, dk, d]` share their row-major layout.
    let (_, out) = params.take(&format!("{from}.attention.out.weight"))?;
    params.push(format!("{to}.0.module.W_out"), vec![heads, dk, d], out);
    params.norms_and_feed_forward(&from, &to, ["0", "2"], config.normalization)
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

    use routeburn_model::Backend;

    use super::*;
    use crate::export::tests::{scratch, small_config, state_dict};
    use crate::import::import;

    fn kool(n: usize) -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join(format!("../../data/kool-pretrained/cvrp_{n}"))
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
        let device = Backend::first_on_host().unwrap().device().unwrap();
        for n in [20, 100] {
            let original = kool(n).join("epoch-99.pt");
            let imported = import(&original, &device).unwrap();
            let out = checkpoint(&imported.model, &imported.config, n, 100).unwrap();
            assert!(out.warnings.is_empty(), "{:?}", out.warnings);
            let dir = scratch(&format!("kool{n}"));
            let names: Vec<&str> = out.files.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(names, ["epoch-99.pt", "args.json"]);
            for (name, bytes) in &out.files {
                std::fs::write(dir.join(name), bytes).unwrap();
            }

            let (ours, his) = (
                state_dict(&dir.join("epoch-99.pt"), "model"),
                state_dict(&original, "model"),
            );
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
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let export = |config: &AttentionConfig| {
            let model = config.model_config().init(&device);
            checkpoint(&model, config, 20, 1)
        };
        let small = small_config(4);
        let layer = AttentionConfig {
            normalization: Normalization::Layer,
            ..small.clone()
        };
        let e = export(&layer).err().unwrap().to_string();
        assert!(e.contains("layer normalisation"), "{e}");
        let biased = AttentionConfig {
            attention_bias: true,
            ..small.clone()
        };
        let e = export(&biased).err().unwrap().to_string();
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
