"""Decode a `routeburn export` directory with Kool et al.'s own code and compare its greedy
tours with a `routeburn eval --out` CSV of the same model on the same instances.

    python benches/reference/kool_export_check.py KOOL_REPO EXPORT_DIR DATA.jsonl EVAL.csv \
        [--n-heads H --feed-forward F]

KOOL_REPO is a checkout of wouterkool/attention-learn-to-route (MIT). Its `load_model`
builds the model from EXPORT_DIR/args.json and loads the highest epoch-N.pt there with
`torch.load`. `--n-heads`/`--feed-forward` give the two sizes his code fixes (8 and 512),
for models exported with others. Prints the file's load check, the agreement and both mean
costs; exits 1 if any tour differs.
"""
import argparse
import json
import sys

import torch


def kool_tours(repo, export_dir, records, n_heads, feed_forward):
    sys.path.insert(0, repo)
    import nets.attention_model as am
    from utils import load_model

    if (n_heads, feed_forward) != (8, 512):
        # Kool's load_model passes neither size on: the two places his code would be
        # edited for them.
        def sized(init, **sizes):
            return lambda self, *args, **kw: init(self, *args, **{**kw, **sizes})

        am.AttentionModel.__init__ = sized(am.AttentionModel.__init__, n_heads=n_heads)
        am.GraphAttentionEncoder.__init__ = sized(
            am.GraphAttentionEncoder.__init__, feed_forward_hidden=feed_forward)
    model, _ = load_model(export_dir)
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
    tours = []
    for row in pi.tolist():
        while row and row[-1] == 0:
            row.pop()
        tours.append(row)
    return tours, cost.tolist()


def main():
    p = argparse.ArgumentParser()
    for a in ["repo", "export_dir", "data", "eval_csv"]:
        p.add_argument(a)
    p.add_argument("--n-heads", type=int, default=8)
    p.add_argument("--feed-forward", type=int, default=512)
    a = p.parse_args()
    records = [json.loads(l) for l in open(a.data)]
    ours = {}
    for line in open(a.eval_csv).read().splitlines()[1:]:
        f = line.split(",")
        ours[f[0]] = ([int(x) for x in f[6].split()], float(f[2]))
    torch.set_num_threads(2)
    tours, costs = kool_tours(a.repo, a.export_dir, records, a.n_heads, a.feed_forward)
    same = sum(ours[r["name"]][0] == t for r, t in zip(records, tours))
    print(f"{a.export_dir}: Kool's code, greedy, {len(records)} instances of {a.data}")
    print(f"  same tours as routeburn eval: {same}/{len(records)}")
    print(f"  mean cost: Kool's code {sum(costs) / len(costs):.6f}, "
          f"routeburn {sum(ours[r['name']][1] for r in records) / len(records):.6f}")
    sys.exit(0 if same == len(records) else 1)


if __name__ == "__main__":
    main()
