//! rl4co's `AttentionModel` Lightning checkpoints (`.ckpt`, zip format): the weights under
//! `state_dict` with the prefix `policy.`, the architecture in
//! `hyper_parameters.policy_kwargs` (rl4co 0.7.0's defaults where a key is absent).
//!
//! | rl4co (`state_dict["policy.…"]`) | routeburn |
//! |---|---|
//! | `encoder.init_embedding.init_embed_depot`, `….init_embed` | `encoder.depot_embedding`, `encoder.customer_embedding` |
//! | `encoder.net.layers.{i}.0.module.Wqkv` `[3d, d]` (with bias) | `…layers.{i}.attention.qkv` `[d, 3d]`: the same q, k, v, head-major blocks |
//! | `encoder.net.layers.{i}.0.module.out_proj` (with bias) | `…attention.out` |
//! | `encoder.net.layers.{i}.{1,3}.normalizer` | `…attention_norm`, `…feed_forward_norm` |
//! | `encoder.net.layers.{i}.2.module.lins.{0,1}` | `…feed_forward_in`, `…feed_forward_out` |
//! | `decoder.project_node_embeddings`, `decoder.project_fixed_context` | the same names |
//! | `decoder.context_embedding.project_context` `[d, d + 1]` | `project_step_context` |
//! | `decoder.pointer.project_out` | `project_out` |
//!
//! rl4co's attention projections have biases where Kool's have none, so the imported
//! model sets `attention_bias`. Its CVRP environment masks a customer only when its demand
//! exceeds the remaining capacity by more than 1e-5, so an exact fit is allowed, as with
//! routeburn's exact integer loads (`LoadArithmetic::Exact`; Kool's code needs `Float32`). Options routeburn's model does not
//! have (no graph context, biases in the decoder, an unmasked glimpse, other
//! normalisations) are refused by name.

use std::path::Path;

use burn::store::pytorch::{PickleError, PytorchError, PytorchReader};
use burn::tensor::Device;
use routeburn_model::{LoadArithmetic, Normalization};
use serde::Deserialize;

use super::{apply, normalization_named, read_state_dict, Imported, Source};
use crate::config::AttentionConfig;
use crate::error::TrainError;

/// The node embeddings (linear, with biases): rl4co's names (under `policy.`),
/// routeburn's.
pub(crate) const EMBEDDINGS: [(&str, &str); 2] = [
    (
        "encoder.init_embedding.init_embed",
        "encoder.customer_embedding",
    ),
    (
        "encoder.init_embedding.init_embed_depot",
        "encoder.depot_embedding",
    ),
];

/// The decoder's linear layers (no biases): rl4co's names (under `policy.`), routeburn's.
pub(crate) const DECODER_PROJECTIONS: [(&str, &str); 4] = [
    ("decoder.project_node_embeddings", "project_node_embeddings"),
    ("decoder.project_fixed_context", "project_fixed_context"),
    (
        "decoder.context_embedding.project_context",
        "project_step_context",
    ),
    ("decoder.pointer.project_out", "project_out"),
];

/// The checkpoint's hyper-parameters that shape the policy.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct HyperParameters {
    policy_kwargs: PolicyKwargs,
}

/// rl4co 0.7.0's `AttentionModelPolicy` arguments, with its defaults.
#[derive(Debug, Deserialize)]
#[serde(default)]
struct PolicyKwargs {
    env_name: Option<String>,
    embed_dim: usize,
    num_heads: usize,
    num_encoder_layers: usize,
    normalization: Option<String>,
    feedforward_hidden: usize,
    tanh_clipping: f64,
    use_graph_context: bool,
    mask_inner: bool,
    linear_bias_decoder: bool,
    out_bias_pointer_attn: bool,
}

impl Default for PolicyKwargs {
    fn default() -> Self {
        Self {
            env_name: None,
            embed_dim: 128,
            num_heads: 8,
            num_encoder_layers: 3,
            normalization: Some("batch".into()),
            feedforward_hidden: 512,
            tanh_clipping: 10.0,
            use_graph_context: true,
            mask_inner: true,
            linear_bias_decoder: false,
            out_bias_pointer_attn: false,
        }
    }
}

/// The Python that makes a Lightning checkpoint readable: its state dict and policy
/// arguments, without the pickled environment.
pub(crate) const EXTRACT: &str = "python -c \"import sys, torch; c = torch.load(sys.argv[1], weights_only=False); torch.save({'state_dict': c['state_dict'], 'hyper_parameters': {'policy_kwargs': c['hyper_parameters'].get('policy_kwargs', {})}}, sys.argv[2])\" IN.ckpt OUT.ckpt";

/// rl4co's checkpoints do not record the instance size (the environment is pickled as an
/// object); runs made from one get this `[problem] n`.
pub(crate) const ASSUMED_GRAPH_SIZE: usize = 20;

/// Reads rl4co's checkpoint at `path`.
pub(super) fn import(path: &Path, device: &Device) -> Result<Imported, TrainError> {
    let kwargs = read_policy_kwargs(path)?;
    let normalization = normalization(path, &kwargs)?;
    let config = AttentionConfig {
        embed_dim: kwargs.embed_dim,
        num_heads: kwargs.num_heads,
        num_layers: kwargs.num_encoder_layers,
        feed_forward_dim: kwargs.feedforward_hidden,
        normalization,
        attention_bias: true,
        tanh_clipping: kwargs.tanh_clipping,
        load_arithmetic: LoadArithmetic::Exact,
        ..AttentionConfig::default()
    };
    let mut source = Source {
        path,
        model: "rl4co's AttentionModel (keys `policy.…` under `state_dict`)",
        tensors: read_state_dict(path, "state_dict", "policy.")?,
        out: vec![],
    };
    for (from, to) in EMBEDDINGS {
        source.linear(from, to, true)?;
    }
    for i in 0..kwargs.num_encoder_layers {
        let (from, to) = (
            format!("encoder.net.layers.{i}"),
            format!("encoder.layers.{i}"),
        );
        let attention = format!("{from}.0.module");
        source.linear(
            &format!("{attention}.Wqkv"),
            &format!("{to}.attention.qkv"),
            true,
        )?;
        source.linear(
            &format!("{attention}.out_proj"),
            &format!("{to}.attention.out"),
            true,
        )?;
        let norm = |k| format!("{from}.{k}.normalizer");
        source.norm(&norm(1), &format!("{to}.attention_norm"), normalization)?;
        source.linear(
            &format!("{from}.2.module.lins.0"),
            &format!("{to}.feed_forward_in"),
            true,
        )?;
        source.linear(
            &format!("{from}.2.module.lins.1"),
            &format!("{to}.feed_forward_out"),
            true,
        )?;
        source.norm(&norm(3), &format!("{to}.feed_forward_norm"), normalization)?;
    }
    for (from, to) in DECODER_PROJECTIONS {
        source.linear(from, to, false)?;
    }
    let mut model = config.model_config().init(device);
    apply(&mut model, source.out, path)?;
    Ok(Imported {
        config,
        graph_size: None,
        model,
    })
}

/// `hyper_parameters.policy_kwargs`, checked for what routeburn's model can represent.
fn read_policy_kwargs(path: &Path) -> Result<PolicyKwargs, TrainError> {
    let hyper: HyperParameters = PytorchReader::load_config(path, Some("hyper_parameters"))
        .map_err(|e| {
            let message = match e {
                // Lightning pickles rl4co's environment (torchrl specs holding tensors)
                // into `hyper_parameters`, and burn-store's reader refuses such objects.
                PytorchError::Pickle(PickleError::UnsupportedType(t)) => format!(
                    "a Lightning checkpoint whose hyper_parameters hold a Python object with tensors (`{t}`: rl4co's environment), which burn-store's PyTorch reader cannot read; extract the policy once in Python: {EXTRACT}"
                ),
                e => format!("not a Lightning checkpoint with rl4co's `hyper_parameters`: {e}"),
            };
            TrainError::checkpoint(path, message)
        })?;
    let k = hyper.policy_kwargs;
    let refuse = |what: &str| {
        Err(TrainError::checkpoint(
            path,
            format!("policy_kwargs {what}: routeburn's attention model has no such option"),
        ))
    };
    if k.env_name.as_deref().is_some_and(|e| e != "cvrp") {
        return Err(TrainError::checkpoint(
            path,
            format!(
                "a policy for `{}`: routeburn imports CVRP policies",
                k.env_name.unwrap_or_default()
            ),
        ));
    }
    match () {
        _ if !k.use_graph_context => refuse("use_graph_context = False"),
        _ if !k.mask_inner => refuse("mask_inner = False"),
        _ if k.linear_bias_decoder => refuse("linear_bias_decoder = True"),
        _ if k.out_bias_pointer_attn => refuse("out_bias_pointer_attn = True"),
        _ if k.num_heads == 0 || !k.embed_dim.is_multiple_of(k.num_heads) => refuse(&format!(
            "embed_dim = {} with num_heads = {}",
            k.embed_dim, k.num_heads
        )),
        _ => Ok(k),
    }
}

fn normalization(path: &Path, k: &PolicyKwargs) -> Result<Normalization, TrainError> {
    let name = k.normalization.as_deref();
    name.and_then(normalization_named).ok_or_else(|| {
        TrainError::checkpoint(
            path,
            format!(
                "policy_kwargs normalization = {name:?}: routeburn imports `batch`, `instance` or `layer`"
            ),
        )
    })
}
