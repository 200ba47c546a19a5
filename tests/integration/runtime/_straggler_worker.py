"""A torchrun worker for test_runtime_stragglers: rank 1's forward is 3x slower for steps
1-40, then normal; session.loop must name it as a straggler, then its recovery."""

from __future__ import annotations

import time

import torch
from torch import nn

from tensoryard.runtime import session


class Model(nn.Module):
    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank
        self.step = 0
        self.linear = nn.Linear(8, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        slow = self.rank == 1 and self.step <= 40
        time.sleep(0.03 if slow else 0.01)
        return self.linear(x)


def main() -> None:
    with session(interval=1000, stop_check_every=5, final_checkpoint=False) as sess:
        model = Model(sess.dist.rank)
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        for step in sess.loop(70, ddp, opt):
            model.step = step
            loss = ddp(torch.randn(4, 8)).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            sess.report(step, loss=float(loss))


if __name__ == "__main__":
    main()
