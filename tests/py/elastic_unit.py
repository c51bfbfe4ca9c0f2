#!/usr/bin/python3
"""ringd.torch.elastic without a job: the ElasticSampler under simulated
view changes and redone steps, and State's region (zero copy, restore on
another replica, the layout check) against a real ringd at --socket (no
step is needed for buffers). Prints "PASS elastic" or "SKIP ...".
"""
import argparse
import random
import sys

import numpy as np


def sampler_sim(ElasticSampler):
    rnd = random.Random(12345)
    n, b = 1003, 7
    s = ElasticSampler(range(n), batch_size=b, shuffle=True, seed=5)
    orders, changes, redone = [], 0, 0
    for epoch in range(4):
        s.set_epoch(epoch)
        seen = []
        world = rnd.randint(1, 5)
        s.set_world(0, world)
        while not s.done():
            shares = s.global_batch()
            flat = [i for sh in shares for i in sh]
            assert len(flat) == len(set(flat)), "overlapping shares"
            assert all(len(sh) <= b for sh in shares)
            assert len(shares) == world
            # Every rank, asked on its own, computes its share.
            for r in range(world):
                t = ElasticSampler(range(n), batch_size=b, seed=5)
                t.load_state_dict(s.state_dict())
                t.set_world(r, world)
                assert t.batch() == shares[r]
            if rnd.random() < 0.2:
                # The step is aborted by a view change: redone, no commit.
                world = rnd.randint(1, 5)
                s.set_world(0, world)
                changes += 1
                redone += 1
                continue
            seen.extend(flat)
            s.commit()
            if rnd.random() < 0.1:
                world = rnd.randint(1, 5)   # a change between steps
                s.set_world(0, world)
                changes += 1
        assert sorted(seen) == list(range(n)), "epoch %d: not exactly once" \
            % epoch
        orders.append(s.order()[:20])
    assert orders[0] != orders[1], "shuffle does not change per epoch"
    # __iter__ with a fixed world is the steps' shares, in order.
    s.set_epoch(9)
    s.set_world(2, 3)
    it = list(s)
    steps = []
    while not s.done():
        steps.extend(s.batch())
        s.commit()
    assert it == steps and len(it) > 0
    # Mid-epoch state moves to a fresh sampler.
    s.set_epoch(1)
    s.commit()
    s.commit()
    t = ElasticSampler(range(n), batch_size=b, seed=5)
    t.load_state_dict(s.state_dict())
    t.set_world(2, 3)
    assert list(t) == list(s)
    print("sampler: 4 epochs, %d view changes (%d steps redone), every "
          "sample exactly once" % (changes, redone))


def make(seed, torch, hidden=16):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, hidden),
                                torch.nn.BatchNorm1d(hidden),
                                torch.nn.ReLU(), torch.nn.Linear(hidden, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return model, opt


def train(model, opt, steps, torch, seed=7):
    g = torch.Generator()
    g.manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(16, 8, generator=g)
        y = torch.randint(0, 3, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def state_checks(sock):
    import torch
    import ringd
    import ringd.torch as rt
    from ringd.torch import elastic

    c1 = ringd.Client(sock, name="elastic-a")
    c2 = ringd.Client(sock, name="elastic-b")
    # Materialising Adam's state changes nothing about training.
    m0, o0 = make(1, torch)
    ma, oa = make(1, torch)
    sa = elastic.State(model=ma, optimizer=oa, client=c1, epoch=0,
                       best=0.5)
    train(m0, o0, 5, torch)
    train(ma, oa, 5, torch)
    for (n0, p0), (_, pa) in zip(m0.state_dict().items(),
                                 ma.state_dict().items()):
        assert torch.equal(p0, pa), n0
    print("state: training with the region is bitwise the same as without")
    # The live tensors are the region: an optimizer step changes it.
    for p in list(ma.parameters()) + list(ma.buffers()):
        assert c1.owns(p.data_ptr(), p.numel() * p.element_size())
    for st in oa.state.values():
        for v in st.values():
            assert c1.owns(v.data_ptr(), v.numel() * v.element_size())
    before = sa.digest()
    train(ma, oa, 1, torch)
    assert sa.digest() != before
    names = [e["name"] for e in sa.layout]
    assert "optim/0/exp_avg" in names and "optim/0/step" in names, names
    assert "model/1.num_batches_tracked" in names, names

    # Another replica receives the bytes (as a joiner does) and restores.
    sampler = elastic.ElasticSampler(range(100), batch_size=4, seed=3)
    sa.sampler = sampler
    sampler.set_epoch(2)
    sampler.commit()
    sa.epoch, sa.best = 2, 0.75
    torch.manual_seed(99)
    np.random.seed(98)
    random.seed(97)
    sa.commit()
    want_rand = (torch.rand(3), np.random.rand(3), random.random())
    mb, ob = make(2, torch)
    sb = elastic.State(model=mb, optimizer=ob, client=c2,
                       sampler=elastic.ElasticSampler(range(100),
                                                      batch_size=4, seed=3),
                       epoch=0, best=0.0)
    sb.region[:] = sa.region
    sb.restore()
    assert sb.digest() == sa.digest()
    for (n, pa), (_, pb) in zip(ma.state_dict().items(),
                                mb.state_dict().items()):
        assert torch.equal(pa, pb), n
    for pa, pb in zip(ma.parameters(), mb.parameters()):
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(oa.state[pa][k], ob.state[pb][k]), k
    assert float(ob.state[list(mb.parameters())[0]]["step"]) == 6.0
    assert sb.epoch == 2 and sb.best == 0.75
    assert sb.sampler.state_dict() == sampler.state_dict()
    torch.manual_seed(1)
    np.random.seed(1)
    random.seed(1)
    sb.restore()    # the RNG states again, over other ones
    assert torch.equal(torch.rand(3), want_rand[0]), "torch RNG not restored"
    assert (np.random.rand(3) == want_rand[1]).all(), "numpy RNG not restored"
    assert random.random() == want_rand[2], "python RNG not restored"
    # Both go on identically from there.
    train(ma, oa, 3, torch, seed=11)
    train(mb, ob, 3, torch, seed=11)
    assert sa.digest() == sb.digest()
    print("state: a replica restored from the region has the model, Adam's "
          "moments and step (6), sampler, RNG and extras")

    # A different model cannot load it.
    c3 = ringd.Client(sock, name="elastic-c")
    mc, oc = make(2, torch, hidden=32)
    sc = elastic.State(model=mc, optimizer=oc, client=c3)
    sc.region[:sc.nbytes] = 0
    sc.region[:64] = sa.region[:64]
    try:
        sc.restore()
    except ValueError as e:
        assert "another layout" in str(e), e
        print("state: other layout refused:", e)
    else:
        raise AssertionError("restore of another layout accepted")
    try:
        elastic.State(model=torch.nn.Linear(2, 2).to("meta"), client=c3)
    except rt.UnsupportedDevice as e:
        assert "elastic.State: model/weight is on meta" in str(e), e
        print("state: meta tensor refused:", e)
    else:
        raise AssertionError("a meta tensor was accepted")
    staged_checks(torch, elastic, c1, c3, ma, oa, sa)
    for c in (c1, c2, c3):
        c.close()


def staged_checks(torch, elastic, c1, c3, ma, oa, sa):
    """State(staging=True): the tensors stay where they are and are
    copied into the region (commit(), digest()), with the layout and the
    bytes of the in-place State of the same training; a replica restored
    from those bytes has them back."""
    md, od = make(1, torch)
    train(md, od, 5, torch)         # ma's training so far
    train(md, od, 1, torch)
    train(md, od, 3, torch, seed=11)
    sd = elastic.State(model=md, optimizer=od, client=c3, staging=True,
                       epoch=0, best=0.5)
    assert sd.layout == sa.layout
    for p in list(md.parameters()) + list(md.buffers()):
        assert not c3.owns(p.data_ptr(), p.numel() * p.element_size())
    assert sd.digest() == sa.digest(), "staged bytes differ from in-place"
    train(ma, oa, 2, torch, seed=12)
    train(md, od, 2, torch, seed=12)
    before = bytes(sd.region[sd._data_off:])
    sd.commit()
    assert bytes(sd.region[sd._data_off:]) != before, "commit() wrote nothing"
    assert sd.digest() == sa.digest(), "staged bytes differ from in-place"
    me, oe = make(3, torch)
    se = elastic.State(model=me, optimizer=oe, client=c1, staging=True)
    assert se.digest() != sd.digest()
    se.region[:] = sd.region
    se.restore()
    for (n, pd), (_, pe) in zip(md.state_dict().items(),
                                me.state_dict().items()):
        assert torch.equal(pd, pe), n
    for pd, pe in zip(md.parameters(), me.parameters()):
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(od.state[pd][k], oe.state[pe][k]), k
    train(md, od, 2, torch, seed=13)
    train(me, oe, 2, torch, seed=13)
    assert sd.digest() == se.digest()
    print("state: staged tensors (staging=True) are written into the region "
          "as the in-place ones are, and restored from it")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    o = ap.parse_args()
    try:
        import torch  # noqa: F401
    except ImportError as e:
        print("SKIP torch cannot be imported: %s" % e)
        return 0
    from ringd.torch.elastic import ElasticSampler
    sampler_sim(ElasticSampler)
    state_checks(o.socket)
    print("PASS elastic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
