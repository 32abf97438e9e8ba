//! Kool's checkpoints: `{"model": state_dict}` in a `.pt`, the architecture in the
//! `args.json` his `run.py` writes beside it (embedding size, layers, normalisation, tanh
//! clipping); heads and the feed-forward width come from the tensors' shapes.
//!
//! | Kool (`state_dict["model"]`) | routeburn |
//! |---|---|
//! | `init_embed_depot`, `init_embed` (`Linear`) | `encoder.depot_embedding`, `encoder.customer_embedding` |
//! | `embedder.layers.{i}.0.module.W_{query,key,val}` `[H, d, dk]` | `…layers.{i}.attention.qkv.weight` `[d, 3d]`: head h of each at columns `(g·H + h)·dk ..` |
//! | `embedder.layers.{i}.0.module.W_out` `[H, dk, d]` | `…attention.out.weight` `[H·dk, d]` |
//! | `embedder.layers.{i}.{1,3}.normalizer` (BatchNorm1d with running statistics) | `…attention_norm`, `…feed_forward_norm` |
//! | `embedder.layers.{i}.2.module.{0,2}` (`Linear`) | `…feed_forward_in`, `…feed_forward_out` |
//! | `project_node_embeddings`, `project_fixed_context`, `project_step_context`, `project_out` | the same names |

use std::path::{Path, PathBuf};

use burn::tensor::Device;
use routeburn_model::{LoadArithmetic, Normalization};
use serde::Deserialize;

use super::{apply, normalization_named, read_state_dict, Imported, Source, Weights};
use crate::config::AttentionConfig;
use crate::error::TrainError;

/// The node embeddings (linear, with biases): Kool's names, routeburn's.
pub(crate) const EMBEDDINGS: [(&str, &str); 2] = [
    ("init_embed_depot", "encoder.depot_embedding"),
    ("init_embed", "encoder.customer_embedding"),
];

/// The decoder's linear layers (no biases), named alike in Kool's model and routeburn's.
pub(crate) const DECODER_PROJECTIONS: [&str; 4] = [
    "project_node_embeddings",
    "project_fixed_context",
    "project_step_context",
    "project_out",
];

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

/// Reads Kool's checkpoint at `path` (with `args.json` beside it).
pub(super) fn import(path: &Path, device: &Device) -> Result<Imported, TrainError> {
    let args = read_args(path)?;
    let mut source = Source {
        path,
        model: "Kool's attention model",
        tensors: read_state_dict(path, "model", "")?,
        out: vec![],
    };
    let heads = source.get("embedder.layers.0.0.module.W_query")?.shape[0];
    let feed_forward_dim = source.get("embedder.layers.0.2.module.0.bias")?.shape[0];
    let normalization = normalization_named(&args.normalization).ok_or_else(|| {
        TrainError::checkpoint(
            args_path(path),
            format!(
                "normalization `{}`: routeburn imports `batch`, `instance` or `layer`",
                args.normalization
            ),
        )
    })?;
    let config = AttentionConfig {
        embed_dim: args.embedding_dim,
        num_heads: heads,
        num_layers: args.n_encode_layers,
        feed_forward_dim,
        normalization,
        attention_bias: false,
        tanh_clipping: args.tanh_clipping,
        load_arithmetic: LoadArithmetic::Float32,
        ..AttentionConfig::default()
    };
    let mut model = config.model_config().init(device);
    for (from, to) in EMBEDDINGS {
        source.linear(from, to, true)?;
    }
    for i in 0..args.n_encode_layers {
        encoder_layer(&mut source, i, normalization)?;
    }
    for name in DECODER_PROJECTIONS {
        source.linear(name, name, false)?;
    }
    apply(&mut model, source.out, path)?;
    Ok(Imported {
        config,
        graph_size: Some(args.graph_size),
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

/// Encoder layer `i`: attention (per-head projections as column blocks), the two
/// normalisations and the feed-forward pair.
fn encoder_layer(source: &mut Source, i: usize, norm: Normalization) -> Result<(), TrainError> {
    let (from, to) = (
        format!("embedder.layers.{i}"),
        format!("encoder.layers.{i}"),
    );
    let names = ["W_query", "W_key", "W_val"].map(|w| format!("{from}.0.module.{w}"));
    let qkv = [
        source.get(&names[0])?,
        source.get(&names[1])?,
        source.get(&names[2])?,
    ];
    let per_head = qkv[0].shape.len() == 3 && qkv.iter().all(|w| w.shape == qkv[0].shape);
    if !per_head {
        return Err(source.shape_error(
            &names[0],
            "[heads, d, dk] (the same for W_key and W_val)",
            &qkv[0].shape,
        ));
    }
    let qkv = heads_to_columns(&qkv);
    let out_name = format!("{from}.0.module.W_out");
    let w_out = source.get(&out_name)?;
    let [h, dk, d] = w_out.shape[..] else {
        return Err(source.shape_error(&out_name, "[heads, dk, d]", &w_out.shape));
    };
    let out = Weights {
        shape: vec![h * dk, d],
        values: w_out.values.clone(),
        from: w_out.from.clone(),
    };
    source.out.push((format!("{to}.attention.qkv.weight"), qkv));
    source.out.push((format!("{to}.attention.out.weight"), out));
    source.norm(
        &format!("{from}.1.normalizer"),
        &format!("{to}.attention_norm"),
        norm,
    )?;
    source.linear(
        &format!("{from}.2.module.0"),
        &format!("{to}.feed_forward_in"),
        true,
    )?;
    source.linear(
        &format!("{from}.2.module.2"),
        &format!("{to}.feed_forward_out"),
        true,
    )?;
    source.norm(
        &format!("{from}.3.normalizer"),
        &format!("{to}.feed_forward_norm"),
        norm,
    )
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

#[cfg(test)]
mod tests {
    use super::*;

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
    }
}
