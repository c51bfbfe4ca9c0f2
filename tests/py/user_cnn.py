"""A training script as a PyTorch user writes one, made elastic with
ringd.torch (tests/test-client-torch-user.c, client_python_torch_user_cnn).

A residual CNN with BatchNorm and dropout on sklearn's digits, AdamW with
two parameter groups, warm-up + cosine LambdaLR, clipping through
synchronize()/skip_synchronize(), bf16 CPU autocast, elastic.DataLoader
with 2 workers; the global batch stays --global (24) whatever the world
size (on_reset sets each rank's share). Also run under ringrun on ring
daemons (tests/test-client-torch-nodes.c).

--mode ringd: one trainer (logs every step, see user_job.py); --mode
ref: one process, the
same global batches, no ringd; --check LOG...: every completed epoch saw
each sample exactly once, and the trainers logged the same learning rate
at each step; --loss A B TOL: the final losses of two runs within TOL.
"""
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import user_job

N, WARMUP, TOTAL = 480, 10, 200


def digits():
    from sklearn.datasets import load_digits
    d = load_digits()
    x = torch.tensor(d.data[:N], dtype=torch.float32).view(-1, 1, 8, 8) / 16
    return torch.utils.data.TensorDataset(x, torch.tensor(d.target[:N]))


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c1, self.b1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.c2, self.b2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        y = F.relu(self.b1(self.c1(x)))
        return F.relu(x + self.b2(self.c2(y)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1),
                                  nn.BatchNorm2d(8), nn.ReLU())
        self.block = Block(8)
        self.drop = nn.Dropout(0.1)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        x = self.block(self.stem(x))
        return self.head(self.drop(x.mean((2, 3))))


def setup():
    torch.manual_seed(0)
    model = Net()
    decay = [p for n, p in model.named_parameters() if p.dim() > 1]
    other = [p for n, p in model.named_parameters() if p.dim() <= 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": other, "weight_decay": 0.0}],
                            lr=3e-3)

    def warmup_cosine(i):
        if i < WARMUP:
            return (i + 1) / WARMUP
        return 0.5 * (1 + math.cos(math.pi * min(1.0, (i - WARMUP) /
                                                 (TOTAL - WARMUP))))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
    return model, opt, sched


def loss_of(model, x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    return F.cross_entropy(out.float(), y)


def eval_loss(model, data):
    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        loss = float(F.cross_entropy(model(x), y))
    model.train()
    return loss


def run_ringd(o):
    import ringd.torch as rt
    from ringd.torch import elastic
    log = user_job.open_log(o)
    rt.init(o.socket, name="user_cnn")
    data = digits()
    model, opt, sched = setup()
    sampler = elastic.ElasticSampler(data, batch_size=o.global_batch // 2,
                                     seed=1)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler,
                          lr_scheduler=sched)
    dopt = rt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                   model=model)
    loader = elastic.DataLoader(data, sampler, num_workers=2)

    def reset(world):
        sampler.batch_size = o.global_batch // world  # the same global batch
    state.register_reset_callbacks([reset])

    def step(state, v):
        if v.restored and not getattr(step, "told", False):
            log.write("restored %d\n" % v.step)
        step.told = True
        reset(v.world)
        x, y = loader.batch()
        dopt.zero_grad()
        loss_of(model, x, y).backward()
        dopt.synchronize()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        with dopt.skip_synchronize():
            dopt.step()
        sched.step()
        user_job.log_step(log, v, sampler, opt.param_groups[0]["lr"],
                          o.pace_ms)

    v = elastic.run(step, state, steps=user_job.stop_limit(o))
    log.write("final digest %s lr %r loss %.6f step %d\n" %
              (state.digest(), opt.param_groups[0]["lr"],
               eval_loss(model, data), v.step))
    log.close()
    rt.client().close()


def run_ref(o):
    data = digits()
    model, opt, sched = setup()
    user_job.run_ref(o, data, model, opt, sched, loss_of, eval_loss, 1.0, 1)


if __name__ == "__main__":
    sys.exit(user_job.main(__doc__, N, 24, run_ringd, run_ref))
