"""Makes routeburn's rl4co import fixture: a small rl4co 0.7.0 AttentionModel for CVRP20,
trained briefly, saved as a Lightning checkpoint, and the greedy tours rl4co decodes with it.

Setup (PyPI):  python3 -m venv venv && venv/bin/pip install rl4co==0.7.0
Run from the repository root:
  venv/bin/python benches/reference/rl4co_fixture.py --out data/rl4co

Writes `am-cvrp20-lightning.ckpt`, the checkpoint as Lightning saves it (weights only);
`am-cvrp20.ckpt`, its policy weights and `policy_kwargs` extracted as routeburn's README
says (burn-store's PyTorch reader refuses the whole Lightning file: its
`hyper_parameters` pickle rl4co's environment object, with tensors); and
`greedy-cvrp20.jsonl`: for the first `--instances` instances of
data/validation/cvrp20.jsonl, rl4co's greedy `actions` (customer indices, 0 for the depot,
trailing depot returns dropped) and `cost` (-reward).
"""

import argparse
import json
import os
import sys

import torch


def instances(path, count):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rl4co_reference import load_jsonl

    records, td = load_jsonl(path)
    return records[:count], td[:count]


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default="data/rl4co")
    p.add_argument("--data", default="data/validation/cvrp20.jsonl")
    p.add_argument("--instances", type=int, default=128)
    p.add_argument("--batches", type=int, default=100)
    args = p.parse_args()
    torch.manual_seed(1234)
    torch.set_num_threads(2)

    import lightning as L
    from rl4co.envs import CVRPEnv
    from rl4co.models import AttentionModel

    env = CVRPEnv(generator_params={"num_loc": 20})
    # Smaller than rl4co's default (d = 128, 8 heads) to keep the fixture small; batch
    # normalisation (the default) so that running statistics are part of the import.
    model = AttentionModel(
        env,
        baseline="exponential",
        policy_kwargs={"embed_dim": 64, "num_heads": 4, "num_encoder_layers": 2, "feedforward_hidden": 256},
        batch_size=64,
        train_data_size=64 * args.batches,
        val_data_size=64,
        optimizer_kwargs={"lr": 1e-3},
    )
    trainer = L.Trainer(
        max_epochs=1,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
    )
    trainer.fit(model)
    os.makedirs(args.out, exist_ok=True)
    lightning_ckpt = os.path.join(args.out, "am-cvrp20-lightning.ckpt")
    trainer.save_checkpoint(lightning_ckpt, weights_only=True)
    # The extraction the README gives to users, verbatim.
    c = torch.load(lightning_ckpt, weights_only=False)
    torch.save(
        {"state_dict": c["state_dict"], "hyper_parameters": {"policy_kwargs": c["hyper_parameters"].get("policy_kwargs", {})}},
        os.path.join(args.out, "am-cvrp20.ckpt"),
    )

    records, td = instances(args.data, args.instances)
    policy = model.policy.eval()
    with torch.inference_mode():
        out = policy(env.reset(td), env, phase="test", decode_type="greedy", return_actions=True)
    with open(os.path.join(args.out, "greedy-cvrp20.jsonl"), "w") as f:
        for r, actions, reward in zip(records, out["actions"].tolist(), out["reward"].tolist()):
            while actions and actions[-1] == 0:
                actions.pop()
            f.write(json.dumps({"name": r["name"], "cost": -reward, "actions": actions}) + "\n")
    gap = sum(-rw / r["reference_cost"] - 1 for r, rw in zip(records, out["reward"].tolist()))
    print(f"rl4co greedy on {len(records)} instances: gap {100 * gap / len(records):.2f}%")


if __name__ == "__main__":
    main()
