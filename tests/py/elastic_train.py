#!/usr/bin/python3
"""A small Adam-trained MLP through ringd.torch (DistributedOptimizer,
elastic.State, ElasticSampler, elastic.run), driven by
tests/test-client-python.c against a real ringd.

--mode ringd   one trainer of the job (until --steps, or the step number
               the test writes into --stop-file); logs one line per completed step:
               "step S gen G rank R world W epoch E digest D adam_step A
               idx i,j,..." (idx: the step's global batch), "restored S
               ..." when it joined, "final digest D", and saves the model's
               state_dict to --out.
               --check-overlap: every step, the optimizer's trace shows a
               bucket issued before the last gradient hook, the buckets
               issued in order, and every wait inside step(); logs
               "overlap checked N steps" at the end.
               --staging: nothing of the model in ringd memory (gradients
               and state staged through copies); --device cuda: the
               model on the GPU (staged as well).
--mode ref     one process, no daemon, the same global batches (world 1,
               batch world*batch*k), plain Adam; saves to --out.
--compare A B TOL   max |a-b| over two saved state_dicts <= TOL, or exit 1
                    (--differ-by MIN: and >= MIN).
--check LOG...      every epoch completed in the logs saw each sample
                    exactly once, the steps' batches agree across logs,
                    Adam's step counter is the job's step + 1 on every
                    line; --shrunk N: at least N of those epochs lost a
                    trainer midway (the world shrank between two of its
                    steps).
"""
import argparse
import sys


def data(torch, n):
    g = torch.Generator()
    g.manual_seed(4242)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, 3, generator=g)
    y = (x @ w).argmax(dim=1)
    return x, y


def model_and_opt(torch, o):
    torch.manual_seed(1)
    m = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(),
                            torch.nn.Linear(32, 3))
    m.to(getattr(o, "device", "cpu"))
    if o.opt == "sgd":
        # Unlike Adam's, its update scales with the gradient: a wrong
        # average shows.
        return m, torch.optim.SGD(m.parameters(), lr=0.2, momentum=0.5)
    return m, torch.optim.Adam(m.parameters(), lr=o.lr)


def micro_steps(torch, model, x, y, idx, k):
    """k backward passes over idx split in k equal parts, mean loss
    each."""
    part = len(idx) // k
    for j in range(k):
        sl = idx[j * part:(j + 1) * part]
        loss = torch.nn.functional.cross_entropy(model(x[sl]), y[sl])
        loss.backward()


def check_overlap(trace, nbuckets):
    """DistributedOptimizer.trace of one step: the reductions overlap
    backward and only step() waits."""
    kinds = [e[0] for e in trace]
    last_hook = len(kinds) - 1 - kinds[::-1].index("hook")
    step = kinds.index("step")
    issued = [(i, e[1]) for i, e in enumerate(trace) if e[0] == "issue"]
    waits = [i for i, e in enumerate(trace) if e[0] == "wait"]
    assert [b for _, b in issued] == list(range(nbuckets)), trace
    assert any(i < last_hook for i, _ in issued), \
        "no bucket issued before the last gradient hook: %s" % trace
    assert step > last_hook, trace
    assert len(waits) == nbuckets and min(waits) > step, \
        "a wait outside step(): %s" % trace


def run_ref(o, torch):
    from ringd.torch.elastic import ElasticSampler
    x, y = data(torch, o.n)
    model, opt = model_and_opt(torch, o)
    s = ElasticSampler(range(o.n), batch_size=o.world * o.batch * o.k,
                       seed=3)
    for step in range(o.steps):
        if s.done():
            s.set_epoch(s.epoch + 1)
        opt.zero_grad()
        micro_steps(torch, model, x, y, s.batch(), 1)
        opt.step()
        s.commit()
    torch.save(model.state_dict(), o.out)
    print("final ref")


def run_ringd(o, torch):
    import ringd.torch as rt
    from ringd.torch import elastic
    rt.init(o.socket, name="elastic_train")
    if o.device.startswith("cuda") and not torch.cuda.is_available():
        sys.exit("--device %s: torch.cuda.is_available() is False" %
                 o.device)
    x, y = data(torch, o.n)
    x, y = x.to(o.device), y.to(o.device)
    model, opt = model_and_opt(torch, o)
    sampler = elastic.ElasticSampler(range(o.n), batch_size=o.batch * o.k,
                                     seed=3)
    staging = True if o.staging else None
    state = elastic.State(model=model, optimizer=opt, sampler=sampler,
                          epoch=0, staging=staging)
    comp = {"none": rt.Compression.none, "fp16": rt.Compression.fp16,
            "bf16": rt.Compression.bf16}[o.compression]
    dopt = rt.DistributedOptimizer(opt,
                                   named_parameters=model.named_parameters(),
                                   compression=comp,
                                   backward_passes_per_step=o.k,
                                   bucket_cap_mb=o.bucket_cap_mb,
                                   staging=staging)
    if o.staging or o.device != "cpu":
        # Nothing of the model is in ringd memory: it is all staged.
        c = rt.client()
        for p in model.parameters():
            assert not c.owns(p.data_ptr(), 4), "a parameter in the region"
            assert not c.owns(p.grad.data_ptr(), 4), "a .grad in a bucket"
        log_line = "staged: %d buckets, %d tensors of the state\n" % (
            len(dopt.buckets), len(state._staged))
    else:
        log_line = None
    overlaps = [0]
    log = open(o.log, "a")
    if log_line:
        log.write(log_line)
    resets = []
    state.register_reset_callbacks([resets.append])
    first = [True]

    def adam_step():
        st = opt.state[next(model.parameters())]
        return float(st["step"]) if "step" in st else -1

    def step_fn(state, v):
        if first[0] and v.restored:
            log.write("restored %d digest %s adam_step %g epoch %d "
                      "processed %d\n" % (v.step, state.digest(),
                                          adam_step(), sampler.epoch,
                                          sampler.processed))
            log.flush()
        first[0] = False
        if sampler.done():
            sampler.set_epoch(sampler.epoch + 1)
            state.epoch = sampler.epoch
        glob = [i for sh in sampler.global_batch() for i in sh]
        dopt.trace = [] if o.check_overlap else None
        dopt.zero_grad()
        micro_steps(torch, model, x, y, sampler.batch(), o.k)
        dopt.step()
        if o.check_overlap:
            check_overlap(dopt.trace, len(dopt.buckets))
            overlaps[0] += 1
        log.write("step %d gen %d rank %d world %d epoch %d digest %s "
                  "adam_step %g idx %s\n" %
                  (v.step, v.generation, v.rank, v.world, sampler.epoch,
                   state.digest(), adam_step(),
                   ",".join(map(str, glob))))
        log.flush()
        if o.save_live is not None and v.step == o.save_live:
            # The live state after this step, for the export test.
            torch.save({"model": model.state_dict(),
                        "optimizer": opt.state_dict()}, o.out + ".live")
        if o.pace_ms:
            import time
            time.sleep(o.pace_ms / 1000.0)  # lets the test kill mid-run
    def limit():
        # The test names the last step once the job did what it watches.
        try:
            with open(o.stop_file) as f:
                return int(f.read())
        except (OSError, ValueError):
            return None
    v = elastic.run(step_fn, state,
                    steps=limit if o.stop_file else o.steps)
    if o.check_overlap:
        log.write("overlap checked %d steps, %d buckets\n" %
                  (overlaps[0], len(dopt.buckets)))
    log.write("final digest %s step %s resets %s\n" %
              (state.digest(), v.step if v else "-", resets))
    log.close()
    torch.save({k: v.cpu() for k, v in model.state_dict().items()}, o.out)
    print("final digest", state.digest())
    rt.client().close()


def compare(a, b, tol, at_least, torch):
    da, db = torch.load(a), torch.load(b)
    worst = max(float((da[k] - db[k]).abs().max()) for k in da)
    print("max |a-b| = %.3g (tolerance %g, at least %g)" %
          (worst, tol, at_least))
    return 0 if at_least <= worst <= tol else 1


def check(logs, n, want_shrunk):
    steps, worlds = {}, {}      # step -> {(epoch, idx)}, step -> world
    for path in logs:
        for line in open(path):
            f = line.split()
            if f[0] != "step":
                continue
            s, world, epoch = int(f[1]), int(f[7]), int(f[9])
            # Adam's step counter lives in the state region: one optimizer
            # step per job step, on survivors and joiners alike.
            if float(f[13]) != s + 1:
                print("%s: step %d with adam_step %s" % (path, s, f[13]))
                return 1
            idx = tuple(int(i) for i in f[15].split(","))
            steps.setdefault(s, set()).add((epoch, idx))
            worlds[s] = world
    per_epoch, epoch_worlds = {}, {}
    for s in sorted(steps):
        if len(steps[s]) != 1:
            print("step %d: trainers disagree on its batch: %s" %
                  (s, sorted(steps[s])))
            return 1
        epoch, idx = next(iter(steps[s]))
        per_epoch.setdefault(epoch, []).extend(idx)
        epoch_worlds.setdefault(epoch, []).append(worlds[s])
    full, shrunk = 0, 0
    for e, seen in sorted(per_epoch.items()):
        if len(seen) != len(set(seen)):
            print("epoch %d: a sample seen twice" % e)
            return 1
        if e < max(per_epoch):      # the last one may be unfinished
            if sorted(seen) != list(range(n)):
                print("epoch %d: %d of %d samples" % (e, len(seen), n))
                return 1
            full += 1
            w = epoch_worlds[e]
            if any(b < a for a, b in zip(w, w[1:])):
                shrunk += 1
    print("epochs: %d complete, each sample exactly once, over %d steps; "
          "%d of them lost a trainer midway" % (full, len(steps), shrunk))
    if shrunk < want_shrunk:
        print("fewer than %d complete epochs lost a trainer midway" %
              want_shrunk)
        return 1
    return 0 if full >= 1 else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=("ringd", "ref"))
    ap.add_argument("--socket")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--n", type=int, default=96)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--k", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--compression", default="none")
    ap.add_argument("--opt", choices=("adam", "sgd"), default="adam")
    ap.add_argument("--pace-ms", type=int, default=0)
    ap.add_argument("--bucket-cap-mb", type=float, default=25)
    ap.add_argument("--check-overlap", action="store_true")
    ap.add_argument("--staging", action="store_true",
                    help="stage the gradients and the state through copies "
                    "(the model's tensors stay outside ringd memory)")
    ap.add_argument("--device", default="cpu",
                    help="the model's device (cuda: staged)")
    ap.add_argument("--stop-file")
    ap.add_argument("--save-live", type=int)
    ap.add_argument("--log")
    ap.add_argument("--out")
    ap.add_argument("--compare", nargs=3)
    ap.add_argument("--differ-by", type=float, default=0.0,
                    help="with --compare: max |a-b| must also reach this "
                    "(a lossy wire dtype shows)")
    ap.add_argument("--check", nargs="+")
    ap.add_argument("--shrunk", type=int, default=0,
                    help="with --check: complete epochs that must have "
                    "lost a trainer midway")
    o = ap.parse_args()
    try:
        import torch
    except ImportError as e:
        print("SKIP torch cannot be imported: %s" % e)
        return 0
    if o.compare:
        return compare(o.compare[0], o.compare[1], float(o.compare[2]),
                       o.differ_by, torch)
    if o.check:
        return check(o.check, o.n, o.shrunk)
    if o.mode == "ref":
        run_ref(o, torch)
    else:
        run_ringd(o, torch)
    return 0


if __name__ == "__main__":
    sys.exit(main())
