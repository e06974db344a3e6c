"""The binding's shared checker and module functions: every array an op writes in place is
refused when it shares memory with any other argument; every id-like array (tokens, targets,
pos_ids, index, indices; prefix lengths clamped) is checked by the kernel where it reads it (a
racing writer gives a ValueError naming the argument, never a read out of bounds); info() and
set_kernels."""
import os
import re
import subprocess
import sys
import threading

import numpy as np
import pytest

from conftest import randn, raises_naming, subprocess_env
from mapformer import _C


def _args(rng):
    """Good keyword arguments of every op that writes an array given to it, small sizes."""
    B, T, H, D, V, N, C, F, P = 2, 5, 2, 16, 7, 10, 6, 12, 9
    f = lambda *s: randn(rng, *s)  # noqa: E731
    x = f(N, C)
    _, mean, rstd = _C.layernorm_forward(x, f(C), f(C))
    _, h = _C.mlp_forward(x, f(F, C), f(F), f(C, F), f(C))
    q, k, v, e = f(B, T, H, D), f(B, T, H, D), f(B, T, H, D), f(H, 3, D)
    out, lse = _C.cope_forward(q, k, v, e)
    return {
        "embedding_backward": dict(dweight=f(V, C), dout=f(N, C),
                                   tokens=rng.integers(0, V, N).astype(np.int32)),
        "linear_backward": dict(dy=f(N, C + 1), x=x, weight=f(C + 1, C), dweight=f(C + 1, C),
                                dbias=f(C + 1), dx=f(N, C)),
        "layernorm_backward": dict(dy=f(N, C), x=x, mean=mean, rstd=rstd, weight=f(C),
                                   dweight=f(C), dbias=f(C), dx=f(N, C)),
        "residual_backward": dict(dx=f(N, C), dout=f(N, C)),
        "mlp_backward": dict(dy=f(N, C), x=x, h=h, w_fc=f(F, C), w_proj=f(C, F),
                             dw_fc=f(F, C), db_fc=f(F), dw_proj=f(C, F), db_proj=f(C)),
        "path_integration_backward": dict(dtheta=f(B, T, H, D // 2), delta=f(B, T, H, D // 2),
                                          omega=f(H, D // 2), domega=f(H, D // 2)),
        "adamw_step": dict(params=f(P), grads=f(P), m=f(P), v=np.abs(f(P)),
                           decay_mask=rng.random(P) < 0.5, lr=1e-3, step=1),
        "ema_update": dict(target=f(P), source=f(P), decay=0.99),
        "cope_backward": dict(dout=f(B, T, H, D), q=q, k=k, v=v, e=e, out=out, lse=lse,
                              de=f(H, 3, D)),
        "tape_mix_backward": dict(de_new=f(B, T, H, D), e_att=f(B, T, H, D),
                                  gate_logits=f(B, T, H), w=f(H, H), dw=f(H, H)),
    }


# (op, the array it writes in place): every one of them
IN_PLACE = [("embedding_backward", "dweight"),
            ("linear_backward", "dweight"), ("linear_backward", "dbias"),
            ("linear_backward", "dx"),
            ("layernorm_backward", "dweight"), ("layernorm_backward", "dbias"),
            ("layernorm_backward", "dx"),
            ("residual_backward", "dx"),
            ("mlp_backward", "dw_fc"), ("mlp_backward", "db_fc"), ("mlp_backward", "dw_proj"),
            ("mlp_backward", "db_proj"),
            ("path_integration_backward", "domega"),
            ("adamw_step", "params"), ("adamw_step", "m"), ("adamw_step", "v"),
            ("ema_update", "target"),
            ("cope_backward", "de"),
            ("tape_mix_backward", "dw")]


def overlapping(a, b):
    """Views of one buffer: a copy of ``a``, and an array of ``b``'s dtype, shape and values
    that starts on ``a``'s last 4 bytes, so that the two share memory (``a`` wins there)."""
    start = (a.nbytes - 1) // 4 * 4
    raw = np.zeros(start + b.nbytes + 64, np.uint8)
    base = (-raw.ctypes.data) % 64
    bv = raw[base + start:base + start + b.nbytes].view(b.dtype).reshape(b.shape)
    bv[...] = b
    av = raw[base:base + a.nbytes].view(a.dtype).reshape(a.shape)
    av[...] = a
    return av, bv


@pytest.mark.parametrize("op,written", IN_PLACE, ids=[f"{o}-{w}" for o, w in IN_PLACE])
def test_written_array_sharing_memory_is_refused(rng, op, written):
    """The array an op writes in place, made to share its first bytes with the last bytes of
    any other array argument (inputs of every dtype, and the other arrays it writes), is
    refused before anything is written; disjoint arguments work."""
    args = _args(rng)[op]
    fn = getattr(_C, op)
    arrays = [n for n, a in args.items() if isinstance(a, np.ndarray) and n != written]
    assert arrays
    for other in arrays:
        kw = dict(args)
        kw[other], kw[written] = overlapping(args[other], args[written])
        snapshot = {n: a.copy() for n, a in kw.items() if isinstance(a, np.ndarray)}
        with pytest.raises(ValueError, match="must not share memory with") as info:
            fn(**kw)
        names = set(re.match(r"^(\w+) must not share memory with (\w+)$",
                             str(info.value)).groups())
        assert names == {written, other}, (other, str(info.value))
        for n, a in snapshot.items():
            assert np.array_equal(kw[n], a), f"{n} was written before the refusal"
    fn(**args)


def test_overlap_names_the_written_array(rng):
    """Against an input, the array the op writes is the one named."""
    args = _args(rng)["embedding_backward"]
    dout, dweight = overlapping(args["dout"], args["dweight"])
    with raises_naming(ValueError, "dweight"):
        _C.embedding_backward(dweight, dout, args["tokens"])


# ---- ids: checked by the kernel where it reads them ---------------------------------------

def _id_ops(rng, N=64, V=9, C=8):
    tokens = rng.integers(0, V, N).astype(np.int32)
    weight, dout, logits = randn(rng, V, C), randn(rng, N, C), randn(rng, N, V)
    mask = np.ones(N, np.float32)
    return tokens, [
        ("tokens", lambda t: _C.embedding_forward(t, weight)),
        ("tokens", lambda t: _C.embedding_backward(np.zeros((V, C), np.float32), dout, t)),
        ("targets", lambda t: _C.softmax_xent_forward(logits, t, mask)),
        ("targets", lambda t: _C.softmax_xent_backward(logits, t, mask, 1.0)),
    ]


@pytest.mark.parametrize("bad", [-1, 9, 2**31 - 1, -(2**31)])
def test_bad_id_is_refused_naming_the_argument(rng, bad):
    tokens, ops = _id_ops(rng)
    for name, call in ops:
        t = tokens.copy()
        t[40] = bad
        with pytest.raises(ValueError, match=rf"^{name}\[40\] = {bad} is out of range"):
            call(t)


def _racing_calls(rng):
    """For every id-like array an op reads: (op, argument, the array, a call of the op on it,
    an id outside its range). Sizes make each call long enough for a flip to land inside."""
    V = 50
    weight, logits = randn(rng, V, 32), randn(rng, 5_000, V)
    B, T, H, D = 2, 128, 2, 32
    q, k, v, dout = (randn(rng, B, T, H, D) for _ in range(4))
    pos_ids = rng.integers(0, T, (B, T)).astype(np.int32)
    factor = np.ones((T, T), np.float32)
    attn = dict(pos_ids=pos_ids, pair_factor=factor)
    out, lse = _C.attention_forward(q, k, v, **attn)
    prefix = np.full(B, T // 2, np.int32)
    out_p, lse_p = _C.attention_forward(q, k, v, mask="prefix", prefix=prefix)
    rel = randn(rng, 9, D)
    P = 40
    maps, index = randn(rng, 1, P, H, D, D), rng.integers(0, P, (B, T, 1)).astype(np.int32)
    z, codebook = randn(rng, 4_000, 2, 16), randn(rng, 2, 64, 16)
    _, indices, _, _ = _C.vq_forward(z, codebook)
    tokens = rng.integers(0, V, 20_000).astype(np.int32)
    targets = rng.integers(0, V, 5_000).astype(np.int32)
    mask = np.ones(5_000, np.float32)
    return [
        ("embedding_forward", "tokens", tokens, lambda: _C.embedding_forward(tokens, weight),
         V + 7),
        ("softmax_xent_backward", "targets", targets,
         lambda: _C.softmax_xent_backward(logits, targets, mask, 1.0), V + 7),
        ("attention_forward", "pos_ids", pos_ids, lambda: _C.attention_forward(q, k, v, **attn),
         2**31 - 1),
        ("attention_backward", "pos_ids", pos_ids,
         lambda: _C.attention_backward(dout, q, k, v, out, lse, **attn), 2**31 - 1),
        ("attention_forward", "prefix", prefix,
         lambda: _C.attention_forward(q, k, v, mask="prefix", prefix=prefix), 2**31 - 1),
        ("attention_backward", "prefix", prefix,
         lambda: _C.attention_backward(dout, q, k, v, out_p, lse_p, mask="prefix",
                                       prefix=prefix), 2**31 - 1),
        ("conj_attention_forward", "prefix", prefix,
         lambda: _C.conj_attention_forward(q, k, q, k, v, mask="prefix", prefix=prefix), T + 1),
        ("relative_forward", "prefix", prefix,
         lambda: _C.relative_forward(q, k, v, rel, rel, mask="prefix", prefix=prefix), T + 1),
        ("relative_backward", "prefix", prefix,
         lambda: _C.relative_backward(dout, q, k, v, rel, out_p, lse_p, np.zeros_like(rel),
                                      rel, np.zeros_like(rel), mask="prefix", prefix=prefix),
         T + 1),
        ("ape_apply_forward", "index", index, lambda: _C.ape_apply_forward(q, maps, index),
         P + 3),
        ("vq_backward", "indices", indices,
         lambda: _C.vq_backward(z, z, codebook, indices, np.zeros_like(codebook), 1.0, 0.25),
         64 + 5),
    ]


RACING = [(op, name) for op, name, *_ in _racing_calls(np.random.default_rng(0))]


@pytest.mark.parametrize("op,name", RACING, ids=[f"{o}-{n}" for o, n in RACING])
def test_id_changed_while_the_op_runs(rng, op, name):
    """Another thread flips the last entry of an id-like array between in and out of range
    in a tight loop while the op runs (the GIL is released while the kernel runs, so the
    flips land there): each call either succeeds or raises ValueError naming the argument,
    never reads out of bounds; at least one refusal comes from the op's own check (the
    binding's had passed): at least 200 calls, and on until the op has refused one (a loaded
    machine may schedule the flipper rarely). The C entry checks prefix and pos_ids again, a
    task checks its copy of a row of pos_ids and the prefix it reads (once), so a flip that
    lands at any time while the kernel runs can be refused, not only one that lands in the
    moment between the binding's check and the entry's."""
    _, _, ids, call, bad = next(
        c for c in _racing_calls(rng) if c[0] == op and c[1] == name)
    flat = ids.reshape(-1)
    good = int(flat[-1])
    stop = threading.Event()

    def flip():
        while not stop.is_set():
            flat[-1] = bad
            flat[-1] = good

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # the GIL comes back to the caller soon after each kernel
    flipper = threading.Thread(target=flip)
    flipper.start()
    outcomes = {"ok": 0, "binding": 0, "kernel": 0}
    calls = 0
    try:
        while calls < 200 or (outcomes["kernel"] == 0 and calls < 20_000):
            calls += 1
            try:
                call()
                outcomes["ok"] += 1
            except ValueError as err:
                msg = str(err)
                assert re.search(rf"\b{name}\b", msg), msg
                outcomes["kernel" if " where " in msg else "binding"] += 1
    finally:
        stop.set()
        flipper.join()
        sys.setswitchinterval(interval)
    assert sum(outcomes.values()) == calls
    assert outcomes["kernel"] > 0, outcomes


# ---- module functions ---------------------------------------------------------------------

def test_info_fields():
    info = _C.info()
    assert set(info) == {"kernels", "cpu_level", "kernel_sets", "blas", "threads", "compiler",
                         "simd_width", "pool", "subnormals"}
    assert info["kernels"] == _C.kernels() and info["cpu_level"] == _C.cpu_level()
    assert info["subnormals"] == _C.subnormals()
    assert info["kernel_sets"] == _C.kernel_sets()
    assert info["cpu_level"] in info["kernel_sets"] and "blas" in info["kernel_sets"]
    assert info["blas"]["library"] in ("scipy-openblas32", "system")
    assert "OpenBLAS" in info["blas"]["config"]
    assert info["blas"]["threads"] == 1  # the core threads with OpenMP only
    pool = info["pool"]
    assert pool["limit_bytes"] == int(os.environ.get("MAPFORMER_POOL_MB", 1024)) << 20
    assert 0 <= pool["held_bytes"] <= pool["limit_bytes"] and pool["held_blocks"] >= 0
    assert _C.release_pool() == pool["held_bytes"]  # what earlier tests left
    assert _C.info()["pool"]["held_bytes"] == 0 and _C.info()["pool"]["held_blocks"] == 0
    for _ in range(2):  # 4 MB: a pool block, kept once its size is asked for again
        big = _C.gelu_forward(np.ones(1 << 20, np.float32))
        del big  # back to the pool
    assert _C.info()["pool"]["held_bytes"] == 4 << 20
    kept = _C.gelu_forward(np.ones(1 << 20, np.float32))  # the block, alive: not the pool's
    assert _C.info()["pool"]["held_bytes"] == 0 and _C.release_pool() == 0
    del kept  # back to the pool, its size still reused
    assert _C.info()["pool"]["held_blocks"] == 1 and _C.release_pool() == 4 << 20
    assert isinstance(info["threads"], int) and info["threads"] >= 1
    assert info["compiler"]["name"] in ("gcc", "clang") and info["compiler"]["version"]
    widths = {"portable": 4, "avx2": 8, "avx512": 16, "blas": 4}
    assert info["simd_width"] == {k: widths[k] for k in info["kernel_sets"]}


def test_info_follows_the_active_set_and_threads():
    before = _C.kernels()
    try:
        _C.set_kernels("portable")
        assert _C.info()["kernels"] == "portable"
    finally:
        _C.set_kernels(before)
    code = "from mapformer import _C; print(_C.info()['threads'])"
    for n in (1, 3):
        run = subprocess.run([sys.executable, "-c", code], env=subprocess_env(n), check=True,
                             capture_output=True, text=True)
        assert int(run.stdout) == n


def test_set_kernels_errors():
    before = _C.kernels()
    for bad in ("avx", "AVX2", "", "blas "):
        with raises_naming(ValueError, "kernels"):
            _C.set_kernels(bad)
        assert _C.kernels() == before
    for bad in (None, 1, b"blas"):
        with pytest.raises(TypeError):
            _C.set_kernels(bad)
    with pytest.raises(TypeError):
        _C.set_kernels()
    unsupported = [k for k in ("avx512", "avx2") if k not in _C.kernel_sets()]
    for name in unsupported:  # names a real set this CPU cannot run
        with pytest.raises(ValueError, match=rf"^kernels must name a kernel set .*'{name}'"):
            _C.set_kernels(name)
    for name in _C.kernel_sets():
        _C.set_kernels(kernels=name)
        assert _C.kernels() == name
    _C.set_kernels(before)


def test_unknown_kernel_set_in_the_environment_fails_the_import():
    env = {**subprocess_env(1), "MAPFORMER_KERNELS": "fastest"}
    run = subprocess.run([sys.executable, "-c", "from mapformer import _C"], env=env,
                         capture_output=True, text=True)
    assert run.returncode != 0
    assert "ImportError" in run.stderr and "MAPFORMER_KERNELS" in run.stderr
    env["MAPFORMER_KERNELS"] = "blas"
    run = subprocess.run([sys.executable, "-c", "from mapformer import _C; print(_C.kernels())"],
                         env=env, capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "blas"


# ---- numbers, choices and sizes the harness of issue 33 found mishandled ----------------

@pytest.mark.parametrize("value", [np.complex128(0.5), np.complex64(0.5 + 1j), 0.5 + 0j,
                                   np.clongdouble(0.5), np.array(0.5 + 0j)],
                         ids=["complex128", "complex64", "complex", "clongdouble", "0-d"])
def test_complex_real_argument_is_refused(rng, value):
    """A complex number for a real hyper-parameter is refused as Python's complex is (NumPy's
    float() of one drops the imaginary part: it was accepted, silently), naming it."""
    p = np.ones(4, np.float32)
    with raises_naming(TypeError, "lr"):
        _C.adamw_step(p, p.copy(), p.copy(), p.copy(), np.ones(4, bool), lr=value, step=1)
    with raises_naming(TypeError, "scale"):
        _C.conj_attention_forward(*_conj_inputs(rng), scale=value)
    with raises_naming(TypeError, "chunk"):
        x = randn(rng, 1, 3, 2)
        _C.selective_scan_forward(x, x.copy(), -np.ones((2, 1), np.float32),
                                  randn(rng, 1, 3, 1), randn(rng, 1, 3, 1), randn(rng, 2),
                                  chunk=value)


def test_numpy_real_scalars_give_the_plain_values_result():
    p, g = np.ones(4, np.float32), np.full(4, 0.5, np.float32)
    runs = []
    for lr in (1e-3, np.float64(1e-3), np.float32(1e-3), np.array(1e-3)):
        params = p.copy()
        _C.adamw_step(params, g, np.zeros(4, np.float32), np.zeros(4, np.float32),
                      np.ones(4, bool), lr=lr, step=np.int64(1))
        runs.append(params)
    assert all(np.array_equal(runs[0], r) for r in runs[1:])
    assert not np.array_equal(runs[0], p)


def _conj_inputs(rng):
    x = randn(rng, 1, 3, 1, 16)
    return [x, x.copy(), x.copy(), x.copy(), x.copy()]


@pytest.mark.parametrize("mode", ["\ud800", "sum\udfff"])
def test_choice_with_a_lone_surrogate_is_refused_naming_it(rng, mode):
    """A str with no UTF-8 form was a UnicodeEncodeError naming nothing."""
    with raises_naming(ValueError, "mode"):
        _C.conj_attention_forward(*_conj_inputs(rng), mode=mode)


def test_gridpe_backward_odd_last_axis_names_dy(rng):
    """dy's last axis is 2E (a cos and a sin per angle); an odd one was 'status 1'."""
    with raises_naming(ValueError, "dy"):
        _C.gridpe_complex_backward(randn(rng, 1, 2, 1, 7), randn(rng, 1, 2, 1, 3))


def test_linear_size_beyond_blas_int_names_the_array(tmp_path):
    """Cin = 2^31 (x and weight memory-mapped from sparse files: nothing is read) is refused
    naming x, before any kernel: it was 'linear_forward failed ... (status 1)'."""
    n = 2**31
    arrays = []
    for name in ("x", "weight", "dweight"):
        path = tmp_path / name
        with open(path, "wb") as f:
            f.truncate(n * 4)
        arrays.append(np.memmap(path, np.float32, "r+", shape=(1, n)))
    x, weight, dweight = arrays
    with raises_naming(ValueError, "x's Cin"):
        _C.linear_forward(x, weight)
    with raises_naming(ValueError, "x's Cin"):
        _C.linear_backward(np.zeros((1, 1), np.float32), x, weight, dweight)


@pytest.mark.parametrize("value", ["-1", "abc", "", "12MB", "99999999999999999999"])
def test_pool_size_from_the_environment_is_checked_at_import(value):
    """MAPFORMER_POOL_MB is a whole number of megabytes: anything else fails the import with
    a message naming the variable (it was read with strtoull: "abc" a 0 MB pool, "-1" 16
    EiB), as MAPFORMER_KERNELS does."""
    env = {**subprocess_env(1), "MAPFORMER_POOL_MB": value}
    done = subprocess.run([sys.executable, "-c", "import mapformer._C"], env=env,
                          capture_output=True, text=True)
    assert done.returncode != 0
    assert "ImportError: MAPFORMER_POOL_MB must be a whole number of megabytes" in done.stderr
    ok = subprocess.run([sys.executable, "-c", "from mapformer import _C; "
                         "print(_C.info()['pool']['limit_bytes'])"],
                        env={**env, "MAPFORMER_POOL_MB": "7"}, capture_output=True, text=True,
                        check=True)
    assert int(ok.stdout) == 7 << 20
