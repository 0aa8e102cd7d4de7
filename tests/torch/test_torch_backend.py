#!/usr/bin/python3
"""dtrain_torch, the torch.distributed backend, against gloo in the same
processes.

Every rank makes a "dtrain" default group and a gloo group of the same
ranks, runs each collective on both with the same inputs (several dtypes,
sizes that no rank count divides) and compares the results:

  - bit for bit wherever the two must agree: data movement, integers
    (the bitwise BAND, BOR and BXOR too, on integers and bools), MIN and
    MAX, and every reduction at 2 ranks (one addition or product
    of two values, which commutes);
  - at 3 ranks, float SUM, PRODUCT and AVG within (ranks - 1) * eps of the
    sum of the magnitudes (of the product for PRODUCT): dtrain and gloo
    add the three values in different orders, and each of the two
    roundings is within eps of it.

Where gloo lacks a call (reduce_scatter, the tensor forms of all-gather and
reduce-scatter, the list all_to_all) the same result is made of gloo's
other calls; where it lacks a dtype (bool, int16, bfloat16) the reference
is computed here from every rank's inputs, which each rank can make. Also:
tensors in communication memory (dtrain_torch.empty) read through peers'
mappings, non-contiguous tensors, asynchronous calls and futures, subgroups, DDP for
20 steps under both backends, the refusals (a bitwise op on floats, a dtype dtrain
cannot reduce, coalesced calls of mixed dtypes), tags that reorder a pair's
messages and a tag never sent, receives from any source (the sender and
its payload, in a group too), the
coalesced calls, a size mismatch that must fail on every rank within
seconds, a group deleted while a receive whose tensor Python dropped is
pending, and a rank whose process ends while the others wait for it.

usage: test_torch_backend.py DTRAIN PYTHON_DIR NRANKS [env|file]
  Starts NRANKS workers with `dtrain launch`, which join through env://
  (PyTorch's TCPStore, on the launcher's MASTER_PORT) or file:// (a
  FileStore). Exits 77 when dtrain_torch was not built.
"""
import datetime
import math
import os
import subprocess
import sys
import tempfile
import time

SKIP = 77


def driver():
    dtrain, pydir, nranks = sys.argv[1], sys.argv[2], int(sys.argv[3])
    how = sys.argv[4] if len(sys.argv) > 4 else "env"
    if not os.path.exists(os.path.join(pydir, "dtrain_torch", "__init__.py")):
        print("skipped: dtrain_torch was not built (configure with PyTorch found, "
              "-DDTRAIN_WITH_TORCH=ON)")
        sys.exit(SKIP)
    env = {k: v for k, v in os.environ.items() if not k.startswith("DTRAIN_")}
    env["PYTHONPATH"] = pydir + os.pathsep + env.get("PYTHONPATH", "")
    env["DTRAIN_TIMEOUT"] = "60"
    env["OMP_NUM_THREADS"] = "1"
    with tempfile.TemporaryDirectory() as d:
        init = "env://" if how == "env" else "file://" + os.path.join(d, "store")
        cmd = [dtrain, "launch", "-n", str(nranks), sys.executable, os.path.abspath(__file__),
               "--worker", init]
        t0 = time.time()
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    out = r.stdout + r.stderr
    sys.stdout.write(out)
    print("%d ranks (%s) in %.1f s" % (nranks, how, time.time() - t0))
    done = [l for l in out.splitlines() if l.startswith("rank ") and l.endswith(": ok")]
    if r.returncode != 0 or len(done) != nranks - 1:
        sys.exit("FAIL: exit %d, %d of %d surviving ranks ok" % (r.returncode, len(done),
                                                                   nranks - 1))
    print("test_torch_backend: ok")


# ---- the workers ---------------------------------------------------------

failures = []
checks = 0


def check(cond, msg):
    global checks
    checks += 1
    if not cond:
        failures.append(msg)
        print("rank %d: FAIL %s" % (RANK, msg), flush=True)


def raises(fn, *texts):
    """fn() must raise RuntimeError holding every text; returns its message."""
    try:
        fn()
    except RuntimeError as e:
        msg = str(e)
        for t in texts:
            check(t in msg, "message %r lacks %r" % (msg[:300], t))
        return msg
    check(False, "no error (expected one naming %s)" % (texts,))
    return ""


def setup(init):
    global torch, dist, nn, RANK, N, WORLD, GLOO
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import dtrain_torch  # noqa: F401  (registers the backend)
    dist.init_process_group("dtrain", init_method=init,
                            rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]),
                            timeout=datetime.timedelta(seconds=60))
    RANK, N = dist.get_rank(), dist.get_world_size()
    WORLD = dist.distributed_c10d._get_default_group()
    GLOO = dist.new_group(backend="gloo")
    check(dist.get_backend() == "dtrain", "backend %s" % dist.get_backend())
    check(WORLD.transport == "shm", "transport %s" % WORLD.transport)


# Gloo in PyTorch 1.13 has neither of these dtypes: their references are
# computed here.
def gloo_has(dtype):
    return dtype not in (torch.bool, torch.int16, torch.bfloat16)


def make(dtype, n, rank, salt, positive=False):
    """Rank rank's input of case salt: the same on every rank that makes it."""
    g = torch.Generator().manual_seed(7919 * salt + rank)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype.is_floating_point:
        x = torch.rand(n, generator=g, dtype=torch.float64) * 1.5 + 0.5 if positive else \
            torch.randn(n, generator=g, dtype=torch.float64)
        return x.to(dtype)
    info = torch.iinfo(dtype)
    lo, hi = (info.min, info.max + 1) if info.bits <= 8 else (-1000, 1000)
    if positive:
        lo = max(lo, 0)
    return torch.randint(lo, hi, (n,), generator=g, dtype=torch.int64).to(dtype)


def same(what, got, want, tol=None):
    if got.dtype == torch.bool and want.dtype == torch.bool:
        # By their bytes: a bool tensor holding a 2 compares equal to True.
        got, want = got.view(torch.uint8), want.view(torch.uint8)
    if tol is None:
        ok = got.dtype == want.dtype and got.shape == want.shape and torch.equal(got, want)
    else:
        d = (got.double() - want.double()).abs()
        ok = got.shape == want.shape and bool((d <= tol).all())
    if not ok and got.shape == want.shape and got.numel():
        bad = (got.double() - want.double()).abs().argmax().item()
        what += " (first worst at %d: %r vs %r)" % (bad, got.reshape(-1)[bad].item(),
                                                   want.reshape(-1)[bad].item())
    check(ok, what)


OPS = {"SUM": "SUM", "PRODUCT": "PRODUCT", "MIN": "MIN", "MAX": "MAX"}
BITWISE = ["BAND", "BOR", "BXOR"]
ALL_DTYPES = ["float32", "float64", "float16", "bfloat16", "int8", "int16", "int32", "int64",
              "uint8", "bool"]
REDUCE_DTYPES = ["float32", "float64", "float16", "bfloat16", "int32", "int64", "uint8"]
SIZES = [1, 7, 1001, 40009]


def op_of(name):
    return getattr(dist.ReduceOp, name)


def ok_ops(dtype):
    """The ops a reduction on dtype may take under dtrain."""
    if dtype == torch.int8:
        return ["SUM", "PRODUCT"] + BITWISE
    if dtype == torch.int16:
        return []
    return list(OPS) + ([] if dtype.is_floating_point else BITWISE)


def local_reduce(xs, op):
    """The reduction of every rank's tensor, in float64 (bool: logical)."""
    if op in BITWISE:  # on the integers' bits (bool: 0 and 1)
        r = xs[0].long()
        for x in xs[1:]:
            r = {"BAND": r & x.long(), "BOR": r | x.long(), "BXOR": r ^ x.long()}[op]
        return r.to(xs[0].dtype)
    if xs[0].dtype == torch.bool:
        st = torch.stack(xs)
        return st.any(0) if op in ("SUM", "MAX") else st.all(0)
    st = torch.stack([x.double() for x in xs])
    r = {"SUM": st.sum(0), "PRODUCT": st.prod(0), "MIN": st.min(0).values,
         "MAX": st.max(0).values}[op]
    if N == 2 and op in ("SUM", "PRODUCT"):  # one rounding, as dtrain's
        r = {"SUM": xs[0].float() + xs[1].float(),
             "PRODUCT": xs[0].float() * xs[1].float()}[op].double()
    return r.to(xs[0].dtype)


def tolerance(xs, op):
    """None (bit for bit), or how far a float SUM or PRODUCT may be."""
    dtype = xs[0].dtype
    if N == 2 or op in ("MIN", "MAX") or not dtype.is_floating_point:
        return None
    eps = torch.finfo(dtype).eps
    mag = torch.stack([x.double().abs() for x in xs])
    return (N - 1) * eps * (mag.prod(0) * 2 if op == "PRODUCT" else mag.sum(0))


def reference_allreduce(dtype, n, salt, op, positive):
    """gloo's all_reduce of this rank's input, or the local reduction."""
    xs = [make(dtype, n, r, salt, positive) for r in range(N)]
    if gloo_has(dtype):
        y = xs[RANK].clone()
        dist.all_reduce(y, op=op_of(op), group=GLOO)
    else:
        y = local_reduce(xs, op)
    return xs, y


# ---- collectives ----------------------------------------------------------

def test_allreduce():
    salt = 0
    for name in ALL_DTYPES:
        dtype = getattr(torch, name)
        for op in ok_ops(dtype):
            for n in SIZES:
                salt += 1
                positive = op == "PRODUCT"
                xs, want = reference_allreduce(dtype, n, salt, op, positive)
                got = xs[RANK].clone()
                dist.all_reduce(got, op=op_of(op))
                same("all_reduce %s %s n=%d" % (name, op, n), got, want, tolerance(xs, op))
    # AVG (gloo has none): gloo's SUM divided by the ranks, as dtrain does.
    for name in ("float32", "float64"):
        dtype = getattr(torch, name)
        xs, total = reference_allreduce(dtype, 1001, 99, "SUM", False)
        got = xs[RANK].clone()
        dist.all_reduce(got, op=dist.ReduceOp.AVG)
        tol = tolerance(xs, "SUM")
        same("all_reduce %s AVG" % name, got, total / N, None if tol is None else tol / N)


def peer_mappings():
    """Read-only mappings of peers' communication memory in this process."""
    with open("/proc/self/maps") as f:
        return sum("dtrain-comm-mem" in line and " r--s " in line for line in f)


def test_comm_mem():
    """dtrain_torch.empty: a tensor in communication memory, of the dtype and
    shape asked; an all-reduce and an all-to-all of such tensors against
    gloo's, and the peers' tensors read through a mapping: a read-only
    mapping of the tensor of every peer that sent this rank a part of it
    (at 3 ranks the all-reduce's ring takes from one neighbour, the
    all-to-all from every peer)."""
    import dtrain_torch
    t = dtrain_torch.empty(3, 5, dtype=torch.float64)
    check(t.shape == (3, 5) and t.dtype == torch.float64 and t.is_contiguous() and
          bool((t == 0).all()), "empty(3, 5, float64): %s %s" % (t.shape, t.dtype))
    check(dtrain_torch.empty((4, 2)).shape == (4, 2), "empty((4, 2))")
    before = peer_mappings()
    n = 300007
    xs, want = reference_allreduce(torch.float32, n, 4242, "SUM", False)
    x = dtrain_torch.empty(n)
    x.copy_(xs[RANK])
    dist.all_reduce(x)
    same("all_reduce of dtrain_torch.empty(%d)" % n, x, want, tolerance(xs, "SUM"))
    after_allreduce = peer_mappings()
    check(N == 1 or 1 <= after_allreduce - before <= N - 1,
          "all_reduce: %d new mappings of peers' tensors, expected 1 to %d" %
          (after_allreduce - before, N - 1))
    src = dtrain_torch.empty(N * 5000, dtype=torch.int32)
    src.copy_(torch.arange(N * 5000, dtype=torch.int32) + 1000000 * RANK)
    got, ref = dtrain_torch.empty(N * 5000, dtype=torch.int32), torch.empty(N * 5000,
                                                                              dtype=torch.int32)
    dist.all_to_all_single(got, src)
    dist.all_to_all_single(ref, src.clone(), group=GLOO)
    same("all_to_all_single of dtrain_torch.empty", got, ref)
    check(peer_mappings() - after_allreduce == N - 1,
          "all_to_all_single: %d new mappings of peers' tensors, expected %d" %
          (peer_mappings() - after_allreduce, N - 1))


def test_refusals():
    raises(lambda: dist.all_reduce(torch.ones(5), op=dist.ReduceOp.BAND), "BAND", "bitwise",
           "integer")
    raises(lambda: dist.all_reduce(torch.ones(5, dtype=torch.int16)), "torch.int16")
    raises(lambda: dist.all_reduce(torch.ones(5, dtype=torch.int8), op=dist.ReduceOp.MAX),
           "torch.int8", "MAX")
    # The process group's own check (torch.distributed makes the same one first).
    mixed = [torch.ones(2), torch.ones(2, dtype=torch.float64)]
    raises(lambda: WORLD.allreduce_coalesced(mixed, dist.AllreduceCoalescedOptions()),
           "allreduce_coalesced", "torch.float64", "torch.float32")
    # The group still works after refusals.
    y = torch.full((3,), float(RANK))
    dist.all_reduce(y)
    same("all_reduce after refusals", y, torch.full((3,), float(sum(range(N)))))


def test_broadcast_reduce():
    salt = 1000
    for name in ALL_DTYPES:
        dtype = getattr(torch, name)
        for n in SIZES:
            salt += 1
            root = (salt % N)
            x = make(dtype, n, RANK, salt)
            got = x.clone()
            dist.broadcast(got, src=root)
            same("broadcast %s n=%d root %d" % (name, n, root), got, make(dtype, n, root, salt))
            for op in ok_ops(dtype):
                if op == "PRODUCT":
                    continue
                xs = [make(dtype, n, r, salt) for r in range(N)]
                got = x.clone()
                dist.reduce(got, dst=root, op=op_of(op))
                if gloo_has(dtype):
                    want = x.clone()
                    dist.reduce(want, dst=root, op=op_of(op), group=GLOO)
                else:
                    want = local_reduce(xs, op)
                if RANK == root:
                    same("reduce %s %s n=%d" % (name, op, n), got, want, tolerance(xs, op))


def test_gathers():
    salt = 2000
    for name in ALL_DTYPES:
        dtype = getattr(torch, name)
        for n in SIZES:
            salt += 1
            xs = [make(dtype, n, r, salt) for r in range(N)]
            out = [torch.empty(n, dtype=dtype) for _ in range(N)]
            dist.all_gather(out, xs[RANK])
            if gloo_has(dtype):
                want = [torch.empty(n, dtype=dtype) for _ in range(N)]
                dist.all_gather(want, xs[RANK], group=GLOO)
            else:
                want = xs
            for r in range(N):
                same("all_gather %s n=%d [%d]" % (name, n, r), out[r], want[r])
            flat = torch.empty(N * n, dtype=dtype)
            dist.all_gather_into_tensor(flat, xs[RANK])
            same("all_gather_into_tensor %s n=%d" % (name, n), flat, torch.cat(want))
            root = salt % N
            gl = [torch.empty(n, dtype=dtype) for _ in range(N)] if RANK == root else None
            dist.gather(xs[RANK], gl, dst=root)
            if RANK == root:
                for r in range(N):
                    same("gather %s n=%d [%d]" % (name, n, r), gl[r], want[r])
            pieces = [make(dtype, n, 100 + r, salt) for r in range(N)]
            got = torch.empty(n, dtype=dtype)
            dist.scatter(got, pieces if RANK == root else None, src=root)
            same("scatter %s n=%d" % (name, n), got, pieces[RANK])


def test_reduce_scatter():
    """Gloo has no reduce-scatter: its all_reduce of the whole input, then
    this rank's block, is the reference (the same reduction per element)."""
    salt = 3000
    for name in REDUCE_DTYPES + ["int8", "bool"]:
        dtype = getattr(torch, name)
        for op in ok_ops(dtype):
            for n in SIZES[:3]:
                salt += 1
                positive = op == "PRODUCT"
                xs, whole = reference_allreduce(dtype, N * n, salt, op, positive)
                tol = tolerance(xs, op)
                want = whole[RANK * n:(RANK + 1) * n]
                tol = None if tol is None else tol[RANK * n:(RANK + 1) * n]
                got = torch.empty(n, dtype=dtype)
                dist.reduce_scatter(got, list(xs[RANK].chunk(N)), op=op_of(op))
                same("reduce_scatter %s %s n=%d" % (name, op, n), got, want, tol)
                got = torch.empty(n, dtype=dtype)
                dist.reduce_scatter_tensor(got, xs[RANK], op=op_of(op))
                same("reduce_scatter_tensor %s %s n=%d" % (name, op, n), got, want, tol)


def splits_of(rank, peer, salt):
    return (rank + 2 * peer + salt) % 4  # zeros included


def test_alltoall():
    salt = 4000
    for name in ALL_DTYPES:
        dtype = getattr(torch, name)
        for k in (1, 3, 25):
            salt += 1
            rows = [make(dtype, N * k * 3, r, salt).reshape(N * k, 3) for r in range(N)]
            got = torch.empty(N * k, 3, dtype=dtype)
            dist.all_to_all_single(got, rows[RANK])
            want = torch.cat([rows[r][RANK * k:(RANK + 1) * k] for r in range(N)])
            if gloo_has(dtype):
                g = torch.empty_like(got)
                dist.all_to_all_single(g, rows[RANK], group=GLOO)
                same("gloo agrees, all_to_all_single %s" % name, g, want)
            same("all_to_all_single %s k=%d" % (name, k), got, want)
            # With split sizes: rank r sends splits_of(r, p) rows to p.
            ins = [make(dtype, 3 * sum(splits_of(r, p, k) for p in range(N)), r, salt)
                   .reshape(-1, 3) for r in range(N)]
            send = [splits_of(RANK, p, k) for p in range(N)]
            recv = [splits_of(p, RANK, k) for p in range(N)]
            got = torch.empty(sum(recv), 3, dtype=dtype)
            dist.all_to_all_single(got, ins[RANK], recv, send)
            want = []
            for p in range(N):
                off = sum(splits_of(p, q, k) for q in range(RANK))
                want.append(ins[p][off:off + splits_of(p, RANK, k)])
            want = torch.cat(want)
            if gloo_has(dtype):
                g = torch.empty_like(got)
                dist.all_to_all_single(g, ins[RANK], recv, send, group=GLOO)
                same("gloo agrees, all_to_all_single splits %s" % name, g, want)
            same("all_to_all_single splits %s k=%d" % (name, k), got, want)
            # The list form, pieces of different sizes.
            outs = [torch.empty(splits_of(p, RANK, k) * 3, dtype=dtype) for p in range(N)]
            dist.all_to_all(outs, list(ins[RANK].reshape(-1).split([s * 3 for s in send])))
            same("all_to_all %s k=%d" % (name, k), torch.cat(outs), want.reshape(-1))


def test_p2p_barrier():
    if N == 1:
        return
    for name in ("float32", "bfloat16", "int8", "bool", "int64"):
        dtype = getattr(torch, name)
        for n in (1, 1001, 40009):
            nxt, prv = (RANK + 1) % N, (RANK - 1) % N
            x = make(dtype, n, RANK, n)
            got = torch.empty(n, dtype=dtype)
            reqs = [dist.isend(x, nxt), dist.irecv(got, prv)]
            for q in reqs:
                q.wait()
            same("isend/irecv ring %s n=%d" % (name, n), got, make(dtype, n, prv, n))
            got = torch.empty(n, dtype=dtype)
            if RANK % 2 == 0:
                dist.send(x, nxt)
                dist.recv(got, prv)
            else:
                dist.recv(got, prv)
                dist.send(x, nxt)
            same("send/recv ring %s n=%d" % (name, n), got, make(dtype, n, prv, n))
    # Tags: each message labelled with its sender's rank, received in order.
    x, got = make(torch.float32, 77, RANK, 3), torch.empty(77)
    reqs = [dist.isend(x, nxt, tag=10 + RANK), dist.irecv(got, prv, tag=10 + prv)]
    for q in reqs:
        q.wait()
    same("isend/irecv ring with tags", got, make(torch.float32, 77, prv, 3))
    for _ in range(3):
        dist.barrier()


def test_any_source():
    """Rank 0 receives from any source, dist.recv without src (which returns
    the sender) and irecv then _source_rank() in turn, while every other
    rank sends it two messages tagged 5: each names its sender and holds
    that sender's next message. In a group of ranks 0 and N-1 the sender
    comes back as its global rank."""
    if N == 1:
        return
    if RANK != 0:
        for k in range(2):
            dist.send(make(torch.float32, 33, RANK, 7000 + k), 0, tag=5)
    else:
        seen = {}
        for i in range(2 * (N - 1)):
            got = torch.empty(33)
            if i % 2 == 0:
                src = dist.recv(got, tag=5)
            else:
                w = dist.irecv(got, tag=5)
                w.wait()
                src = w._source_rank()
            k = seen.get(src, 0)
            seen[src] = k + 1
            check(0 < src < N, "recv from any source: sender %r" % src)
            same("recv from any source, message %d of rank %r" % (k, src), got,
                 make(torch.float32, 33, src, 7000 + k))
        check(seen == {r: 2 for r in range(1, N)}, "messages by sender: %r" % seen)
    g = dist.new_group([0, N - 1])
    if RANK == N - 1:
        dist.send(torch.full((4,), 9.0), 0, group=g)
    elif RANK == 0:
        got = torch.empty(4)
        src = dist.recv(got, group=g)
        check(src == N - 1, "recv from any source in group [0, %d]: sender %r" % (N - 1, src))
        same("recv from any source in a group", got, torch.full((4,), 9.0))


def test_tags_reorder():
    """Tags pick messages, as gloo's do: rank 0 sends a (tag 1), then b
    (tag 2), and rank 1 receives tag 2 first, with irecv posted together
    and with blocking send and recv (small tensors: a send completes before
    its receive comes); then four messages of tags 3, 4, 3, 4, received
    tag 4's first: each tag's in the order sent."""
    if N == 1 or RANK > 1:
        return
    a, b = make(torch.float32, 60, 0, 8100), make(torch.float32, 60, 0, 8101)
    four = [make(torch.int64, 9, 0, 8200 + k) for k in range(4)]
    if RANK == 0:
        for q in [dist.isend(a, 1, tag=1), dist.isend(b, 1, tag=2)]:
            q.wait()
        dist.send(a, 1, tag=1)
        dist.send(b, 1, tag=2)
        for k in range(4):
            dist.send(four[k], 1, tag=3 + k % 2)
        return
    x, y = torch.empty(60), torch.empty(60)
    for q in [dist.irecv(y, 0, tag=2), dist.irecv(x, 0, tag=1)]:
        q.wait()
    same("irecv tag 2 posted before tag 1 gets b", y, b)
    same("irecv tag 1 posted after tag 2 gets a", x, a)
    x, y = torch.empty(60), torch.empty(60)
    dist.recv(y, 0, tag=2)
    dist.recv(x, 0, tag=1)
    same("recv tag 2 first gets b", y, b)
    same("recv tag 1 second gets a", x, a)
    got = [torch.empty(9, dtype=torch.int64) for _ in range(4)]
    for k in (1, 3, 0, 2):
        dist.recv(got[k], 0, tag=3 + k % 2)
    for k in range(4):
        same("message %d of tags 3, 4, 3, 4, tag 4's received first" % k, got[k], four[k])


def test_tag_mismatch():
    """Rank 1 receives with a tag rank 0 did not send before its barrier:
    both get an exception naming the tag, rank 1's listing the message it
    passed over."""
    g = dist.new_group([0, 1])
    if RANK > 1:
        return
    if RANK == 0:
        dist.send(torch.ones(5), 1, group=g, tag=7)
        msg = raises(lambda: dist.barrier(group=g), "tagged 8")
    else:
        msg = raises(lambda: dist.recv(torch.empty(5), 0, group=g, tag=8),
                     "rank 0 called barrier", "tagged 8",
                     "messages from rank 0 passed over: tagged 7 (20 bytes)")
    print("rank %d: tag mismatch: %s" % (RANK, msg.splitlines()[0][:240]), flush=True)


def test_noncontiguous():
    salt = 5000
    bases = [make(torch.float32, 101 * 6, r, salt).reshape(101, 6) for r in range(N)]
    base = bases[RANK]
    want = base[:, ::2].contiguous()
    dist.all_reduce(want, group=GLOO)
    got = base.clone()
    dist.all_reduce(got[:, ::2])
    same("all_reduce of a strided view", got[:, ::2], want,
         tolerance([b[:, ::2] for b in bases], "SUM"))
    same("all_reduce leaves the view's neighbours", got[:, 1::2], base[:, 1::2])
    t = make(torch.float64, 12 * 5, RANK, salt).reshape(12, 5).t()
    dist.broadcast(t, src=N - 1)
    same("broadcast into a transposed tensor", t,
         make(torch.float64, 12 * 5, N - 1, salt).reshape(12, 5).t())
    big = torch.zeros(7, 2 * N, dtype=torch.int32)
    outs = [big[:, 2 * r] for r in range(N)]
    dist.all_gather(outs, torch.arange(7, dtype=torch.int32) * (RANK + 1))
    for r in range(N):
        same("all_gather into column %d" % r, big[:, 2 * r],
             torch.arange(7, dtype=torch.int32) * (r + 1))
        same("all_gather leaves column %d" % (2 * r + 1), big[:, 2 * r + 1],
             torch.zeros(7, dtype=torch.int32))
    rs = torch.zeros(9, 2)
    dist.reduce_scatter(rs[:, 1], [torch.full((9,), float(RANK + r)) for r in range(N)])
    same("reduce_scatter into a column", rs[:, 1],
         torch.full((9,), float(sum(q + RANK for q in range(N)))))
    if N > 1:
        got = torch.zeros(10, 3)
        reqs = [dist.isend(torch.arange(10.) + RANK, (RANK + 1) % N),
                dist.irecv(got[:, 2], (RANK - 1) % N)]
        for q in reqs:
            q.wait()
        same("irecv into a column", got[:, 2], torch.arange(10.) + (RANK - 1) % N)


def test_async():
    ts = [torch.full((1000 * (i + 1),), float(RANK + i)) for i in range(4)]
    works = [dist.all_reduce(t, async_op=True) for t in ts]
    for i, w in reversed(list(enumerate(works))):
        w.wait()
        check(w.is_completed(), "async all_reduce %d completed" % i)
        same("async all_reduce %d" % i, ts[i],
             torch.full((1000 * (i + 1),), float(sum(r + i for r in range(N)))))
    t = torch.ones(64) * (RANK + 1)
    fut = dist.all_reduce(t, async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2).wait()
    same("future's then", doubled, torch.full((64,), 2.0 * sum(range(1, N + 1))))
    w = dist.all_gather([torch.empty(3) for _ in range(N)], torch.ones(3), async_op=True)
    t0 = time.time()
    while not w.is_completed() and time.time() - t0 < 30:
        time.sleep(0.001)
    check(w.is_completed(), "is_completed turns true without wait()")


def test_sequence_numbers():
    """The group's sequence number counts its collectives, the same on every
    rank (gathered over gloo, an independent group); point-to-point calls,
    which only two ranks make, leave it alone; setting it starts it again
    at 0."""
    before = WORLD._get_sequence_number_for_group()
    dist.all_reduce(torch.ones(5))
    dist.broadcast(torch.ones(3), 0)
    dist.barrier()
    if N > 1:
        x, got = torch.ones(4), torch.empty(4)
        reqs = [dist.isend(x, (RANK + 1) % N), dist.irecv(got, (RANK - 1) % N)]
        for q in reqs:
            q.wait()
    after = WORLD._get_sequence_number_for_group()
    check(after - before == 3, "3 collectives and a send/recv counted %d" % (after - before))
    seen = [torch.zeros(1, dtype=torch.int64) for _ in range(N)]
    dist.all_gather(seen, torch.tensor([after], dtype=torch.int64), group=GLOO)
    check(len(set(int(s) for s in seen)) == 1, "every rank's sequence number the same: %s" %
          [int(s) for s in seen])
    WORLD._set_sequence_number_for_group()
    dist.all_reduce(torch.ones(2))
    check(WORLD._get_sequence_number_for_group() == 1,
          "set starts it again: 1 after one collective, not %d" %
          WORLD._get_sequence_number_for_group())


def test_subgroups():
    groups = [[0, 1]] + ([[0, N - 1], [1, N - 1]] if N > 2 else [])
    for ranks in groups:
        g = dist.new_group(ranks)  # every rank calls new_group, members only use it
        if RANK not in ranks:
            continue
        x = torch.full((33,), float(RANK + 1), dtype=torch.float64)
        dist.all_reduce(x, group=g)
        same("all_reduce over group %s" % ranks, x,
             torch.full((33,), float(sum(r + 1 for r in ranks)), dtype=torch.float64))
        out = [torch.empty(2, dtype=torch.int64) for _ in ranks]
        dist.all_gather(out, torch.full((2,), RANK, dtype=torch.int64), group=g)
        same("all_gather over group %s" % ranks, torch.stack(out)[:, 0],
             torch.tensor(ranks, dtype=torch.int64))
        dist.destroy_process_group(g)


def coalesced_inputs(dtype, rank):
    """Rank rank's list for the coalesced calls: four shapes (complex64's
    made of float32 pairs)."""
    shapes = [(3,), (2, 5), (1,), (4, 1, 3)]
    base = torch.float32 if dtype.is_complex else dtype
    xs = [make(base, math.prod(s) * (2 if dtype.is_complex else 1), rank, 6000 + i)
          for i, s in enumerate(shapes)]
    if dtype.is_complex:
        return [torch.view_as_complex(x.reshape(-1, 2)).reshape(s) for x, s in zip(xs, shapes)]
    return [x.reshape(s) for x, s in zip(xs, shapes)]


def real(t):
    return torch.view_as_real(t) if t.is_complex() else t


def test_coalesced():
    """all_reduce_coalesced and all_gather_coalesced of lists of tensors of
    several shapes, against gloo's."""
    for name in ("float32", "float64", "int32", "complex64"):
        dtype = getattr(torch, name)
        ins = [coalesced_inputs(dtype, r) for r in range(N)]
        xs = ins[RANK]
        got, want = [x.clone() for x in xs], [x.clone() for x in xs]
        dist.all_reduce_coalesced(got)
        dist.all_reduce_coalesced(want, group=GLOO)
        for i in range(len(xs)):
            tol = tolerance([real(ins[r][i]) for r in range(N)], "SUM")
            same("all_reduce_coalesced %s [%d]" % (name, i), real(got[i]), real(want[i]), tol)
        outs = [[torch.empty_like(x) for x in xs] for _ in range(N)]
        refs = [[torch.empty_like(x) for x in xs] for _ in range(N)]
        dist.all_gather_coalesced(outs, xs)
        dist.all_gather_coalesced(refs, xs, group=GLOO)
        for r in range(N):
            for i in range(len(xs)):
                same("all_gather_coalesced %s [%d][%d]" % (name, r, i), outs[r][i], refs[r][i])


def test_mismatch():
    """A rank whose all_reduce has 2 more elements: every rank gets an
    exception naming the count within seconds (the timeout is 60 s)."""
    g = dist.new_group(list(range(N)))
    n = 1000 + (2 if RANK == N - 1 else 0)
    t0 = time.time()
    msg = raises(lambda: dist.all_reduce(torch.ones(n), group=g), "count")
    took = time.time() - t0
    check(took < 15, "the mismatch took %.1f s to fail" % took)
    print("rank %d: mismatch: %.1f s: %s" % (RANK, took, msg.splitlines()[0][:240]), flush=True)
    raises(lambda: dist.all_reduce(torch.ones(4), group=g), "count")  # the group stays failed
    x = torch.ones(4)
    dist.all_reduce(x)  # other groups go on
    same("world all_reduce after a failed group", x, torch.full((4,), float(N)))


def train(pg):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    ddp = DDP(model, process_group=pg, bucket_cap_mb=0.001)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(100 + RANK)
    for _ in range(20):
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        loss = ((ddp(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def test_ddp():
    """Same model, seed and data under both backends. At 2 ranks the
    gradient all-reduce adds two values, so the weights agree bit for bit;
    at 3 the two backends add in different orders, each step's gradient
    differs by an ulp or so, and 20 steps of momentum SGD carry that to
    within 1e-5 relative (3e-6 measured)."""
    wd, wg = train(WORLD), train(GLOO)
    if RANK == 0:
        print("DDP: dtrain vs gloo: largest difference %.2g relative" %
              ((wd - wg).abs() / wg.abs().clamp(min=1e-3)).max().item(), flush=True)
    if N == 2:
        same("DDP weights, dtrain vs gloo", wd, wg)
    else:
        same("DDP weights, dtrain vs gloo", wd, wg, 1e-5 * wg.abs() + 1e-7)
    every = [torch.empty_like(wd) for _ in range(N)]
    dist.all_gather(every, wd, group=GLOO)
    for r in range(N):
        same("DDP weights of rank %d equal ours" % r, every[r], wd)


def test_destroy_pending():
    """A group destroyed from Python while its completion thread still
    holds a Work whose tensor Python let go of: PyTorch hands that tensor's
    Python object to the tensor, so dropping the Work needs the GIL, which
    the destroying thread holds. Rank 1 drops an irecv's tensor and Work and
    destroys the group before rank 0 sends; the destroy must return (it
    deadlocked, as test_send_recv_with_tag of PyTorch's suite did once in
    CI), and another tensor on the same memory holds what rank 0 sent."""
    import faulthandler
    g = dist.new_group([0, 1])
    if RANK > 1:
        return
    faulthandler.dump_traceback_later(15, exit=True)  # a deadlock holds the GIL: no Python
    if RANK == 1:
        t = torch.zeros(1000)
        # Another tensor on the same memory; not a view, whose base would keep t.
        alias = torch.empty(0).set_(t.storage())
        w = dist.irecv(t, 0, group=g)
        del t, w
    else:
        time.sleep(1)  # rank 1 is in the destroy by now
        dist.send(torch.arange(1000.), 1, group=g)
    t0 = time.time()
    dist.destroy_process_group(g)
    del g
    faulthandler.cancel_dump_traceback_later()
    if RANK == 1:
        same("irecv completed by the group's destroy", alias, torch.arange(1000.))
        check(time.time() - t0 < 10, "the destroy took %.1f s" % (time.time() - t0))


def test_peer_ends():
    """The last rank's process ends; the others' next all_reduce with it
    fails within seconds, naming it."""
    last = N - 1
    dist.barrier(group=GLOO)
    if RANK == last:
        os._exit(0)
    t0 = time.time()
    msg = raises(lambda: dist.all_reduce(torch.ones(1000)), "rank %d" % last)
    took = time.time() - t0
    check(took < 15, "the ended peer took %.1f s to notice" % took)
    print("rank %d: peer ended: %.1f s: %s" % (RANK, took, msg.splitlines()[0][:240]),
          flush=True)


def worker(init):
    setup(init)
    t0 = time.time()
    for test in (test_allreduce, test_comm_mem, test_refusals, test_broadcast_reduce, test_gathers,
                 test_reduce_scatter, test_alltoall, test_p2p_barrier, test_any_source,
                 test_tags_reorder, test_noncontiguous, test_async, test_sequence_numbers,
                 test_subgroups, test_coalesced, test_tag_mismatch, test_mismatch,
                 test_ddp, test_destroy_pending):
        test()
        dist.barrier(group=GLOO)
        if RANK == 0:
            print("%s: %.1f s" % (test.__name__, time.time() - t0), flush=True)
    if N > 1:
        test_peer_ends()
    print("rank %d: %d checks, %d failed" % (RANK, checks, len(failures)), flush=True)
    if not failures:
        print("rank %d: ok" % RANK, flush=True)
    sys.stdout.flush()
    # No teardown: the gloo group's peer is gone, and its destructor waits.
    os._exit(1 if failures else 0)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--worker":
        worker(sys.argv[2])
    else:
        driver()
