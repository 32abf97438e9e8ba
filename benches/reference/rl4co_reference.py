"""The PyTorch reference for routeburn's speed comparisons: rl4co 0.7.0's AttentionModel.

Setup (PyPI):  python3 -m venv venv && venv/bin/pip install rl4co==0.7.0
Run on a quiet machine, e.g.:
  venv/bin/python benches/reference/rl4co_reference.py forward --threads 2
  venv/bin/python benches/reference/rl4co_reference.py train --n 10 --batch 128 --batches 25 --epochs 3 --threads 2
  venv/bin/python benches/reference/rl4co_reference.py train ... --precision 16-mixed
  # routeburn's configs/cvrp20_cpu.toml, 30 minutes, then the greedy gap on cvrp20.jsonl:
  venv/bin/python benches/reference/rl4co_reference.py train --n 20 --batch 128 --batches 50 \
      --epochs 20 --lr 5e-4 --lr-decay 0.98 --val-size 1000 --max-minutes 30 \
      --eval data/validation/cvrp20.jsonl

  # rl4co's POMO: training throughput beside routeburn's (benches/reference/pomo_throughput.sh):
  venv/bin/python benches/reference/rl4co_reference.py pomo --n 20 --batch 64 --batches 20 --threads 2

`forward`: encode + full greedy decode of batch 512 at n = 20, 50, 100 (instances/s),
the figure routeburn's `model` bench measures; `--chunk 64` decodes the same 512
instances in batches of 64 (rl4co's fastest batch for CVRP100 on a 2-core CPU).
`train`: seconds per epoch of REINFORCE with the rollout baseline, Kool's model
(d = 128, 8 heads, 3 layers), the same batch and epoch size as routeburn's configs.
"""

import argparse
import time

import torch


def forward(args):
    from rl4co.envs import CVRPEnv
    from rl4co.models import AttentionModelPolicy

    chunk = args.chunk
    for n in (20, 50, 100):
        env = CVRPEnv(generator_params={"num_loc": n})
        policy = AttentionModelPolicy(env_name="cvrp").eval()
        tds = [env.reset(batch_size=[chunk]) for _ in range(512 // chunk)]
        with torch.inference_mode():
            policy(tds[0].clone(), env, phase="test", decode_type="greedy")  # warm-up
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                for td in tds:
                    policy(td.clone(), env, phase="test", decode_type="greedy")
                times.append(time.perf_counter() - start)
        best = min(times)
        print(
            f"rl4co forward n={n} 512 instances in batches of {chunk}: {best:.3f} s, "
            f"{512 / best:.0f} instances/s"
        )


def patch_rollout_baseline():
    """With the packages pip resolves for rl4co 0.7.0 today (torch 2.15, tensordict 0.14),
    the policy's decode leaves the reset state finished, and REINFORCE then hands that state
    to the rollout baseline, which fails from epoch 2 ("No logprobs were collected because
    all environments were done"). Decode a copy instead: the same computation plus one
    small clone per batch."""
    from rl4co.models.rl.reinforce.reinforce import REINFORCE

    def shared_step(self, batch, batch_idx, phase, dataloader_idx=None):
        td = self.env.reset(batch)
        out = self.policy(td.clone(), self.env, phase=phase, select_best=phase != "train")
        if phase == "train":
            out = self.calculate_loss(td, batch, out)
        metrics = self.log_metrics(out, phase, dataloader_idx=dataloader_idx)
        return {"loss": out.get("loss", None), **metrics}

    REINFORCE.shared_step = shared_step


def sync(args):
    """Waits for the GPU's queued work, so that a host clock times it."""
    if args.accelerator == "gpu":
        torch.cuda.synchronize()


def lightning_trainer(args, epochs, callback, **extra):
    """A Lightning trainer on `--accelerator` (the CPU by default, `gpu` for gpu-check) with
    routeburn's gradient clipping (1.0), no logger, checkpoints or progress bar, stopped by
    `--max-minutes` if given."""
    import lightning as L

    return L.Trainer(
        max_epochs=epochs,
        accelerator=args.accelerator,
        devices=1,
        precision=args.precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[callback],
        gradient_clip_val=1.0,
        max_time=None if args.max_minutes is None else {"minutes": args.max_minutes},
        **extra,
    )


def train(args):
    import lightning as L
    from rl4co.envs import CVRPEnv
    from rl4co.models import AttentionModel

    patch_rollout_baseline()

    class EpochTimer(L.Callback):
        """Prints each epoch's training time, and its whole time (training, validation and
        the rollout baseline's end-of-epoch test: start to next start), the figure that
        routeburn's metrics.csv `seconds` column gives."""

        def __init__(self):
            self.previous = None

        def on_train_epoch_start(self, trainer, module):
            now = time.perf_counter()
            if self.previous is not None:
                print(f"rl4co epoch {trainer.current_epoch}: {now - self.previous:.2f} s in all")
            self.previous = self.start = now

        def on_train_epoch_end(self, trainer, module):
            print(f"rl4co epoch {trainer.current_epoch + 1}: {time.perf_counter() - self.start:.2f} s training")

    env = CVRPEnv(generator_params={"num_loc": args.n})
    scheduler = {}
    if args.lr_decay != 1.0:
        scheduler = dict(lr_scheduler="ExponentialLR", lr_scheduler_kwargs={"gamma": args.lr_decay})
    model = AttentionModel(
        env,
        baseline="rollout",
        batch_size=args.batch,
        train_data_size=args.batch * args.batches,
        val_data_size=args.val_size,
        optimizer_kwargs={"lr": args.lr},
        **scheduler,
    )
    trainer = lightning_trainer(args, args.epochs, EpochTimer())
    start = time.perf_counter()
    trainer.fit(model)
    print(f"rl4co trained {trainer.current_epoch} epochs in {time.perf_counter() - start:.0f} s")
    if args.eval:
        evaluate(model.policy.eval(), env, args.eval)


def pomo(args):
    """rl4co's POMO at routeburn's model size (d = 128, 8 heads, 3 layers, instance
    normalisation, the graph context kept as routeburn's model has it). Training
    throughput, timed per batch with the first `--warmup` batches left out; with
    `--max-minutes` and `--eval`, routeburn's budget recipe (configs/cvrp20_25min.toml:
    epochs of `--batches`, Adam at `--lr` decayed by `--lr-decay` per epoch) and then its
    gaps on a routeburn JSONL set by greedy, multistart and multistart+aug8. The recipe now
    decays to `lr_final` = 1e-4 by the clock; rl4co's ~130 epochs in 25 minutes on a Zen 5
    at 0.986 end near 1.6e-4, close to it."""
    import lightning as L
    from rl4co.envs import CVRPEnv
    from rl4co.models import POMO

    class BatchTimer(L.Callback):
        def __init__(self):
            self.times = []

        def on_train_batch_start(self, trainer, module, batch, batch_idx):
            sync(args)
            self.start = time.perf_counter()

        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            sync(args)
            self.times.append(time.perf_counter() - self.start)

    env = CVRPEnv(generator_params={"num_loc": args.n})
    scheduler = {}
    if args.lr_decay != 1.0:
        scheduler = dict(lr_scheduler="ExponentialLR", lr_scheduler_kwargs={"gamma": args.lr_decay})
    budget = args.max_minutes is not None
    model = POMO(
        env,
        policy_kwargs={
            "embed_dim": 128,
            "num_encoder_layers": 3,
            "num_heads": 8,
            "normalization": "instance",
            "use_graph_context": True,
        },
        batch_size=args.batch,
        train_data_size=args.batch * (args.batches + (0 if budget else args.warmup)),
        val_data_size=args.batch,
        num_augment=1,
        optimizer_kwargs={"lr": args.lr, "weight_decay": 1e-6},
        **scheduler,
    )
    timer = BatchTimer()
    trainer = lightning_trainer(
        args, args.epochs if budget else 1, timer, num_sanity_val_steps=0, limit_val_batches=0
    )
    start = time.perf_counter()
    trainer.fit(model)
    timed = timer.times[args.warmup:]
    step = sum(timed) / len(timed)
    print(
        f"rl4co pomo n={args.n} batch={args.batch} x {args.n} starts: {len(timed)} steps, "
        f"{step:.3f} s/step, {args.batch / step:.1f} instances/s, "
        f"{args.batch * args.n / step:.0f} trajectories/s"
    )
    if budget:
        print(f"rl4co pomo trained {len(timer.times)} steps in {time.perf_counter() - start:.0f} s")
    if args.eval:
        evaluate_pomo(model.policy.eval(), env, args.eval, args.n)


def evaluate_pomo(policy, env, path, n):
    """Greedy (one rollout, the policy's own first move), multistart (best of n forced
    first customers) and multistart+aug8 (also over the 8 dihedral transforms) gaps, as
    routeburn computes them: mean(cost / reference - 1)."""
    from rl4co.data.transforms import StateAugmentation
    from rl4co.utils.ops import unbatchify

    records, td = load_jsonl(path)
    refs = torch.tensor([r["reference_cost"] for r in records])
    with torch.inference_mode():
        greedy = -policy(env.reset(td.clone()), env, phase="test", decode_type="greedy")["reward"]
        out = policy(env.reset(td.clone()), env, phase="test", decode_type="multistart_greedy", num_starts=n)
        multistart = -unbatchify(out["reward"], n).max(dim=-1).values
        augmented = StateAugmentation(num_augment=8)(env.reset(td.clone()))
        out = policy(augmented, env, phase="test", decode_type="multistart_greedy", num_starts=n)
        aug8 = -unbatchify(out["reward"], (8, n)).amax(dim=(-2, -1))
    for name, costs in [("greedy", greedy), ("multistart", multistart), ("multistart+aug8", aug8)]:
        gap = 100.0 * (costs / refs - 1.0).mean().item()
        print(f"rl4co pomo {name} on {path}: mean cost {costs.mean().item():.4f}, gap {gap:.3f}%")


def load_jsonl(path):
    """A routeburn JSONL dataset as an rl4co CVRP TensorDict (demands as fractions)."""
    import json

    from tensordict.tensordict import TensorDict

    records = [json.loads(line) for line in open(path) if line.strip()]
    td = TensorDict(
        {
            "locs": torch.tensor([r["customers"] for r in records], dtype=torch.float32),
            "depot": torch.tensor([r["depot"] for r in records], dtype=torch.float32),
            "demand": torch.tensor(
                [[d / r["capacity"] for d in r["demands"]] for r in records], dtype=torch.float32
            ),
            "capacity": torch.tensor([[float(r["capacity"])] for r in records]),
        },
        batch_size=[len(records)],
    )
    return records, td


def evaluate(policy, env, path):
    """Greedy decode of a routeburn JSONL dataset; the mean gap to its reference costs,
    computed as routeburn does: mean(cost / reference - 1)."""
    records, td = load_jsonl(path)
    b = len(records)
    with torch.inference_mode():
        out = policy(env.reset(td), env, phase="test", decode_type="greedy")
    costs = (-out["reward"]).tolist()
    refs = [r["reference_cost"] for r in records]
    gap = 100.0 * sum(c / r - 1.0 for c, r in zip(costs, refs)) / b
    print(f"rl4co greedy on {path}: mean cost {sum(costs) / b:.4f}, gap {gap:.2f}%")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["forward", "train", "pomo"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--batches", type=int, default=25)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--val-size", type=int, default=128)
    p.add_argument("--precision", default="32")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--lr-decay", type=float, default=1.0)
    p.add_argument("--max-minutes", type=float, default=None)
    p.add_argument("--warmup", type=int, default=2, help="pomo: batches left out of the timing")
    p.add_argument("--chunk", type=int, default=512, choices=[512, 256, 128, 64, 32],
                   help="forward: decode the 512 instances in batches of this size")
    p.add_argument("--eval", default=None, help="a routeburn JSONL dataset with reference costs")
    p.add_argument("--accelerator", default="cpu", choices=["cpu", "gpu"],
                   help="train and pomo: Lightning's accelerator (gpu: the first CUDA device)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    {"forward": forward, "train": train, "pomo": pomo}[args.what](args)


if __name__ == "__main__":
    main()
