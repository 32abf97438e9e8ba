"""Decode a `routeburn export` with the other project's own code and compare its greedy
tours with a `routeburn eval --out` CSV of the same model on the same instances.

    python benches/reference/export_check.py kool EXPORT_DIR DATA.jsonl EVAL.csv \
        --kool-repo PATH [--n-heads H --feed-forward F]
    python benches/reference/export_check.py rl4co EXPORT_DIR DATA.jsonl EVAL.csv

kool: PATH is a checkout of wouterkool/attention-learn-to-route (MIT). His `load_model`
builds the model from EXPORT_DIR/args.json and loads the highest epoch-N.pt there with
`torch.load`. `--n-heads`/`--feed-forward` give the two sizes his code fixes (8 and 512),
for models exported with others.

rl4co: rl4co 0.7.0's `AttentionModelPolicy(**policy_kwargs)` with the file's state dict
loaded strictly (the `policy.` prefix dropped), decoding in rl4co's `CVRPEnv`.

Prints the agreement and both mean costs; exits 1 if any tour differs.
"""
import argparse
import json
import os
import sys

import torch


def kool_decode(a, records):
    sys.path.insert(0, a.kool_repo)
    import nets.attention_model as am
    from utils import load_model

    if (a.n_heads, a.feed_forward) != (8, 512):
        # Kool's load_model passes neither size on: the two places his code would be
        # edited for them.
        def sized(init, **sizes):
            return lambda self, *args, **kw: init(self, *args, **{**kw, **sizes})

        am.AttentionModel.__init__ = sized(am.AttentionModel.__init__, n_heads=a.n_heads)
        am.GraphAttentionEncoder.__init__ = sized(
            am.GraphAttentionEncoder.__init__, feed_forward_hidden=a.feed_forward)
    model, _ = load_model(a.export_dir)
    model.set_decode_type("greedy")
    batch = {
        "depot": torch.tensor([r["depot"] for r in records], dtype=torch.float),
        "loc": torch.tensor([r["customers"] for r in records], dtype=torch.float),
        # As Kool's VRPDataset: float32 demands divided by the capacity.
        "demand": torch.tensor([r["demands"] for r in records], dtype=torch.float)
        / torch.tensor([[float(r["capacity"])] for r in records]),
    }
    with torch.no_grad():
        cost, _, pi = model(batch, return_pi=True)
    return pi.tolist(), cost.tolist()


def rl4co_decode(a, records):
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from rl4co.envs import CVRPEnv
    from rl4co.models import AttentionModelPolicy
    from rl4co_reference import load_jsonl

    c = torch.load(os.path.join(a.export_dir, "policy.ckpt"), weights_only=True)
    policy = AttentionModelPolicy(**c["hyper_parameters"]["policy_kwargs"])
    policy.load_state_dict({k.removeprefix("policy."): v for k, v in c["state_dict"].items()})
    policy.eval()
    _, td = load_jsonl(a.data)
    env = CVRPEnv(generator_params={"num_loc": len(records[0]["customers"])})
    with torch.inference_mode():
        out = policy(env.reset(td), env, phase="test", decode_type="greedy", return_actions=True)
    return out["actions"].tolist(), (-out["reward"]).tolist()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("format", choices=["kool", "rl4co"])
    for name in ["export_dir", "data", "eval_csv"]:
        p.add_argument(name)
    p.add_argument("--kool-repo")
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--feed-forward", type=int, default=512)
    a = p.parse_args()
    torch.set_num_threads(2)
    records = [json.loads(line) for line in open(a.data)]
    ours = {}
    for line in open(a.eval_csv).read().splitlines()[1:]:
        f = line.split(",")
        ours[f[0]] = ([int(x) for x in f[6].split()], float(f[2]))
    actions, costs = (kool_decode if a.format == "kool" else rl4co_decode)(a, records)
    for row in actions:
        while row and row[-1] == 0:
            row.pop()
    same = sum(ours[r["name"]][0] == t for r, t in zip(records, actions))
    print(f"{a.export_dir}: {a.format}'s code, greedy, {len(records)} instances of {a.data}")
    print(f"  same tours as routeburn eval: {same}/{len(records)}")
    print(f"  mean cost: {a.format}'s code {sum(costs) / len(costs):.6f}, "
          f"routeburn {sum(ours[r['name']][1] for r in records) / len(records):.6f}")
    sys.exit(0 if same == len(records) else 1)


if __name__ == "__main__":
    main()
