"""The CNN of user_cnn.py as a DistributedDataParallel user writes it, its
BatchNorm layers made SyncBatchNorm, on the ringd torch.distributed
backend (tests/test-client-torch-nodes.c, client_python_torch_user_ddp_nodes).

The script a DDP + torchrun user has, with the diff of client/python's
README: rdist.run builds DDP(model) in setup() on every new view and
redoes a step a view change broke; clipping after backward (DDP's
gradients are averaged by then), the LambdaLR stepped after the update,
bf16 CPU autocast, elastic.DataLoader with 2 workers, the global batch
--global whatever the world. SyncBatchNorm is ringd.torch.distributed's
(torch 1.13's refuses CPU input): the statistics are the global batch's,
so the running statistics end equal on every rank, and the digest covers
them with the parameters and the optimizer state.

--mode ringd, --mode ref, --check, --loss: as in user_cnn.py.
"""
import hashlib
import sys

import torch.nn as nn

import user_cnn
import user_job


def ddp_digest(model, opt):
    h = hashlib.blake2b(digest_size=8)
    for _, t in sorted(model.state_dict().items()):
        h.update(t.detach().contiguous().numpy().tobytes())
    for p in model.parameters():
        for _, v in sorted(opt.state.get(p, {}).items()):
            if hasattr(v, "numpy"):
                h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def run_ringd(o):
    import faulthandler
    import logging
    faulthandler.enable()
    import ringd.torch as rt
    import ringd.torch.distributed as rdist
    from ringd.torch import elastic
    from torch.nn.parallel import DistributedDataParallel as DDP
    log = user_job.open_log(o)
    logging.basicConfig(stream=log, level=logging.INFO,
                        format="# %(name)s: %(message)s")
    rt.init(o.socket, name="user_ddp")
    data = user_cnn.digits()
    model, opt, sched = user_cnn.setup()
    # The same Parameter and buffer objects: the optimizer stays valid.
    model = rdist.SyncBatchNorm.convert_sync_batchnorm(model)
    sampler = elastic.ElasticSampler(data, batch_size=o.global_batch // 2,
                                     seed=1)
    state = elastic.State(model=model, optimizer=opt, sampler=sampler,
                          lr_scheduler=sched)
    loader = elastic.DataLoader(data, sampler, num_workers=2)

    def reset(world):
        sampler.batch_size = o.global_batch // world
    state.register_reset_callbacks([reset])

    def setup(v):
        # A joiner's first attempt may fail in DDP's constructor (a view
        # change), before any step_fn; its state is restored by then.
        if v.restored and not getattr(setup, "told", False):
            log.write("restored %d\n" % v.step)
        setup.told = True
        return DDP(model)

    def step(state, v, ddp):
        setup.told = True
        reset(v.world)
        x, y = loader.batch()
        opt.zero_grad()
        user_cnn.loss_of(ddp, x, y).backward()
        nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        user_job.log_step(log, v, sampler, opt.param_groups[0]["lr"],
                          o.pace_ms)

    v = rdist.run(step, state, setup=setup,
                  steps=user_job.stop_limit(o))
    log.write("final digest %s lr %r loss %.6f step %d\n" %
              (ddp_digest(model, opt),
               opt.param_groups[0]["lr"], user_cnn.eval_loss(model, data),
               v.step))
    log.close()
    rt.client().close()


if __name__ == "__main__":
    sys.exit(user_job.main(__doc__, user_cnn.N, 24, run_ringd,
                           user_cnn.run_ref))
