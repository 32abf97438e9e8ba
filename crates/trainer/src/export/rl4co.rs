//! rl4co's checkpoints (0.7.0's `AttentionModelPolicy`): `policy.ckpt` holding
//! `{"state_dict": {"policy.…": tensor}, "hyper_parameters": {"policy_kwargs": {...}}}`,
//! the form routeburn's README has users extract from a Lightning checkpoint, and the
//! inverse of [`crate::import::rl4co`].
//!
//! rl4co's encoder attention always has biases: a model trained here without them gets
//! zeros there, which computes the same. Its environment lets a customer that exactly
//! fills the vehicle through, as routeburn's `exact` load arithmetic does.

use routeburn_model::{AttentionModel, LoadArithmetic};
use serde_json::json;

use super::{torch_file, ExportError, Exported, Params};
use crate::config::AttentionConfig;
use crate::import::normalization_name;
use crate::import::rl4co::{DECODER_PROJECTIONS, EMBEDDINGS};

/// rl4co's file for `model` (built from `config`), or why rl4co's policy cannot hold it.
pub(super) fn checkpoint(
    model: &AttentionModel,
    config: &AttentionConfig,
) -> Result<Exported, ExportError> {
    let policy_kwargs = json!({
        "env_name": "cvrp",
        "embed_dim": config.embed_dim,
        "num_heads": config.num_heads,
        "num_encoder_layers": config.num_layers,
        "normalization": normalization_name(config.normalization),
        "feedforward_hidden": config.feed_forward_dim,
        "tanh_clipping": config.tanh_clipping,
        "use_graph_context": true,
        "mask_inner": true,
        "linear_bias_decoder": false,
        "out_bias_pointer_attn": false,
    });
    let tensors = state_dict(model, config)?;
    let hyper_parameters = json!({ "policy_kwargs": policy_kwargs });
    let file = torch_file::state_dict_file(
        "state_dict",
        &tensors,
        &[("hyper_parameters", hyper_parameters)],
    )?;
    let mut warnings = vec![];
    if config.load_arithmetic == LoadArithmetic::Float32 {
        warnings.push(
            "this model decodes with Kool's float32 load arithmetic (`model.load_arithmetic = \"float32\"`: imported from his code); rl4co's environment lets a customer that exactly fills the vehicle through, so its tours can differ there"
                .into(),
        );
    }
    Ok(Exported {
        files: vec![("policy.ckpt".into(), file)],
        warnings,
    })
}

/// rl4co's state dict, in its policy's order, every routeburn parameter placed once.
fn state_dict(
    model: &AttentionModel,
    config: &AttentionConfig,
) -> Result<Vec<torch_file::NamedTensor>, ExportError> {
    let mut params = Params::of(model)?;
    for (theirs, ours) in EMBEDDINGS {
        params.linear(ours, &format!("policy.{theirs}"), true)?;
    }
    for i in 0..config.num_layers {
        let (from, to) = (
            format!("encoder.layers.{i}"),
            format!("policy.encoder.net.layers.{i}"),
        );
        let d = config.embed_dim;
        for (ours, theirs, width) in [("qkv", "Wqkv", 3 * d), ("out", "out_proj", d)] {
            let (ours, theirs) = (
                format!("{from}.attention.{ours}"),
                format!("{to}.0.module.{theirs}"),
            );
            params.linear(&ours, &theirs, config.attention_bias)?;
            if !config.attention_bias {
                params.push(format!("{theirs}.bias"), vec![width], vec![0.0; width]);
            }
        }
        let feed_forward = ["lins.0", "lins.1"];
        params.norms_and_feed_forward(&from, &to, feed_forward, config.normalization)?;
    }
    for (theirs, ours) in DECODER_PROJECTIONS {
        params.linear(ours, &format!("policy.{theirs}"), false)?;
    }
    params.finish("rl4co's policy")
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use burn::store::pytorch::PytorchReader;
    use burn::store::ModuleSnapshot;
    use routeburn_model::Backend;

    use super::*;
    use crate::export::tests::{scratch, small_config, state_dict as read_state_dict};
    use crate::import::import;

    fn fixture() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../data/rl4co/am-cvrp20.ckpt")
    }

    /// The rl4co fixture (written by rl4co and PyTorch), imported and exported: the same
    /// float32 tensors by name, shape and bits (batch norm's `num_batches_tracked`
    /// counters aside: routeburn keeps none, and PyTorch fills them in on load), its
    /// `policy_kwargs` read back by burn-store's reader, and the same config imported.
    #[test]
    fn the_rl4co_fixture_comes_back_out_as_its_file() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let imported = import(&fixture(), &device).unwrap();
        let out = checkpoint(&imported.model, &imported.config).unwrap();
        assert!(out.warnings.is_empty(), "{:?}", out.warnings);
        let dir = scratch("rl4co");
        let [(name, bytes)] = &out.files[..] else {
            panic!("one file")
        };
        let path = dir.join(name);
        std::fs::write(&path, bytes).unwrap();
        let ours = read_state_dict(&path, "state_dict");
        let theirs = read_state_dict(&fixture(), "state_dict");
        let counters = theirs
            .keys()
            .filter(|k| k.ends_with("num_batches_tracked"))
            .count();
        assert_eq!(counters, 4);
        assert_eq!(ours.len() + counters, theirs.len());
        for (name, tensor) in theirs
            .iter()
            .filter(|(k, _)| !k.ends_with("num_batches_tracked"))
        {
            assert!(ours.get(name) == Some(tensor), "`{name}` differs");
        }
        let kwargs: serde_json::Value =
            PytorchReader::load_config(&path, Some("hyper_parameters")).unwrap();
        let kwargs = &kwargs["policy_kwargs"];
        assert_eq!(kwargs["embed_dim"], 64);
        assert_eq!(kwargs["num_heads"], 4);
        assert_eq!(kwargs["tanh_clipping"], 10.0);
        assert_eq!(kwargs["use_graph_context"], true);
        let again = import(&path, &device).unwrap();
        assert_eq!(again.config, imported.config);
        std::fs::remove_dir_all(dir).ok();
    }

    /// A model without attention biases (trained here) gets zero biases, which rl4co's
    /// layers add to the same products: imported back, it is the same model.
    #[test]
    fn models_without_attention_biases_get_zeros() {
        let device = Backend::first_on_host().unwrap().device().unwrap();
        let config = small_config(2);
        let model = config.model_config().init(&device);
        let out = checkpoint(&model, &config).unwrap();
        let dir = scratch("rl4co-zeros");
        let path = dir.join(&out.files[0].0);
        std::fs::write(&path, &out.files[0].1).unwrap();
        let tensors = read_state_dict(&path, "state_dict");
        let (shape, bytes) = &tensors["policy.encoder.net.layers.0.0.module.Wqkv.bias"];
        assert_eq!(shape, &[48]);
        assert!(bytes.iter().all(|&b| b == 0));
        let again = import(&path, &device).unwrap();
        assert!(again.config.attention_bias);
        let weights = |m: &AttentionModel| {
            m.collect(None, None, false)
                .into_iter()
                .filter(|t| !t.name.contains(".bias") || !t.name.contains("attention."))
                .map(|t| (t.name.clone(), t.into_bytes().unwrap().to_vec()))
                .collect::<std::collections::BTreeMap<_, _>>()
        };
        assert_eq!(weights(&again.model), weights(&model));
        std::fs::remove_dir_all(dir).ok();
    }
}
