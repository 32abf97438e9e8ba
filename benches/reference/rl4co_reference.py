"""The PyTorch reference for routeburn's speed comparisons: rl4co 0.7.0's AttentionModel.

Setup (PyPI):  python3 -m venv venv && venv/bin/pip install rl4co==0.7.0
Run on a quiet machine, e.g.:
  venv/bin/python benches/reference/rl4co_reference.py forward --threads 2
  venv/bin/python benches/reference/rl4co_reference.py train --n 10 --batch 128 --batches 25 --epochs 3 --threads 2
  venv/bin/python benches/reference/rl4co_reference.py train ... --precision 16-mixed

`forward`: encode + full greedy decode of batch 512 at n = 20, 50, 100 (instances/s),
the figure routeburn's `model` bench measures.
`train`: seconds per epoch of REINFORCE with the rollout baseline, Kool's model
(d = 128, 8 heads, 3 layers), the same batch and epoch size as routeburn's configs.
"""

import argparse
import time

import torch


def forward(args):
    from rl4co.envs import CVRPEnv
    from rl4co.models import AttentionModelPolicy

    for n in (20, 50, 100):
        env = CVRPEnv(generator_params={"num_loc": n})
        policy = AttentionModelPolicy(env_name="cvrp").eval()
        td = env.reset(batch_size=[512])
        with torch.inference_mode():
            policy(td.clone(), env, phase="test", decode_type="greedy")  # warm-up
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                policy(td.clone(), env, phase="test", decode_type="greedy")
                times.append(time.perf_counter() - start)
        best = min(times)
        print(f"rl4co forward n={n} batch=512: {best:.3f} s, {512 / best:.0f} instances/s")


def train(args):
    import lightning as L
    from rl4co.envs import CVRPEnv
    from rl4co.models import AttentionModel

    class EpochTimer(L.Callback):
        def on_train_epoch_start(self, trainer, module):
            self.start = time.perf_counter()

        def on_train_epoch_end(self, trainer, module):
            print(f"rl4co epoch {trainer.current_epoch + 1}: {time.perf_counter() - self.start:.2f} s")

    env = CVRPEnv(generator_params={"num_loc": args.n})
    model = AttentionModel(
        env,
        baseline="rollout",
        batch_size=args.batch,
        train_data_size=args.batch * args.batches,
        val_data_size=args.val_size,
        optimizer_kwargs={"lr": 1e-4},
    )
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=1,
        precision=args.precision,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[EpochTimer()],
        gradient_clip_val=1.0,
    )
    trainer.fit(model)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", choices=["forward", "train"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--n", type=int, default=10)
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--batches", type=int, default=25)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--val-size", type=int, default=128)
    p.add_argument("--precision", default="32")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    forward(args) if args.what == "forward" else train(args)


if __name__ == "__main__":
    main()
