"""A small transformer language model, trained as a PyTorch user trains
one, made elastic with ringd.torch (tests/test-client-torch-nodes.c).

Characters of the Zen of Python (the `this` module: text that ships with
every Python), windows of 33 of them; a 2-layer pre-norm causal
transformer (token and learned position embeddings, dropout, the output
head tied to the token embedding), AdamW with two parameter groups (no
decay for biases, norms and embeddings), warm-up + cosine LambdaLR,
clipping through synchronize()/skip_synchronize(), bf16 CPU autocast,
elastic.DataLoader with 2 workers. The global batch stays --global
whatever the world size (on_reset sets each rank's share).

--mode ringd: one trainer (logs every step, see user_job.py); --mode ref:
one process, the same global batches, no ringd; --check LOG...: every
completed epoch saw each window exactly once, one learning rate per
step; --loss A B TOL: the final losses of two runs within TOL.
"""
import codecs
import contextlib
import io
import math
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import user_job

T, N, WARMUP, TOTAL = 32, 480, 10, 300
D, HEADS, LAYERS = 32, 4, 2


def corpus():
    with contextlib.redirect_stdout(io.StringIO()):
        import this  # its import prints the text
    text = codecs.decode(this.s, "rot13")
    vocab = sorted(set(text))
    ids = torch.tensor([vocab.index(c) for c in text])
    stride = (len(ids) - T - 1) // N
    x = torch.stack([ids[i * stride:i * stride + T + 1] for i in range(N)])
    return torch.utils.data.TensorDataset(x[:, :-1], x[:, 1:]), len(vocab)


class LM(nn.Module):
    def __init__(self, vocab):
        super().__init__()
        self.tok = nn.Embedding(vocab, D)
        self.pos = nn.Parameter(torch.zeros(T, D))
        self.drop = nn.Dropout(0.1)
        layer = nn.TransformerEncoderLayer(D, HEADS, 2 * D, dropout=0.1,
                                           batch_first=True,
                                           norm_first=True)
        self.body = nn.TransformerEncoder(layer, LAYERS,
                                          enable_nested_tensor=False)
        self.norm = nn.LayerNorm(D)
        self.head = nn.Linear(D, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied: one parameter, two uses
        nn.init.normal_(self.tok.weight, std=0.02)  # as GPT-2 does
        self.register_buffer("causal", torch.triu(
            torch.full((T, T), float("-inf")), diagonal=1), persistent=False)

    def forward(self, x):
        h = self.drop(self.tok(x) + self.pos[:x.shape[1]])
        h = self.body(h, mask=self.causal[:x.shape[1], :x.shape[1]])
        return self.head(self.norm(h))


def setup(vocab):
    torch.manual_seed(0)
    model = LM(vocab)
    decay = [p for n, p in model.named_parameters()
             if p.dim() > 1 and not n.startswith(("tok", "pos"))]
    other = [p for n, p in model.named_parameters()
             if p.dim() <= 1 or n.startswith(("tok", "pos"))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": other, "weight_decay": 0.0}],
                            lr=3e-3, betas=(0.9, 0.95))

    def warmup_cosine(i):
        if i < WARMUP:
            return (i + 1) / WARMUP
        return 0.1 + 0.45 * (1 + math.cos(math.pi * min(
            1.0, (i - WARMUP) / (TOTAL - WARMUP))))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup_cosine)
    return model, opt, sched


def loss_of(model, x, y):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(x)
    return F.cross_entropy(out.float().flatten(0, 1), y.flatten())


def eval_loss(model, data):
    model.eval()
    with torch.no_grad():
        x, y = data.tensors
        loss = float(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
    model.train()
    return loss


def run_ringd(o):
    import ringd.torch as rt
    from ringd.torch import elastic
    log = user_job.open_log(o)
    rt.init(o.socket, name="user_lm")
    data, vocab = corpus()
    model, opt, sched = setup(vocab)
    sampler = elastic.ElasticSampler(data, batch_size=o.global_batch, seed=3)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler,
                          lr_scheduler=sched)
    dopt = rt.DistributedOptimizer(
        opt, named_parameters=model.named_parameters(), model=model)
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
        nn.utils.clip_grad_norm_(model.parameters(), 0.5)
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
    data, vocab = corpus()
    model, opt, sched = setup(vocab)
    user_job.run_ref(o, data, model, opt, sched, loss_of, eval_loss, 0.5, 3)


if __name__ == "__main__":
    sys.exit(user_job.main(__doc__, N, 60, run_ringd, run_ref))
