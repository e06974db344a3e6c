"""CUDA kernels of the attention family (cuda/conj_attention.cu, ...) executed on the CPU under
the emulation of CUDA's model against the float64 reference, forward and backward, on awkward
sizes (1, odd, prime; partial query and key tiles), under the three block schedules
(test_cuda_ops.run: the serial orders must agree bit for bit), with the C ops' tolerances
(conftest.TOLERANCES); and the Python wrappers (mapformer.cuda.ops on NumPy arrays) against
the C backend."""
import numpy as np
import pytest

from conftest import assert_close, randn
from test_cuda_ops import emu, empty, run  # noqa: F401 (emu: the module's fixture)
from mapformer import reference as ref

MODES = {"score_product": 0, "softmax_product": 1, "sum": 2}
MASKS = {"causal": 0, "none": 1, "prefix": 2}

# T past one query block (64 rows) and several key tiles (16 rows), partial last tiles; D at
# both ends of [16, 128]
CONJ_SIZES = [(1, 1, 1, 16), (2, 37, 3, 16), (1, 70, 1, 18), (1, 9, 1, 128)]


def conj_case(emu, rng, B, T, H, D, mode, mask, prefix=None):
    qx, kx, qp, kp, v, dout = (randn(rng, B, T, H, D) for _ in range(6))
    scale = 1.0 / np.sqrt(D)
    M = 2 if mode == "softmax_product" else 1
    common = dict(B=B, T=T, H=H, D=D, scale=scale, mode=MODES[mode], mask=MASKS[mask],
                  prefix=prefix)
    inputs = dict(qx=qx, kx=kx, qp=qp, kp=kp, v=v)
    out, lse = run(emu, "conj_attention_forward_cuda", "MfConjAttentionParams",
                   lambda: dict(out=empty(B, T, H, D), lse=empty(M, B, H, T), **inputs,
                                **common), ["out", "lse"])
    kw = dict(mask=mask, prefix=prefix)
    rout, rlse = ref.conj_attention_forward(qx, kx, qp, kp, v, mode, scale, **kw)
    # sums over up to T keys of D-long products (conftest: "reduction")
    assert_close(out, rout, "reduction", "out")
    assert_close(lse, rlse, "reduction", "lse")
    floats = B * H * T
    names = ["dqx", "dkx", "dqp", "dkp", "dv"]
    grads = run(emu, "conj_attention_backward_cuda", "MfConjAttentionParams",
                lambda: dict(**{n: empty(B, T, H, D) for n in names}, dout=dout, o=out,
                             lse_in=lse, scratch=empty(floats), scratch_floats=floats,
                             **inputs, **common), names)
    want = ref.conj_attention_backward(dout, qx, kx, qp, kp, v, mode, scale, **kw)
    # products summed over both T and D (conftest: "gradient")
    for name, a, w in zip(names, grads, want):
        assert_close(a, w, "gradient", name)


@pytest.mark.parametrize("B,T,H,D", CONJ_SIZES)
@pytest.mark.parametrize("mode", list(MODES))
def test_conj_attention_causal(emu, rng, B, T, H, D, mode):
    conj_case(emu, rng, B, T, H, D, mode, "causal")


@pytest.mark.parametrize("mode", list(MODES))
def test_conj_attention_masks(emu, rng, mode):
    """mask none, and prefix with P_b of 0 (causal), inside the first key tile, past the
    first dk/dv block (64 keys), and T (none)."""
    conj_case(emu, rng, 1, 19, 2, 16, mode, "none")
    prefix = np.array([0, 5, 67, 70], np.int32)
    conj_case(emu, rng, 4, 70, 1, 16, mode, "prefix", prefix)


def test_conj_attention_refuses_bad_input(emu, rng):
    q = randn(rng, 1, 4, 1, 16)
    base = dict(out=q, lse=q, qx=q, kx=q, qp=q, kp=q, v=q, B=1, T=4, H=1, scale=0.25)
    fn, struct = "conj_attention_forward_cuda", "MfConjAttentionParams"
    for D in (14, 15, 130):
        assert emu.call(fn, struct, D=D, **base) == 1
    assert emu.call(fn, struct, D=16, mode=3, **base) == 1
    assert emu.call(fn, struct, D=16, mask=3, **base) == 1
    assert emu.call(fn, struct, D=16, mask=2, **base) == 1  # prefix mask without prefix
    assert emu.call(fn, struct, D=16, scale=np.inf, **{k: v for k, v in base.items()
                                                        if k != "scale"}) == 1
    back = dict(dqx=q, dkx=q, dqp=q, dkp=q, dv=q, qx=q, kx=q, qp=q, kp=q, v=q, dout=q, o=q,
                lse_in=q, B=1, T=4, H=1, D=16, scale=0.25, scratch=q)
    assert emu.call("conj_attention_backward_cuda", struct, scratch_floats=3, **back) == 1


# Tq past one query block (64 rows), Tk past several key tiles (32 rows), room left in the
# cache (Tmax > Tk), one decoding step (Tq = 1)
DECODE_SIZES = [(1, 1, 1, 1, 1, 16), (2, 1, 37, 40, 3, 16), (1, 70, 75, 75, 1, 18),
                (1, 5, 9, 12, 2, 128)]


@pytest.mark.parametrize("B,Tq,Tk,Tmax,H,D", DECODE_SIZES)
def test_attention_decode(emu, rng, B, Tq, Tk, Tmax, H, D):
    q, k, v = randn(rng, B, Tq, H, D), randn(rng, B, Tmax, H, D), randn(rng, B, Tmax, H, D)
    scale = 1.0 / np.sqrt(D)
    out, lse = run(emu, "attention_decode_forward_cuda", "MfAttentionDecodeParams",
                   lambda: dict(out=empty(B, Tq, H, D), lse=empty(B, H, Tq), q=q, k=k, v=v, B=B,
                                Tq=Tq, Tk=Tk, Tmax=Tmax, H=H, D=D, scale=scale),
                   ["out", "lse"])
    rout, rlse = ref.attention_decode_forward(q, k, v, scale, keys=Tk)
    assert_close(out, rout, "reduction", "out")
    assert_close(lse, rlse, "reduction", "lse")


def test_attention_decode_refuses_bad_sizes(emu, rng):
    q = randn(rng, 1, 4, 1, 16)
    base = dict(out=q, lse=q, q=q, k=q, v=q, B=1, H=1, D=16, scale=0.25)
    fn, struct = "attention_decode_forward_cuda", "MfAttentionDecodeParams"
    assert emu.call(fn, struct, Tq=3, Tk=2, Tmax=4, **base) == 1  # Tq > Tk
    assert emu.call(fn, struct, Tq=1, Tk=5, Tmax=4, **base) == 1  # Tk > Tmax
    assert emu.call(fn, struct, Tq=1, Tk=4, Tmax=4, **{**base, "D": 15}) == 1


@pytest.mark.parametrize("B,T,H,W,TB", [(1, 1, 1, 2, 1), (3, 7, 2, 10, 3), (2, 33, 3, 6, 1)])
def test_gridpe_complex(emu, rng, B, T, H, W, TB):
    x, theta, dy = randn(rng, B, T, H, W // 2), randn(rng, TB, T, H, W // 2, scale=5.0), \
        randn(rng, B, T, H, W)
    sizes = dict(B=B, T=T, H=H, W=W, TB=TB, theta=theta)
    (y,) = run(emu, "gridpe_complex_forward_cuda", "MfGridpeParams",
               lambda: dict(y=empty(B, T, H, W), x=x, **sizes), ["y"])
    assert_close(y, ref.gridpe_complex_forward(x, theta), "default", "y")
    (dx,) = run(emu, "gridpe_complex_backward_cuda", "MfGridpeParams",
                lambda: dict(dx=empty(B, T, H, W // 2), dy=dy, **sizes), ["dx"])
    assert_close(dx, ref.gridpe_complex_backward(dy, theta), "default", "dx")
    assert emu.call("gridpe_complex_forward_cuda", "MfGridpeParams", y=y, x=x,
                    **{**sizes, "TB": 2 if B != 2 else 3}) == 1


# rows past one 256-thread block, H = 1 (no mixing partner), odd H
@pytest.mark.parametrize("B,T,H,D", [(1, 1, 1, 2), (2, 9, 3, 6), (3, 50, 2, 4)])
def test_tape_mix(emu, rng, B, T, H, D):
    e, gl, w = randn(rng, B, T, H, D), randn(rng, B, T, H, scale=3.0), randn(rng, H, H)
    de_new = randn(rng, B, T, H, D)
    sizes = dict(B=B, T=T, H=H, D=D, e_att=e, gate_logits=gl, w=w)
    (e_new,) = run(emu, "tape_mix_forward_cuda", "MfTapeMixParams",
                   lambda: dict(e_new=empty(B, T, H, D), **sizes), ["e_new"])
    # sums over H heads (conftest: "reduction")
    assert_close(e_new, ref.tape_mix_forward(e, gl, w), "reduction", "e_new")
    dw0 = randn(rng, H, H)
    de_att, dgate, dw = run(emu, "tape_mix_backward_cuda", "MfTapeMixParams",
                            lambda: dict(de_att=empty(B, T, H, D), dgate_logits=empty(B, T, H),
                                         dw=dw0.copy(), de_new=de_new, **sizes),
                            ["de_att", "dgate_logits", "dw"])
    rde, rdg, rdw = ref.tape_mix_backward(de_new, e, gl, w)
    assert_close(de_att, rde, "reduction", "de_att")
    assert_close(dgate, rdg, "reduction", "dgate_logits")
    # dw sums over B T rows and D (conftest: "gradient"); += onto what was there
    assert_close(dw, dw0 + rdw, "gradient", "dw")


# A = 1 (a sequence) and A = 2 (a grid), index broadcast (TB = 1) or per sequence,
# positions that no token uses, odd E
@pytest.mark.parametrize("B,T,H,A,E,P,TB", [(1, 1, 1, 1, 1, 1, 1), (2, 7, 3, 2, 3, 5, 2),
                                           (3, 20, 2, 1, 5, 9, 1)])
def test_ape_apply(emu, rng, B, T, H, A, E, P, TB):
    D = A * E
    x, dy, maps = randn(rng, B, T, H, D), randn(rng, B, T, H, D), randn(rng, A, P, H, E, E)
    index = rng.integers(0, P, (TB, T, A)).astype(np.int32)
    sizes = dict(B=B, T=T, H=H, D=D, A=A, P=P, TB=TB, x=x, maps=maps, index=index)
    (y,) = run(emu, "ape_apply_forward_cuda", "MfApeParams",
               lambda: dict(y=empty(B, T, H, D), **sizes), ["y"])
    assert_close(y, ref.ape_apply_forward(x, maps, index), "reduction", "y")
    dmaps0 = randn(rng, A, P, H, E, E)
    dx, dmaps = run(emu, "ape_apply_backward_cuda", "MfApeParams",
                    lambda: dict(dx=empty(B, T, H, D), dmaps=dmaps0.copy(), dy=dy, **sizes),
                    ["dx", "dmaps"])
    rdx, rdmaps = ref.ape_apply_backward(dy, x, maps, index)
    assert_close(dx, rdx, "reduction", "dx")
    # dmaps sums over the tokens at each position (conftest: "reduction"); += onto dmaps0
    assert_close(dmaps, dmaps0 + rdmaps, "reduction", "dmaps")


@pytest.fixture(scope="module")
def emulated(emu):
    return emu.ops()


def test_wrappers_match_the_c_backend(emulated, rng):
    """mapformer.cuda.ops' calls of this file's families (NumPy arrays, emulated kernels) give
    what mapformer._C's same calls give."""
    from mapformer import _C
    B, T, H, D = 2, 9, 2, 16
    qx, kx, qp, kp, v, dout = (randn(rng, B, T, H, D) for _ in range(6))
    prefix = np.array([3, 0], np.int32)
    for mode in MODES:
        for mask in MASKS:
            kw = dict(mask=mask, prefix=prefix if mask == "prefix" else None)
            got = emulated.conj_attention_forward(qx, kx, qp, kp, v, mode, **kw)
            want = _C.conj_attention_forward(qx, kx, qp, kp, v, mode, **kw)
            for a, w in zip(got, want):
                assert_close(a, w, "reduction", f"conj {mode} {mask}")
            got = emulated.conj_attention_backward(dout, qx, kx, qp, kp, v, *want, mode, **kw)
            want = _C.conj_attention_backward(dout, qx, kx, qp, kp, v, *want, mode, **kw)
            for a, w in zip(got, want):
                assert_close(a, w, "gradient", f"conj backward {mode} {mask}")
    q4, k, vv = randn(rng, B, 4, H, D), randn(rng, B, T + 3, H, D), randn(rng, B, T + 3, H, D)
    for a, w in zip(emulated.attention_decode_forward(q4, k, vv, keys=T),
                    _C.attention_decode_forward(q4, k, vv, keys=T)):
        assert_close(a, w, "reduction", "attention_decode")
    gl, w = randn(rng, B, T, H), randn(rng, H, H)
    assert_close(emulated.tape_mix_forward(qx, gl, w), _C.tape_mix_forward(qx, gl, w),
                 "reduction", "tape_mix")
    dw_a, dw_c = np.zeros((H, H), np.float32), np.zeros((H, H), np.float32)
    for a, c in zip(emulated.tape_mix_backward(dout, qx, gl, w, dw_a),
                    _C.tape_mix_backward(dout, qx, gl, w, dw_c)):
        assert_close(a, c, "reduction", "tape_mix backward")
    assert_close(dw_a, dw_c, "gradient", "tape_mix dw")
    maps, index = randn(rng, 2, 5, H, 8, 8), rng.integers(0, 5, (1, T, 2)).astype(np.int32)
    assert_close(emulated.ape_apply_forward(qx, maps, index), _C.ape_apply_forward(qx, maps, index),
                 "reduction", "ape_apply")
    dm_a, dm_c = np.zeros_like(maps), np.zeros_like(maps)
    assert_close(emulated.ape_apply_backward(dout, qx, maps, index, dm_a),
                 _C.ape_apply_backward(dout, qx, maps, index, dm_c), "reduction", "ape dx")
    assert_close(dm_a, dm_c, "reduction", "ape dmaps")
    e = randn(rng, H, 4, D)
    got, want = emulated.cope_forward(qx, kx, v, e), _C.cope_forward(qx, kx, v, e)
    for a, w in zip(got, want):
        assert_close(a, w, "reduction", "cope")
    de_a, de_c = np.zeros_like(e), np.zeros_like(e)
    for a, w in zip(emulated.cope_backward(dout, qx, kx, v, e, *want, de_a),
                    _C.cope_backward(dout, qx, kx, v, e, *want, de_c)):
        assert_close(a, w, "gradient", "cope backward")
    assert_close(de_a, de_c, "gradient", "cope de")
    theta = randn(rng, 1, T, H, D)
    assert_close(emulated.gridpe_complex_forward(qx, theta), _C.gridpe_complex_forward(qx, theta),
                 "default", "gridpe")
    dy = randn(rng, B, T, H, 2 * D)
    assert_close(emulated.gridpe_complex_backward(dy, theta),
                 _C.gridpe_complex_backward(dy, theta), "default", "gridpe backward")


def test_wrappers_check_what_the_kernels_cannot(emulated, rng):
    """Device arrays the kernels cannot validate (prefix, index) and bad names are checked by
    the wrappers, the message naming the argument."""
    q = randn(rng, 2, 5, 1, 16)
    with pytest.raises(ValueError, match="prefix"):
        emulated.conj_attention_forward(q, q, q, q, q, mask="prefix",
                                        prefix=np.array([0, 6], np.int32))
    with pytest.raises(ValueError, match="prefix"):
        emulated.conj_attention_forward(q, q, q, q, q, mask="prefix")
    with pytest.raises(ValueError, match="mode"):
        emulated.conj_attention_forward(q, q, q, q, q, "product")
    with pytest.raises(ValueError, match="mask"):
        emulated.conj_attention_forward(q, q, q, q, q, mask="window")
    maps = randn(rng, 1, 3, 1, 16, 16)
    with pytest.raises(ValueError, match="index"):
        emulated.ape_apply_forward(q, maps, np.full((1, 5, 1), 3, np.int32))
    with pytest.raises(ValueError, match="attention_decode_forward_cuda"):
        emulated.attention_decode_forward(q, q[:, :3], q[:, :3])  # Tq > Tk


# T past one query block (64) and several key tiles (32); n_pos below T (clamped positions),
# above T + 1 (unused logits), 1 (every position 0); D of 1 and 128
COPE_SIZES = [(1, 1, 1, 16, 1), (2, 37, 3, 16, 5), (1, 70, 1, 8, 100), (1, 9, 2, 128, 4),
              (2, 5, 1, 1, 3)]


@pytest.mark.parametrize("B,T,H,D,n_pos", COPE_SIZES)
def test_cope(emu, rng, B, T, H, D, n_pos):
    q, k, v, dout = (randn(rng, B, T, H, D) for _ in range(4))
    e = randn(rng, H, n_pos, D)
    scale = 1.0 / np.sqrt(D)
    sizes = dict(B=B, T=T, H=H, D=D, n_pos=n_pos, scale=scale, q=q, k=k, v=v, e=e)
    fn = emu.lib.cope_backward_cuda_scratch_floats
    nz = min(n_pos, T + 1)
    forward_floats, backward_floats = B * H * T * nz, B * H * T * (2 * nz + 1 + 2 * T)
    out, lse = run(emu, "cope_forward_cuda", "MfCopeParams",
                   lambda: dict(out=empty(B, T, H, D), lse=empty(B, H, T),
                                scratch=empty(forward_floats), scratch_floats=forward_floats,
                                **sizes), ["out", "lse"])
    rout, rlse = ref.cope_forward(q, k, v, e, scale)
    assert_close(out, rout, "reduction", "out")
    assert_close(lse, rlse, "reduction", "lse")
    assert fn is not None
    de0 = randn(rng, H, n_pos, D)
    dq, dk, dv, de = run(emu, "cope_backward_cuda", "MfCopeParams",
                         lambda: dict(dq=empty(B, T, H, D), dk=empty(B, T, H, D),
                                      dv=empty(B, T, H, D), de=de0.copy(), dout=dout, o=out,
                                      lse_in=lse, scratch=empty(backward_floats),
                                      scratch_floats=backward_floats, **sizes),
                         ["dq", "dk", "dv", "de"])
    rdq, rdk, rdv, rde = ref.cope_backward(dout, q, k, v, e, scale)
    assert_close(dq, rdq, "gradient", "dq")
    assert_close(dk, rdk, "gradient", "dk")
    assert_close(dv, rdv, "gradient", "dv")
    assert_close(de, de0 + rde, "gradient", "de")


def test_cope_refuses_bad_input(emu, rng):
    q = randn(rng, 1, 4, 1, 16)
    base = dict(out=q, lse=q, q=q, k=q, v=q, e=q, B=1, T=4, H=1, D=16, scale=0.25, scratch=q)
    fn, struct = "cope_forward_cuda", "MfCopeParams"
    assert emu.call(fn, struct, n_pos=2, scratch_floats=7, **base) == 1  # scratch < 8
    assert emu.call(fn, struct, n_pos=0, scratch_floats=64, **base) == 1
    assert emu.call(fn, struct, n_pos=2, scratch_floats=64, **{**base, "D": 129}) == 1


@pytest.mark.parametrize("mask", ["none", "prefix"])
def test_attention_masks(emu, rng, mask):
    """cuda/attention.cu's masks none and prefix (P_b of 0, inside the first key tile, past the
    first dk/dv block of 64 keys, T), forward and backward, against the reference."""
    B, T, H, D = (1, 37, 2, 16) if mask == "none" else (4, 70, 1, 16)
    prefix = np.array([0, 5, 67, 70], np.int32) if mask == "prefix" else None
    q, k, v, dout = (randn(rng, B, T, H, D) for _ in range(4))
    scale = 1.0 / np.sqrt(D)
    sizes = dict(B=B, T=T, H=H, D=D, scale=scale, mask=MASKS[mask], prefix=prefix)
    out, lse = run(emu, "attention_forward_cuda", "MfAttentionParams",
                   lambda: dict(out=empty(B, T, H, D), lse=empty(B, H, T), q=q, k=k, v=v,
                                **sizes), ["out", "lse"])
    rout, rlse = ref.attention_forward(q, k, v, scale, mask=mask, prefix=prefix)
    assert_close(out, rout, "reduction", "out")
    assert_close(lse, rlse, "reduction", "lse")
    floats = B * H * T
    dq, dk, dv = run(emu, "attention_backward_cuda", "MfAttentionParams",
                     lambda: dict(dq=empty(B, T, H, D), dk=empty(B, T, H, D),
                                  dv=empty(B, T, H, D), q=q, k=k, v=v, dout=dout, o=out,
                                  lse_in=lse, scratch=empty(floats), scratch_floats=floats,
                                  **sizes), ["dq", "dk", "dv"])
    for name, a, w in zip(("dq", "dk", "dv"), (dq, dk, dv),
                          ref.attention_backward(dout, q, k, v, scale, mask=mask,
                                                 prefix=prefix)):
        assert_close(a, w, "gradient", name)


def test_attention_mask_wrappers(emulated, rng):
    """ops.attention_forward / backward with mask and prefix give mapformer._C's results."""
    from mapformer import _C
    q, k, v, dout = (randn(rng, 2, 11, 1, 16) for _ in range(4))
    prefix = np.array([4, 11], np.int32)
    for mask in ("causal", "none", "prefix"):
        kw = dict(mask=mask, prefix=prefix if mask == "prefix" else None)
        want = _C.attention_forward(q, k, v, **kw)
        for a, w in zip(emulated.attention_forward(q, k, v, **kw), want):
            assert_close(a, w, "reduction", f"attention {mask}")
        for a, w in zip(emulated.attention_backward(dout, q, k, v, *want, **kw),
                        _C.attention_backward(dout, q, k, v, *want, **kw)):
            assert_close(a, w, "gradient", f"attention backward {mask}")
    with pytest.raises(ValueError, match="prefix"):
        emulated.attention_forward(q, k, v, mask="prefix", prefix=np.array([-1, 3], np.int32))


@pytest.mark.parametrize("preset,attn_mask", [("mapem_os", "none"), ("cope", "causal"),
                                              ("mapem_o", "prefix")])
def test_models_run_on_the_kernels(emulated, preset, attn_mask):
    """Models on the CUDA backend built from the emulated kernels (conjunctive attention:
    MapEM-os; CoPE; attention with a prefix mask: MapEM-o): two training steps give the C
    backend's loss, logits, gradients and update (test_cuda_model.compare_steps)."""
    from test_cuda_model import TASK, compare_steps
    from mapformer import backend as backends
    from mapformer import cuda
    from mapformer.models import ModelConfig, Transformer
    from mapformer.train import TrainConfig
    ops = backends.cuda_backend(emulated, np, np.asarray)
    train_config = TrainConfig(**TASK, sequences=4, batch_size=2, lr=1e-2)
    cfg = ModelConfig.for_task(preset, train_config.task_config(), d_model=32, n_heads=2,
                               n_layers=1, attn_mask=attn_mask)
    compare_steps(Transformer(cfg, seed=4, backend=ops), Transformer(cfg, seed=4), train_config)


@pytest.mark.parametrize("mask", ["causal", "none", "prefix"])
def test_attention_pair_factor(emu, rng, mask):
    """cuda/attention.cu's per-pair logit factor (pos_ids, pair_factor: APE's distance decay)
    under each mask, forward and backward, against the reference; T past one query block (64)
    and the dk/dv block (64), partial key tiles."""
    B, T, H, D, N = 2, 70, 2, 16, 9
    prefix = np.array([5, 67], np.int32) if mask == "prefix" else None
    q, k, v, dout = (randn(rng, B, T, H, D) for _ in range(4))
    ids = rng.integers(0, N, (B, T)).astype(np.int32)
    table = rng.uniform(0.2, 1.3, (N, N)).astype(np.float32)
    scale = 1.0 / np.sqrt(D)
    sizes = dict(B=B, T=T, H=H, D=D, scale=scale, mask=MASKS[mask], prefix=prefix,
                 pos_ids=ids, pair_factor=table, npos=N)
    out, lse = run(emu, "attention_forward_cuda", "MfAttentionParams",
                   lambda: dict(out=empty(B, T, H, D), lse=empty(B, H, T), q=q, k=k, v=v,
                                **sizes), ["out", "lse"])
    kw = dict(mask=mask, prefix=prefix, pos_ids=ids, pair_factor=table)
    rout, rlse = ref.attention_forward(q, k, v, scale, **kw)
    assert_close(out, rout, "reduction", "out")
    assert_close(lse, rlse, "reduction", "lse")
    floats = B * H * T
    dq, dk, dv = run(emu, "attention_backward_cuda", "MfAttentionParams",
                     lambda: dict(dq=empty(B, T, H, D), dk=empty(B, T, H, D),
                                  dv=empty(B, T, H, D), q=q, k=k, v=v, dout=dout, o=out,
                                  lse_in=lse, scratch=empty(floats), scratch_floats=floats,
                                  **sizes), ["dq", "dk", "dv"])
    for name, a, w in zip(("dq", "dk", "dv"), (dq, dk, dv),
                          ref.attention_backward(dout, q, k, v, scale, **kw)):
        assert_close(a, w, "gradient", name)


def test_attention_pair_factor_checks(emu, emulated, rng):
    """The kernels refuse one of pos_ids and pair_factor alone or npos outside [1, 4096]; the
    wrappers check the ids' range (a device array), naming the argument, and match _C."""
    from mapformer import _C
    q = randn(rng, 1, 4, 1, 16)
    ids, table = np.zeros((1, 4), np.int32), np.ones((3, 3), np.float32)
    base = dict(out=q, lse=q, q=q, k=q, v=q, B=1, T=4, H=1, D=16, scale=0.25)
    fn, struct = "attention_forward_cuda", "MfAttentionParams"
    assert emu.call(fn, struct, pos_ids=ids, pair_factor=table, npos=3, **base) == 0
    assert emu.call(fn, struct, pos_ids=ids, npos=3, **base) == 1
    assert emu.call(fn, struct, pair_factor=table, npos=3, **base) == 1
    for npos in (0, 4097):
        assert emu.call(fn, struct, pos_ids=ids, pair_factor=table, npos=npos, **base) == 1
    qq, k, v, dout = (randn(rng, 2, 11, 1, 16) for _ in range(4))
    f = dict(pos_ids=rng.integers(0, 5, (2, 11)).astype(np.int32),
             pair_factor=rng.uniform(0.5, 1.0, (5, 5)).astype(np.float32))
    want = _C.attention_forward(qq, k, v, mask="none", **f)
    for a, w in zip(emulated.attention_forward(qq, k, v, mask="none", **f), want):
        assert_close(a, w, "reduction", "attention factor")
    for a, w in zip(emulated.attention_backward(dout, qq, k, v, *want, mask="none", **f),
                    _C.attention_backward(dout, qq, k, v, *want, mask="none", **f)):
        assert_close(a, w, "gradient", "attention factor backward")
    with pytest.raises(ValueError, match="pos_ids"):
        emulated.attention_forward(qq, k, v, pos_ids=f["pos_ids"] + 5,
                                   pair_factor=f["pair_factor"])
    with pytest.raises(ValueError, match="pair_factor"):
        emulated.attention_forward(qq, k, v, pos_ids=f["pos_ids"])
    with pytest.raises(ValueError, match="pair_factor"):
        emulated.attention_forward(qq, k, v, pos_ids=f["pos_ids"], pair_factor=table[:2])
    inf_table = f["pair_factor"].copy()
    inf_table[1, 2] = np.inf
    with pytest.raises(ValueError, match="pair_factor"):
        emulated.attention_forward(qq, k, v, pos_ids=f["pos_ids"], pair_factor=inf_table)
    wrapped = f["pos_ids"].astype(np.int64) + 2**32  # would wrap into range if cast first
    for bad, exc in ((wrapped, ValueError), (f["pos_ids"].astype(np.float32), TypeError)):
        with pytest.raises(exc, match="pos_ids"):
            emulated.attention_forward(qq, k, v, pos_ids=bad, pair_factor=f["pair_factor"])
