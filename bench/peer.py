"""The PyTorch peer of //bench: the same workloads as the C++ rows, run with PyTorch's own implementations.

//bench (the lessons' cases, solutions/lesson*/bench_case.cc, and bench/scaler.cc) runs this script once per case
as a subprocess, with the exact sizes, seed, thread count and device of its own rows, and merges what it prints
into its tables:

    python3 bench/peer.py --device=cpu --threads=1 --case=l1 --spec=width=1024,depth=4,batch=512,...

Each case mirrors one C++ case line by line (same model, same initialisation seed, same data, same optimizer,
same warm-up and repetitions, same timer: synchronise, clock, work, synchronise, clock; the median):
  l1      lesson 1's AMP step: torch.autocast and, for float16, the GradScaler the version has for the device
  l2      lesson 2's accumulation loop (per micro-batch loss weighted by its share of the window)
  l4      lesson 4's recipes: torch.utils.checkpoint.checkpoint_sequential with the same number of segments
  scaler  the GradScaler's own cost: scale + unscale_ + step + update over many parameter tensors
  l5      lesson 5's data-parallel step: DistributedDataParallel (gloo, the same bucket cap) and DDP +
          ZeroRedundancyOptimizer, on N spawned rank processes meeting at a FileStore (bounded by a timeout)
  l6      lesson 6's AdamW step: torch.optim.AdamW, and with fused=True where the version has it for the device
  l7      lesson 7's sharded training step: FullyShardedDataParallel (FULL_SHARD, gloo) on N spawned rank
          processes; where this PyTorch cannot run it on the CPU, an `na` line with what failed (exception text)

Peak bytes. On CUDA: the caching allocator's statistics (peak minus what was allocated at the start), as the
C++ meter reads them. On CPU: the CPU allocator's allocation and free events from the legacy profiler
(profile_memory): their running sum over one step, maximum minus start (see cpu_peak_bytes). bench/peer_runner.cc measures our rows the
same way (and also with its counting allocator), so both sides report the same quantity.

Output, one line per record on stdout, tab-separated:
  info    KEY VALUE                   (torch version, threads, python)
  row     KEY MEDIAN_MS MIN_MS MAX_MS PEAK_BYTES_OR_- WHAT
  na      KEY REASON                  (no PyTorch equivalent in this version/device)
Exit status 3 with one `missing REASON` line when torch cannot be imported: the bench reports the peer as
not installed instead of failing.
"""

import argparse
import contextlib
import sys
import time


def emit(*fields):
    print("\t".join(str(f).replace("\t", " ").replace("\n", " ") for f in fields), flush=True)


try:
    import torch
    import torch.nn.functional as F
    from torch.utils.checkpoint import checkpoint_sequential
except Exception as error:  # ImportError, or a broken install (missing shared library, ...)
    emit("missing", "%s cannot import torch (%s: %s)" % (sys.executable, type(error).__name__, error))
    sys.exit(3)


def version_at_least(major, minor):
    parts = torch.__version__.split(".")
    return (int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)) >= (major, minor)


def short_version():
    return ".".join(torch.__version__.split(".")[:2])


# ---- timing and peak bytes --------------------------------------------------------------------------------

def synchronize(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_repeated(device, work, warmup, repeats):
    """workshop::time_repeated in Python: untimed warm-ups, then synchronised repetitions; median, min, max."""
    for _ in range(warmup):
        work()
    samples = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        work()
        synchronize(device)
        samples.append((time.perf_counter() - start) * 1e3)
    samples.sort()
    n = len(samples)
    median = samples[n // 2] if n % 2 else 0.5 * (samples[n // 2 - 1] + samples[n // 2])
    return median, samples[0], samples[-1]


def _legacy_profiler_config():
    # The legacy profiler records every CPU allocation and free (with its size) in order; the Kineto-based
    # torch.profiler folds them into per-op totals, which hides a temporary freed inside an op.
    from torch.autograd import profiler_legacy
    return profiler_legacy.profile(profile_memory=True).config()


MARKER = "bench_peak_window"


def cpu_peak_bytes(work, between=None):
    """The highest running sum of CPU allocations minus frees during one work() (bytes above its start).

    The profiler reports the free of a block only if it saw the block's allocation, so work() runs twice under
    it and the second run, inside a marker range, is the one measured: whatever a step frees (last step's
    gradients, say) was then allocated under the profiler."""
    torch.autograd._enable_profiler_legacy(_legacy_profiler_config())
    try:
        work()
        if between is not None:
            between()
        with torch.autograd.profiler.record_function(MARKER):
            work()
    finally:
        records = torch.autograd._disable_profiler_legacy()
    # A pop event carries its push's handle, not always its name: find the marker's handle first.
    marker = [e.handle() for thread in records for e in thread if e.kind() == "push" and e.name() == MARKER]
    if not marker:
        raise RuntimeError("the profiler did not record the measured range")
    events = [e for thread in records for e in thread
              if e.kind() == "memory_alloc" or (e.kind() in ("push", "pop") and e.handle() == marker[0])]
    origin = events[0]
    events.sort(key=lambda e: origin.cpu_elapsed_us(e))
    current = base = peak = 0
    inside = False
    for e in events:
        if e.kind() == "push":
            inside, base = True, current
        elif e.kind() == "pop":
            inside = False
        else:
            current += e.cpu_memory_usage()
            if inside:
                peak = max(peak, current - base)
    return peak


def peak_bytes(device, work, between=None):
    """Peak bytes of one work(); `between` runs before the measured run (as in bench/peer_runner.h)."""
    if device.type == "cuda":
        if between is not None:
            between()
        synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        work()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - base
    return cpu_peak_bytes(work, between)


def how_peak_measured(device):
    return ("CUDA allocator stats" if device.type == "cuda"
            else "legacy-profiler allocation events")


def row(key, timing, peak, what):
    emit("row", key, "%.4f" % timing[0], "%.4f" % timing[1], "%.4f" % timing[2],
         "-" if peak is None else int(peak), what)


def grad_scaler_for(device, **options):
    """PyTorch's GradScaler for the device, or (None, reason) where this version has none."""
    if version_at_least(2, 3) and hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler(device.type, **options), "torch.amp.GradScaler('%s')" % device.type
    if device.type == "cuda":
        return torch.cuda.amp.GradScaler(**options), "torch.cuda.amp.GradScaler()"
    return None, "not available in %s on CPU" % short_version()  # CPU kernels arrived in 2.3


# ---- cases ------------------------------------------------------------------------------------------------

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def case_l1(device, spec):
    """As solutions/lesson1_amp/bench_case.cc: MLP of depth x (Linear(width, width), ReLU), batch, SGD(lr 1e-4),
    mse loss."""
    width, depth, batch = int(spec["width"]), int(spec["depth"]), int(spec["batch"])
    warmup, repeats = int(spec["warmup"]), int(spec["repeats"])
    for key in spec["variants"].split("+"):
        torch.manual_seed(0)
        layers = []
        for _ in range(depth):
            layers += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        model = torch.nn.Sequential(*layers).to(device)
        x = torch.randn(batch, width, device=device)
        y = torch.randn(batch, width, device=device)
        sgd = torch.optim.SGD(model.parameters(), lr=1e-4)
        autocast = key in DTYPES
        dtype = DTYPES.get(key, torch.float32)
        scaler, scaler_what = None, ""
        if key == "fp16":
            scaler, scaler_what = grad_scaler_for(device)
            if scaler is None:
                emit("na", "l1." + key, "GradScaler " + scaler_what)
                continue
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = key == "tf32"

        def step():
            # LibTorch's Optimizer::zero_grad() zeroes in 1.13 and sets to none from 2.0, as Python's does:
            # the Python default of the same version is the same choice.
            sgd.zero_grad()
            # 1.13's torch.autocast rejects float32 even when disabled: no context at all for float32.
            with torch.autocast(device.type, dtype=dtype) if autocast else contextlib.nullcontext():
                loss = F.mse_loss(model(x).float(), y)
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(sgd)
                scaler.update()
            else:
                loss.backward()
                sgd.step()

        timing = time_repeated(device, step, warmup, repeats)
        peak = peak_bytes(device, step)
        if device.type == "cuda":
            torch.backends.cuda.matmul.allow_tf32 = False
        what = ("torch.autocast('%s', %s)" % (device.type, str(dtype).replace("torch.", "")) if autocast
                else "float32" + (" (allow_tf32)" if key == "tf32" else ""))
        if scaler is not None:
            what += " + " + scaler_what
        row("l1." + key, timing, peak, what)


def case_l2(device, spec):
    """As solutions/lesson2_accumulation/bench_case.cc: Linear(256, w), ReLU, Linear(w, w), ReLU, Linear(w, 16);
    SGD(1e-4); K micro-batches."""
    batch, width = int(spec["batch"]), int(spec["width"])
    warmup, repeats = int(spec["warmup"]), int(spec["repeats"])
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(256, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                torch.nn.ReLU(), torch.nn.Linear(width, 16)).to(device)
    x = torch.randn(batch, 256, device=device)
    y = torch.randn(batch, 16, device=device)
    sgd = torch.optim.SGD(model.parameters(), lr=1e-4)
    for k in [int(v) for v in spec["ks"].split("+")]:
        micro = list(zip(x.split(batch // k), y.split(batch // k)))

        def window():
            sgd.zero_grad()
            total = sum(xb.shape[0] for xb, _ in micro)
            for xb, yb in micro:
                # Each micro-batch's mean loss weighted by its share of the window: the gradients add up to
                # the whole window's. backward() per micro-batch frees its activations before the next one.
                (F.mse_loss(model(xb), yb) * (xb.shape[0] / total)).backward()
            sgd.step()

        window()  # warm-up, allocates .grad
        peak = peak_bytes(device, window)
        timing = time_repeated(device, window, warmup, repeats)
        row("l2.k%d" % k, timing, peak, "loop of %d backward() calls, one SGD step" % k)


class Block(torch.nn.Module):
    """lesson4_memory's Block: Linear -> GELU -> dropout(p)."""

    def __init__(self, width, dropout):
        super().__init__()
        self.linear = torch.nn.Linear(width, width)
        self.dropout = dropout

    def forward(self, x):
        h = F.gelu(self.linear(x))
        return F.dropout(h, self.dropout, self.training) if self.dropout > 0 else h


def checkpoint_mode():
    """How this version's checkpoint_sequential is called so that every segment's parameters get gradients."""
    import inspect
    if "use_reentrant" in inspect.signature(checkpoint_sequential).parameters:
        return "non-reentrant"  # 2.x: use_reentrant=False, the mode PyTorch recommends
    return "reentrant"  # 1.13: reentrant only; the input must require grad or segment 1 gets no gradients


def case_l4(device, spec):
    """mem::measure_training: 32 Blocks, Adam(1e-3), one warm-up step, gradients to none, timed steps."""
    layers, width, batch = int(spec["layers"]), int(spec["width"]), int(spec["batch"])
    timed = int(spec["timed"])
    mode = checkpoint_mode()
    for variant in spec["recipes"].split("+"):
        micro_batch, segments, low = (int(v) for v in variant.split(":"))
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[Block(width, 0.0) for _ in range(layers)]).to(device)
        torch.manual_seed(1)
        inputs = torch.randn(batch, width).to(device)
        targets = torch.randn(batch, width).mul(0.5).to(device)
        adam = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            adam.zero_grad(set_to_none=True)
            rows = inputs.shape[0]
            micro = rows if micro_batch == 0 else min(micro_batch, rows)
            total = 0.0
            for start in range(0, rows, micro):
                n = min(micro, rows - start)
                chunk = inputs.narrow(0, start, n)
                with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bool(low)):
                    if segments == 1:
                        out = model(chunk)
                    elif mode == "non-reentrant":
                        out = checkpoint_sequential(model, segments, chunk, use_reentrant=False)
                    else:
                        out = checkpoint_sequential(model, segments, chunk.detach().requires_grad_())
                    loss = F.mse_loss(out.float(), targets.narrow(0, start, n)) * (n / rows)
                del out
                loss.backward()
                total += loss.item()
            adam.step()
            return total

        step()  # warm-up: creates Adam's state
        adam.zero_grad(set_to_none=True)
        synchronize(device)
        timing = time_repeated(device, step, 0, timed)
        adam.zero_grad(set_to_none=True)
        peak = peak_bytes(device, step, lambda: adam.zero_grad(set_to_none=True))
        what = []
        if segments > 1:
            what.append("checkpoint_sequential(%d segments, %s)" % (segments, mode))
        if low:
            what.append("torch.autocast bfloat16")
        if micro_batch:
            what.append("%d micro-batches" % ((batch + micro_batch - 1) // micro_batch))
        row("l4.%s" % variant.replace(":", "_"), timing, peak, ", ".join(what) or "plain")


class NoopOptimizer(torch.optim.Optimizer):
    """An optimizer whose step does nothing: the scaler's own cost is measured without a parameter update."""

    def __init__(self, params):
        super().__init__(params, {})

    def step(self, closure=None):
        return None


def case_scaler(device, spec):
    """The scaler alone: scale + unscale_ + step (no-op optimizer) + update over `tensors` gradients."""
    layers, width = int(spec["layers"]), int(spec["width"])
    warmup, repeats = int(spec["warmup"]), int(spec["repeats"])
    # init_scale 1: unscaling over and over keeps the gradients' values (no drift into subnormals, which
    # would slow the CPU down); the work per step is the same for any scale.
    scaler, what = grad_scaler_for(device, init_scale=1.0)
    if scaler is None:
        emit("na", "scaler.pytorch", what)
        return
    torch.manual_seed(0)
    params = []
    for _ in range(layers):
        params += [torch.nn.Parameter(torch.randn(width, width, device=device)),
                   torch.nn.Parameter(torch.randn(width, device=device))]
    for p in params:
        p.grad = torch.randn_like(p)
    optimizer = NoopOptimizer(params)
    loss = torch.ones((), device=device)

    def step():
        scaler.scale(loss)
        scaler.step(optimizer)  # unscale_ (fused kernel), one .item() sync, then the (no-op) step
        scaler.update()

    timing = time_repeated(device, step, warmup, repeats)
    row("scaler.pytorch", timing, None, what + ", %d tensors" % len(params))


def _l5_median(samples):
    """demo_ranks.h's median (the upper middle of an even count), so both sides summarise the steps alike."""
    samples = sorted(samples)
    return samples[len(samples) // 2]


def _l5_rank(rank, world, store_path, spec, results):
    """One rank of case_l5 (a spawned process): DDP, then DDP + ZeroRedundancyOptimizer, as demo_ranks.h's ranks."""
    import os
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # loopback only, as our ranks
    import faulthandler
    # A rank that hangs prints where, a little before the parent's deadline kills it.
    faulthandler.dump_traceback_later(float(spec.get("timeout", "600")) * 0.9, exit=True)
    torch.set_num_threads(int(spec["threads"]))
    width, depth, batch = int(spec["width"]), int(spec["depth"]), int(spec["batch"])
    bucket_mb = int(spec["bucket_bytes"]) / 2 ** 20
    steps = int(spec["steps"])
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    try:
        # demo_ranks.h: data from seed 1, each rank's contiguous shard; the model from seed 0.
        torch.manual_seed(1)
        x, y = torch.randn(batch, width), torch.randn(batch, width)
        per_rank = batch // world
        xs, ys = x.narrow(0, rank * per_rank, per_rank), y.narrow(0, rank * per_rank, per_rank)

        def mlp():
            torch.manual_seed(0)
            layers = []
            for i in range(depth):
                layers.append(torch.nn.Linear(width, width))
                if i + 1 < depth:
                    layers.append(torch.nn.Tanh())
            return torch.nn.Sequential(*layers)

        try:
            from torch.distributed.optim import ZeroRedundancyOptimizer  # 1.8 and later
        except ImportError:
            ZeroRedundancyOptimizer = None
        # DDP caps its first bucket at dist._DEFAULT_FIRST_BUCKET_BYTES (1 MiB), the others at bucket_cap_mb;
        # ours caps every bucket at the budget: the same cap for all of them, where this version has the knob.
        if hasattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES"):
            dist._DEFAULT_FIRST_BUCKET_BYTES = int(spec["bucket_bytes"])
        out = {"threads": torch.get_num_threads(), "first_bucket": hasattr(dist, "_DEFAULT_FIRST_BUCKET_BYTES")}
        for variant in ["ddp", "zero"]:
            if variant == "zero" and ZeroRedundancyOptimizer is None:
                out[variant] = None
                continue

            def build(count_hook):
                model = DistributedDataParallel(mlp(), bucket_cap_mb=bucket_mb)
                if count_hook is not None:
                    model.register_comm_hook(None, count_hook)
                if variant == "zero":
                    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam,
                                                        lr=1e-3)
                else:
                    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)

                def step():
                    optimizer.zero_grad(set_to_none=True)
                    F.mse_loss(model(xs), ys).backward()
                    optimizer.step()
                return step

            step = build(None)  # DDP's own (C++) all-reduce path: the timed one
            step()  # warm-up: Adam's state; DDP rebuilds its buckets after the first backward
            samples = []
            for _ in range(steps):
                dist.barrier()
                start = time.perf_counter()
                step()
                samples.append((time.perf_counter() - start) * 1e3)
            # Counting, untimed: the same model and bucket cap with a comm hook that counts and then does what
            # DDP's default does (allreduce_hook), and ZeRO's broadcasts / all-gathers through counting wrappers.
            calls = {"all_reduce": 0, "broadcast": 0, "all_gather": 0}

            def counting_hook(state, bucket):
                calls["all_reduce"] += 1
                return allreduce_hook(state, bucket)

            counted = build(counting_hook)
            counted()  # the first step: buckets rebuilt after it
            originals = {name: getattr(dist, name) for name in ("broadcast", "all_gather")}

            def counting(name):
                def call(*args, **kwargs):
                    calls[name] += 1
                    return originals[name](*args, **kwargs)
                return call

            for key in calls:
                calls[key] = 0
            for name in originals:
                setattr(dist, name, counting(name))
            try:
                counted()
            finally:
                for name, function in originals.items():
                    setattr(dist, name, function)
            out[variant] = (_l5_median(samples), min(samples), max(samples), dict(calls))
        dist.barrier()
        if rank == 0:
            results.put(out)  # a pipe write, done when put() returns
    except BaseException:
        import traceback
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    # Leave without tearing the group down: on a loaded machine gloo's teardown has hung a rank past the
    # parent's deadline, and every rank has passed the last barrier, so nothing is left to wait for.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def case_l5(device, spec):
    """demo_ranks.h's data-parallel step with PyTorch's DistributedDataParallel and ZeroRedundancyOptimizer.

    For each world size, spawns that many rank processes (torch.multiprocessing, start method "spawn") that meet
    at a FileStore in a temporary folder and join one gloo group on loopback. Bounded by spec["timeout"] seconds
    per world size: ranks still running then are killed, and the rows say so."""
    import os
    import shutil
    import tempfile
    import torch.multiprocessing as mp
    if device.type != "cpu":
        for n in spec["worlds"].split("+"):
            for variant in ("ddp", "zero"):
                emit("na", "l5.n%s.%s" % (n, variant), "the lesson 5 bench runs gloo on CPU only")
        return
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        for n in spec["worlds"].split("+"):
            for variant in ("ddp", "zero"):
                emit("na", "l5.n%s.%s" % (n, variant), "this torch has no gloo backend")
        return
    context = mp.get_context("spawn")
    timeout = float(spec.get("timeout", "600"))
    for n in (int(v) for v in spec["worlds"].split("+")):
        folder = tempfile.mkdtemp(prefix="bench_peer_l5_")
        results = context.SimpleQueue()
        ranks = [context.Process(target=_l5_rank, args=(r, n, os.path.join(folder, "store"), spec, results))
                 for r in range(n)]
        failure = ""
        try:
            for p in ranks:
                p.start()
            deadline = time.monotonic() + timeout
            while any(p.is_alive() for p in ranks) and time.monotonic() < deadline:
                if any(p.exitcode not in (None, 0) for p in ranks):
                    break  # one rank failed: the others wait for it forever
                time.sleep(0.05)
            for r, p in enumerate(ranks):
                if p.is_alive():
                    failure = failure or ("rank %d still running after %.0f s: killed" % (r, timeout)
                                          if time.monotonic() >= deadline else "rank %d was left waiting" % r)
                    p.kill()  # only the processes this case started
                p.join()
                if p.exitcode != 0 and not failure:
                    failure = "rank %d exited with status %s (its error is printed above)" % (r, p.exitcode)
            out = None if failure or results.empty() else results.get()
        finally:
            for p in ranks:
                if p.is_alive():
                    p.kill()
                    p.join()
            shutil.rmtree(folder, ignore_errors=True)
        if out is None:
            raise SystemExit("peer.py l5 with %d ranks: %s" % (n, failure or "rank 0 sent no results"))
        for variant, what in (("ddp", "DistributedDataParallel(gloo, bucket_cap_mb=%g)" % (
                                  int(spec["bucket_bytes"]) / 2 ** 20)),
                              ("zero", "DDP + ZeroRedundancyOptimizer(Adam)")):
            key = "l5.n%d.%s" % (n, variant)
            if out[variant] is None:
                emit("na", key, "torch %s has no torch.distributed.optim.ZeroRedundancyOptimizer" % short_version())
                continue
            median, fastest, slowest, calls = out[variant]
            if variant == "ddp" and out.get("first_bucket"):
                what += ", first bucket capped the same"
            counted = ", ".join("%d %s" % (v, k) for k, v in calls.items() if v)
            row(key, (median, fastest, slowest), None,
                "%s; %d calls/step (%s); %d thread(s)/rank" % (what, sum(calls.values()), counted or "none",
                                                              out["threads"]))


def _fsdp_import():
    """PyTorch's FSDP classes, or (None, None, reason): what importing torch.distributed.fsdp raised here."""
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    except Exception as error:  # e.g. 1.13 on Python 3.11: a dataclass default that 3.11 refuses (ValueError)
        return None, None, "import torch.distributed.fsdp failed (%s: %s)" % (
            type(error).__name__, str(error).split("\n")[0][:200])
    return FullyShardedDataParallel, ShardingStrategy, ""


def _l7_rank(rank, world, store_path, spec, results):
    """One rank of case_l7 (a spawned process): the demo's MLP under FSDP(FULL_SHARD), Adam, timed steps."""
    import os
    import torch.distributed as dist
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import faulthandler
    faulthandler.dump_traceback_later(float(spec.get("timeout", "600")) * 0.9, exit=True)
    torch.set_num_threads(int(spec["threads"]))
    layers, width, items, steps = int(spec["layers"]), int(spec["width"]), int(spec["items"]), int(spec["steps"])
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
    stage = "import"
    try:
        fsdp_class, strategy, reason = _fsdp_import()
        if fsdp_class is None:
            raise RuntimeError(reason)
        # lesson7_fsdp/demo.cc: the model from seed 3 (Linear(width, width) then tanh, `layers` times), the data
        # from seed 4, each rank its contiguous slice of the items.
        torch.manual_seed(3)
        linears = [torch.nn.Linear(width, width) for _ in range(layers)]
        torch.manual_seed(4)
        x, y = torch.randn(items, width), torch.randn(items, width)
        per_rank = items // world
        xr, yr = x.narrow(0, rank * per_rank, per_rank), y.narrow(0, rank * per_rank, per_rank)
        stage = "FullyShardedDataParallel(..., sharding_strategy=FULL_SHARD, device_id=cpu)"
        # One FSDP unit per layer (as the lesson shards layer by layer), inside a root unit. device_id names the
        # CPU as the compute device: without it, FSDP picks the current accelerator for a module on the CPU (2.6
        # raises "FSDP needs a non-CPU accelerator device" when there is none; 1.13 asks torch.cuda either way).
        cpu = torch.device("cpu")
        blocks = []
        for linear in linears:
            blocks += [fsdp_class(linear, sharding_strategy=strategy.FULL_SHARD, device_id=cpu), torch.nn.Tanh()]
        model = fsdp_class(torch.nn.Sequential(*blocks), sharding_strategy=strategy.FULL_SHARD, device_id=cpu)
        stage = "torch.optim.Adam"
        adam = torch.optim.Adam(model.parameters(), lr=1e-3)

        def step():
            adam.zero_grad()
            F.mse_loss(model(xr), yr).backward()
            adam.step()

        stage = "the first step (forward, backward, Adam)"
        step()
        stage = "the timed steps"
        samples = []
        for _ in range(steps):
            dist.barrier()
            start = time.perf_counter()
            step()
            samples.append((time.perf_counter() - start) * 1e3)
        # What this rank keeps between steps: its parameters' storage, their gradients, Adam's moments.
        kept = 0
        for p in model.parameters():
            kept += p.numel() * p.element_size()
            if p.grad is not None:
                kept += p.grad.numel() * p.grad.element_size()
        for state in adam.state.values():
            for name in ("exp_avg", "exp_avg_sq"):
                if name in state:
                    kept += state[name].numel() * state[name].element_size()
        out = {"samples": samples, "kept": kept, "threads": torch.get_num_threads(), "error": ""}
        dist.barrier()
    except Exception as error:
        out = {"error": "%s raised %s: %s" % (stage, type(error).__name__, str(error).split("\n")[0][:200])}
    if rank == 0:
        results.put(out)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # no group teardown, as _l5_rank


def case_l7(device, spec):
    """Lesson 7: one training step of lesson7_fsdp/demo.cc's MLP (same sizes and seeds, Adam(1e-3)) under PyTorch's
    FullyShardedDataParallel (ShardingStrategy.FULL_SHARD, one unit per Linear) on `ranks` spawned processes in one
    gloo group on loopback, beside the lesson's ShardedStack. Where this PyTorch cannot (the import fails, or FSDP
    refuses the CPU), the row says what failed, with the exception's text. Bounded by spec["timeout"] seconds."""
    import os
    import shutil
    import tempfile
    import torch.multiprocessing as mp
    key, n = "l7.fsdp", int(spec["ranks"])
    if device.type != "cpu":
        emit("na", key, "the lesson 7 bench runs gloo on CPU only")
        return
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        emit("na", key, "this torch has no gloo backend")
        return
    prefix = "FSDP in PyTorch %s (Python %d.%d.%d): " % ((torch.__version__,) + tuple(sys.version_info[:3]))
    fsdp_class, _, reason = _fsdp_import()
    if fsdp_class is None:  # the same in every rank: say so without starting them
        emit("na", key, prefix + reason)
        return
    context = mp.get_context("spawn")
    timeout = float(spec.get("timeout", "600"))
    folder = tempfile.mkdtemp(prefix="bench_peer_l7_")
    results = context.SimpleQueue()
    ranks = [context.Process(target=_l7_rank, args=(r, n, os.path.join(folder, "store"), spec, results))
             for r in range(n)]
    failure = ""
    try:
        for p in ranks:
            p.start()
        deadline = time.monotonic() + timeout
        while any(p.is_alive() for p in ranks) and time.monotonic() < deadline:
            if any(p.exitcode not in (None, 0) for p in ranks):
                break
            time.sleep(0.05)
        for r, p in enumerate(ranks):
            if p.is_alive():
                failure = failure or ("rank %d still running after %.0f s: killed" % (r, timeout)
                                      if time.monotonic() >= deadline else "rank %d was left waiting" % r)
                p.kill()  # only the processes this case started
            p.join()
            if p.exitcode != 0 and not failure:
                failure = "rank %d exited with status %s (its error is printed above)" % (r, p.exitcode)
        out = None if results.empty() else results.get()
    finally:
        for p in ranks:
            if p.is_alive():
                p.kill()
                p.join()
        shutil.rmtree(folder, ignore_errors=True)
    if out is not None and out["error"]:
        emit("na", key, prefix + out["error"])  # FSDP refused: a fact about this PyTorch, not a bench failure
        return
    if out is None or failure:
        raise SystemExit("peer.py l7 with %d ranks: %s" % (n, failure or "rank 0 sent no results"))
    samples = out["samples"]
    row(key, (_l5_median(samples), min(samples), max(samples)), None,
        "FullyShardedDataParallel(gloo, FULL_SHARD, one unit per Linear) + Adam; %d bytes kept on rank 0 "
        "(parameters, gradients, Adam's moments); %d thread(s)/rank" % (out["kept"], out["threads"]))


def case_l6(device, spec):
    """Lesson 6: one AdamW step over one float32 parameter of `numel` elements, as torch.optim.AdamW runs it by
    default here (beside torch::optim::AdamW), and with fused=True (beside the workshop's fused operator) where
    this version has a fused AdamW for the device (CPU: from 2.4)."""
    n, warmup, repeats = int(spec["numel"]), int(spec["warmup"]), int(spec["repeats"])
    lr, weight_decay = float(spec["lr"]), float(spec["weight_decay"])
    torch.manual_seed(0)
    start = torch.randn(n, device=device)
    grad = torch.randn(n, device=device)
    for key, options, what in (("l6.adamw", {}, "torch.optim.AdamW (default implementation)"),
                               ("l6.fused", {"fused": True}, "torch.optim.AdamW(fused=True)")):
        param = torch.nn.Parameter(start.clone())
        param.grad = grad.clone()
        try:
            optimizer = torch.optim.AdamW([param], lr=lr, weight_decay=weight_decay, **options)
            optimizer.step()  # also where an unsupported option only fails at the first step
        except (RuntimeError, TypeError, ValueError) as error:
            emit("na", key, "%s: not available in PyTorch %s on %s (%s)" % (what, short_version(), device.type,
                                                                          str(error).split("\n")[0][:120]))
            continue
        timing = time_repeated(device, optimizer.step, warmup, repeats)
        row(key, timing, None, what)


class PlantedTrainer:
    """lesson3_profiling's Trainer (bottleneck_given.cc), op for op: a two-layer classifier on 8-bit "pixels",
    SGD; slow_step() with the three planted problems, fast_step() after prepare()."""

    def __init__(self, spec, device):
        self.samples, self.batch = int(spec["samples"]), int(spec["batch"])
        self.features, self.hidden = int(spec["features"]), int(spec["hidden"])
        self.classes, self.lr = int(spec["classes"]), float(spec["lr"])
        self.device, self.steps = device, 0
        torch.manual_seed(int(spec["seed"]))
        offset = torch.randint(0, 128, (1, self.features), dtype=torch.long)
        self.raw = (torch.randint(0, 128, (self.samples, self.features), dtype=torch.long) + offset).to(torch.uint8)
        teacher = torch.randn(self.features, self.classes)
        centred = self.raw.to(torch.float) - self.raw.to(torch.float).mean(0, keepdim=True)
        self.labels = torch.matmul(centred, teacher).argmax(1)
        on = dict(dtype=torch.float, device=device)
        self.w1 = (torch.randn(self.hidden, self.features) / self.features ** 0.5).to(**on).requires_grad_()
        self.b1 = torch.zeros(self.hidden, **on).requires_grad_()
        self.w2 = (torch.randn(self.classes, self.hidden) / self.hidden ** 0.5).to(**on).requires_grad_()
        self.b2 = torch.zeros(self.classes, **on).requires_grad_()
        self.loss_sum = torch.zeros((), **on)
        self.prepared = None

    def next_batch_start(self):
        start = (self.steps % (self.samples // self.batch)) * self.batch
        self.steps += 1
        return start

    def forward_loss(self, x, y):
        hidden = torch.relu(torch.addmm(self.b1, x, self.w1.t()))
        logits = torch.addmm(self.b2, hidden, self.w2.t())
        return F.nll_loss(torch.log_softmax(logits, 1), y)

    def sgd_update(self):
        with torch.no_grad():
            for p in (self.w1, self.b1, self.w2, self.b2):
                p.sub_(p.grad, alpha=self.lr)
                p.grad.zero_()

    def slow_step(self):
        start = self.next_batch_start()
        with torch.autograd.profiler.record_function("phase:data"):
            all_ = self.raw.to(torch.float).div(255)
            mean, std = all_.mean(0), all_.std(0)
            rows = [self.raw[start + i].to(torch.float).div(255).sub(mean).div(std).to(self.device)
                    for i in range(self.batch)]
            x = torch.stack(rows)
            y = self.labels.narrow(0, start, self.batch).to(self.device)
        with torch.autograd.profiler.record_function("phase:forward"):
            loss = self.forward_loss(x, y)
            value = loss.item()
            if value != value:
                raise RuntimeError("the loss is not finite")
            self.loss_sum.add_(loss.detach())
        with torch.autograd.profiler.record_function("phase:backward"):
            loss.backward()
        with torch.autograd.profiler.record_function("phase:optimizer"):
            self.sgd_update()

    def prepare(self):
        all_ = self.raw.to(torch.float).div(255)
        self.prepared = all_.sub(all_.mean(0)).div(all_.std(0)).to(self.device)
        self.prepared_labels = self.labels.to(self.device)

    def fast_step(self):
        start = self.next_batch_start()
        with torch.autograd.profiler.record_function("phase:data"):
            x = self.prepared.narrow(0, start, self.batch)
            y = self.prepared_labels.narrow(0, start, self.batch)
        with torch.autograd.profiler.record_function("phase:forward"):
            loss = self.forward_loss(x, y)
            self.loss_sum.add_(loss.detach())
        with torch.autograd.profiler.record_function("phase:backward"):
            loss.backward()
        with torch.autograd.profiler.record_function("phase:optimizer"):
            self.sgd_update()


def case_l3(device, spec):
    """As solutions/lesson3_profiling/bench_case.cc: the planted loop and the fixed one, timed; then the planted loop
    under torch.profiler (Kineto where this PyTorch has it), every op's calls per step."""
    warmup, repeats, steps = int(spec["warmup"]), int(spec["repeats"]), int(spec["steps"])
    slow, fast = PlantedTrainer(spec, device), PlantedTrainer(spec, device)
    fast.prepare()
    row("l3.slow", time_repeated(device, slow.slow_step, warmup, repeats), None, "the same loop in Python")
    row("l3.fixed", time_repeated(device, fast.fast_step, warmup, repeats), None, "the same loop in Python")
    kineto = hasattr(torch.autograd, "kineto_available") and torch.autograd.kineto_available()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    profiled = PlantedTrainer(spec, device)
    profiled.slow_step()  # warm-up, outside the recording (as prof::profile_steps does)
    with torch.profiler.profile(activities=activities) as recording:
        for _ in range(steps):
            profiled.slow_step()
    emit("info", "l3.profiler", "torch.profiler %s, PyTorch %s" % (
        "on Kineto" if kineto else "on the legacy profiler (this PyTorch has no Kineto)", short_version()))
    for event in recording.key_averages():
        calls = event.count / steps
        self_ms = event.self_cpu_time_total / 1e3 / steps
        # One row per op: its calls per step in the timing columns (median = min = max), its self time per step
        # in `what`; the C++ side reads them as counts, not times.
        row("l3.calls." + event.key, (calls, calls, calls), None, "self CPU %.3f ms per step" % self_ms)


CASES = {"l1": case_l1, "l2": case_l2, "l3": case_l3, "l4": case_l4, "scaler": case_scaler, "l5": case_l5,
         "l6": case_l6, "l7": case_l7}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, required=True, help="torch.set_num_threads, as the C++ side")
    parser.add_argument("--case", required=True, choices=sorted(CASES))
    parser.add_argument("--spec", default="", help="comma-separated key=value sizes of the case")
    args = parser.parse_args()
    spec = dict(item.split("=", 1) for item in args.spec.split(",") if item)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        emit("missing", "%s: torch %s has no usable CUDA device" % (sys.executable, torch.__version__))
        sys.exit(3)
    torch.set_num_threads(args.threads)
    emit("info", "torch", torch.__version__)
    emit("info", "threads", torch.get_num_threads())
    emit("info", "python", "%s %d.%d.%d" % ((sys.executable,) + tuple(sys.version_info[:3])))
    emit("info", "peak", how_peak_measured(device))
    CASES[args.case](device, spec)


if __name__ == "__main__":
    main()
