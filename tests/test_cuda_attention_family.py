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
