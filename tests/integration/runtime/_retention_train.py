"""A real, tiny torch training run for the retention test: learn task A for `--switch` steps,
then task B, reporting `eval_loss` on task A at every checkpoint step. The eval loss falls until
the switch and rises after it, so the best checkpoint is the one at the switch."""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn

from tensoryard.runtime import session


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--switch", type=int, default=20)
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds; spreads the reports")
    args = p.parse_args()
    torch.manual_seed(0)
    w_a = torch.randn(8, 1)
    x_eval = torch.randn(256, 8)
    model = nn.Linear(8, 1, bias=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    with session(device="cpu") as sess:
        for step in sess.loop(args.steps, model, opt):
            x = torch.randn(64, 8)
            target = x @ (w_a if step <= args.switch else -w_a)
            loss = nn.functional.mse_loss(model(x), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            values = {"loss": float(loss)}
            if sess.checkpointer.should_save(step):
                with torch.no_grad():
                    eval_loss = nn.functional.mse_loss(model(x_eval), x_eval @ w_a)
                values["eval_loss"] = float(eval_loss)
            sess.report(step, **values)
            time.sleep(args.step_sleep)


if __name__ == "__main__":
    main()
