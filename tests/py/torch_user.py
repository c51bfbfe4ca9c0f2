"""ringd.torch as ordinary PyTorch scripts use it (tests/test-client-torch-user.c).

--mode unit: one trainer's checks: elastic.State saves and restores an
LR scheduler, a scaler and any extra with state_dict(); on_reset fires on
a world size change without a new generation; elastic.run moves to the
next epoch; drop_last; an optimizer parameter missing from
named_parameters is an error naming it; skip_synchronize() does not
reduce again; a .grad written while its bucket is in flight raises
GradChanged.

--mode pair (2 trainers): the reduction ops and gradient_predivide_factor
on rank-dependent gradients, then a BatchNorm model trained through
elastic.run with DistributedOptimizer(model=...): logs the state digest
(parameters and buffers) and the learning rate at the end.
"""
import argparse
import random
import sys

import numpy as np


def fake_client(real, views):
    """The real client for memory, scripted views for the step loop."""
    class Fake:
        view = None

        def __getattr__(self, name):
            return getattr(real, name)

        def step_begin(self):
            if not views:
                raise ringd.Shutdown(0, "script done")
            self.view = views.pop(0)
            return self.view

        def step_end(self):
            pass
    import ringd
    return Fake()


def state_objects(sock, torch, ringd, elastic):
    c1 = ringd.Client(sock, name="user-a")
    c2 = ringd.Client(sock, name="user-b")

    class Counter:
        def __init__(self):
            self.n, self.t = 0, torch.zeros(2)

        def state_dict(self):
            return {"n": self.n, "t": self.t.clone(), "k": {1: "a"}}

        def load_state_dict(self, d):
            self.n, self.t = d["n"], d["t"]
            assert d["k"] == {1: "a"}, d

    def make(seed):
        torch.manual_seed(seed)
        m = torch.nn.Linear(4, 2)
        o = torch.optim.SGD(m.parameters(), lr=0.1)
        s = torch.optim.lr_scheduler.LambdaLR(o, lambda i: 1.0 / (1 + i))
        sc = torch.cuda.amp.GradScaler(init_scale=8.0, enabled=False)
        return m, o, s, sc
    ma, oa, sa_, sca = make(1)
    ca = Counter()
    sa = elastic.State(model=ma, optimizer=oa, client=c1, lr_scheduler=sa_,
                       scaler=sca, counter=ca)
    for _ in range(5):
        oa.step()
        sa_.step()
    ca.n, ca.t = 7, torch.tensor([1.5, -2.0])
    sa.commit()
    mb, ob, sb_, scb = make(2)
    cb = Counter()
    sb = elastic.State(model=mb, optimizer=ob, client=c2, lr_scheduler=sb_,
                       scaler=scb, counter=cb)
    sb.region[:] = sa.region
    sb.restore()
    assert sb_.last_epoch == sa_.last_epoch == 5, sb_.last_epoch
    assert sb_.get_last_lr() == sa_.get_last_lr(), sb_.get_last_lr()
    assert ob.param_groups[0]["lr"] == oa.param_groups[0]["lr"]
    assert cb.n == 7 and torch.equal(cb.t, ca.t), (cb.n, cb.t)
    assert sb.counter is cb
    sa_.step()
    sb_.step()
    assert sb_.get_last_lr() == sa_.get_last_lr()
    print("state: LR scheduler, scaler and a state_dict extra restored")
    return c1


def run_checks(c, torch, ringd, elastic):
    View = ringd.View
    # World 2 -> 3 in one generation (a trainer counted in): on_reset.
    views = [View(0, 2, 0, 2, 0, 5, False), View(0, 3, 0, 3, 1, 5, False),
             View(0, 3, 0, 3, 2, 5, False), View(0, 2, 0, 2, 3, 6, False)]
    m = torch.nn.Linear(2, 1)
    st = elastic.State(model=m, client=fake_client(c, views))
    resets = []
    st.register_reset_callbacks([resets.append])
    elastic.run(lambda s, v: None, st)
    assert resets == [3, 2], resets
    print("run: on_reset on a world size change without a new generation")

    # The loop only asks batch(): three epochs, each sample once each.
    n, seen = 10, {}
    views = [View(0, 1, 0, 1, i, 1, False) for i in range(9)]
    sampler = elastic.ElasticSampler(range(n), batch_size=4, seed=1)
    st = elastic.State(model=m, sampler=sampler,
                       client=fake_client(c, views))

    def step(s, v):
        b = s.sampler.batch()       # first: it may start the next epoch
        seen.setdefault(s.sampler.epoch, []).extend(b)
    elastic.run(step, st)
    for e in (0, 1, 2):
        assert sorted(seen.get(e, [])) == list(range(n)), (e, seen)
    print("run: epochs roll over (%d epochs)" % len(seen))

    s = elastic.ElasticSampler(range(10), batch_size=4, drop_last=True)
    got = []
    while not s.done():
        got.extend(s.batch())
        s.commit()
    assert len(got) == 8 and len(list(iter(s.__class__(
        range(10), batch_size=4, drop_last=True)))) == 8, got
    print("sampler: drop_last drops the short last step")


def loader_checks(c, torch, ringd, elastic):
    """elastic.DataLoader with 2 workers through world changes (rank and
    world change mid-epoch) and a redone step: each step's batch is
    exactly the sampler's share of it, so each epoch once."""
    View = ringd.View
    views, step = [], 0
    for gen, (rank, world, n) in enumerate([(0, 1, 4), (1, 2, 3),
                                            (0, 3, 5), (0, 1, 6)]):
        for _ in range(n):
            views.append(View(rank, world, 0, world, step, gen, False))
            step += 1
    nviews = len(views)
    data = torch.arange(40).float().unsqueeze(1) * 10
    sampler = elastic.ElasticSampler(range(40), batch_size=3, seed=4)
    loader = elastic.DataLoader(data, sampler, num_workers=2)
    st = elastic.State(sampler=sampler, client=fake_client(c, views))
    redone, steps = [False], [0]

    def fn(s, v):
        b = loader.batch()
        want = data[s.sampler.batch()]
        assert torch.equal(b, want), (v, b, want)
        steps[0] += 1
        if v.step == 6 and not redone[0]:
            redone[0] = True        # the same step again on this view
            assert loader.batch() is b
            raise ringd.Reshape(0, "simulated")
    elastic.run(fn, st)
    assert steps[0] == nviews and redone[0] and sampler.epoch >= 1, \
        (steps, sampler.epoch)
    print("loader: 2 workers, %d steps over 4 views and a redo, %d "
          "prefetched batches dropped, every batch the sampler's" %
          (steps[0], loader.dropped))


def dopt_checks(c, torch, ringd, rt):
    m = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    extra = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.SGD(list(m.parameters()) + [extra], lr=0.1)
    try:
        rt.DistributedOptimizer(opt, named_parameters=m.named_parameters(),
                                client=c)
        raise AssertionError("a parameter outside named_parameters passed")
    except ValueError as e:
        assert "named_parameters lacks" in str(e) and "[0][4] (2,)" in \
            str(e), e
        print("dopt: an optimizer parameter missing from named_parameters: "
              "%s" % e)

    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    d = rt.DistributedOptimizer(opt, named_parameters=m.named_parameters(),
                                client=c, bucket_cap_mb=0)
    x = torch.randn(4, 3)
    c.step_begin()
    d.zero_grad()
    m(x).sum().backward()
    d.synchronize()
    torch.nn.utils.clip_grad_norm_(m.parameters(), 0.01)
    d.trace = []
    with d.skip_synchronize():
        d.step()
    assert not any(e[0] == "issue" for e in d.trace), d.trace
    c.step_end()
    print("dopt: synchronize(), clip, step() in skip_synchronize() reduces "
          "once")

    c.step_begin()
    d.zero_grad()
    m(x).sum().backward()       # buckets issued from the hooks
    torch.nn.utils.clip_grad_norm_(m.parameters(), 0.01)
    try:
        d.step()
        raise AssertionError("a .grad changed in flight went unnoticed")
    except rt.GradChanged as e:
        print("dopt: in-flight change detected: %s" % e)
    c.step_end()


def ops_checks(c, torch, rt, v):
    """2 trainers: rank r's gradient is r + 1 everywhere."""
    want = {rt.Average: 1.5, rt.Sum: 3.0, rt.Min: 1.0, rt.Max: 2.0}
    for op, w in sorted(want.items()):
        p = torch.nn.Parameter(torch.zeros(5))
        d = rt.DistributedOptimizer(torch.optim.SGD([p], lr=1.0),
                                    named_parameters=[("p", p)], op=op,
                                    client=c)
        d.zero_grad()
        (p * (v.rank + 1)).sum().backward()
        d.synchronize()
        assert torch.all(p.grad == w), (op, p.grad)
        d.close()
    p = torch.nn.Parameter(torch.zeros(5))
    d = rt.DistributedOptimizer(torch.optim.SGD([p], lr=1.0),
                                named_parameters=[("p", p)], client=c,
                                gradient_predivide_factor=4.0)
    d.zero_grad()
    (p * (v.rank + 1)).sum().backward()
    d.synchronize()
    assert torch.all(p.grad == 1.5), p.grad
    print("ops: avg sum min max and predivide as expected")


def outside_step(c, torch, rt):
    """broadcast_parameters / broadcast_optimizer_state between steps
    open a step of their own (the daemon refuses a collective outside)."""
    m = torch.nn.Linear(3, 2)
    opt = torch.optim.Adam(m.parameters())
    before = c.step_begin().step
    c.step_end()
    rt.broadcast_parameters(m.state_dict(), client=c)
    rt.broadcast_optimizer_state(opt, client=c)
    after = c.step_begin().step
    c.step_end()
    assert after == before + 3, (before, after)
    assert "exp_avg" in opt.state[m.weight]
    print("broadcast: parameters and optimizer state outside a step")


def pair(o, torch, ringd, rt, elastic):
    rt.init(o.socket, name="torch_user")
    c = rt.client()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 8),
                                torch.nn.BatchNorm1d(8), torch.nn.ReLU(),
                                torch.nn.Linear(8, 3))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 0.98 ** i)
    sampler = elastic.ElasticSampler(range(64), batch_size=8, seed=2)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler,
                          lr_scheduler=sched)
    d = rt.DistributedOptimizer(opt, named_parameters=model.named_parameters(),
                                model=None if o.no_buffers else model)
    g = torch.Generator()
    g.manual_seed(5)
    x, y = torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,),
                                                          generator=g)
    first = [True]

    def step(state, v):
        if first[0]:
            first[0] = False
            ops_checks(c, torch, rt, v)
        idx = sampler.batch()
        d.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        d.step()
        sched.step()
    v = elastic.run(step, state, steps=o.steps)
    with open(o.log, "a") as f:
        f.write("final digest %s lr %r step %d epoch %d\n" %
                (state.digest(), opt.param_groups[0]["lr"], v.step,
                 sampler.epoch))
    c.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--mode", default="unit")
    ap.add_argument("--log")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--no-buffers", action="store_true")
    o = ap.parse_args()
    import torch
    import ringd
    import ringd.torch as rt
    from ringd.torch import elastic
    random.seed(0)
    np.random.seed(0)
    if o.mode == "pair":
        pair(o, torch, ringd, rt, elastic)
        return 0
    c = state_objects(o.socket, torch, ringd, elastic)
    outside_step(c, torch, rt)
    run_checks(c, torch, ringd, elastic)
    loader_checks(c, torch, ringd, elastic)
    dopt_checks(c, torch, ringd, rt)
    print("PASS torch_user")
    return 0


if __name__ == "__main__":
    sys.exit(main())
