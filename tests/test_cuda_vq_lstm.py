"""cuda/vq.cu and cuda/lstm.cu under the emulation of CUDA's model (tests/cuda_emulation.py)
against the float64 reference, forward and backward, on awkward sizes (1, odd, prime; rows,
codes and columns that leave partial blocks and GEMM tiles), each under the three block
schedules (the serial ones must give the same bits: test_cuda_ops.run), and through the
Python wrappers (mapformer.cuda.ops with NumPy) against the C ops; TDB with its enc objective
(l2_normalize, ema: tests/test_cuda_ops.py) on the emulated backend against the C one."""
import numpy as np
import pytest

from conftest import assert_close, randn
from cuda_emulation import kernels
from mapformer import _C, cuda
from mapformer import backend as backends
from mapformer import reference as ref
from mapformer.tdb import TDB, TDBConfig
from test_cuda_ops import empty, run
from test_vq import comparison_bound, exact_dist

# (N, M, K, D): one of everything; odd and prime; more codes than a block's 128 threads;
# more rows than a chunk of the codebook scatter and columns past one of its tiles
VQ_SIZES = [(1, 1, 1, 1), (7, 1, 5, 3), (13, 3, 11, 17), (5, 2, 131, 5), (131, 1, 3, 130)]
# (B, T, C, H): one of everything, odd and prime, a gate row (4H) past one GEMM tile
LSTM_SIZES = [(1, 1, 1, 1), (3, 5, 7, 2), (2, 9, 5, 11), (5, 3, 33, 9)]


@pytest.fixture(scope="module")
def emu():
    e = kernels()
    yield e
    e.schedule("concurrent")


@pytest.mark.parametrize("N,M,K,D", VQ_SIZES)
def test_vq(emu, rng, N, M, K, D):
    z, codebook = randn(rng, N, M, D), randn(rng, M, K, D)
    if N > 1:
        z[1] = codebook[:, 0]  # exactly on a code: distance 0
    if K > 2:
        codebook[:, 2] = codebook[:, 1]  # an exact tie wherever code 1 is nearest
    scratch = M * K + N * K

    def forward():
        return dict(codes=empty(N, M, D), indices=np.full((N, M), -1, np.int32),
                    dist=empty(N, M), total=np.full(1, np.nan), z=z, codebook=codebook, N=N,
                    M=M, K=K, D=D, scratch=empty(scratch), scratch_floats=scratch)

    codes, indices, dist, total = run(emu, "vq_forward_cuda", "MfVqParams", forward,
                                      ["codes", "indices", "dist", "total"])
    d = exact_dist(z, codebook)
    chosen = np.take_along_axis(d, indices[..., None].astype(np.int64), -1)
    # a nearest code, to the precision of a float32 comparison of the expansion ...
    assert (chosen <= d.min(-1, keepdims=True) + comparison_bound(z, codebook)).all()
    # ... the lowest index on exact ties (code 2 is code 1's twin) ...
    assert K <= 2 or not (indices == 2).any()
    # ... and the C op's choice wherever the float64 margin to the runner-up exceeds that
    # precision
    clear = np.ones((N, M), bool)
    if K > 1:
        s = np.sort(d, -1)
        clear = s[..., 1] - s[..., 0] > 2 * comparison_bound(z, codebook)[..., 0]
    assert np.array_equal(indices[clear], _C.vq_forward(z, codebook)[1][clear])
    assert np.array_equal(codes, codebook[np.arange(M)[None], indices])
    assert_close(dist, chosen[..., 0], "reduction", "dist")
    assert_close(total[0], chosen.sum(), "reduction", "total")

    dcodes = randn(rng, N, M, D)
    dcodebook0 = randn(rng, M, K, D)

    def backward():
        return dict(dz=empty(N, M, D), dcodebook=dcodebook0.copy(), dcodes=dcodes,
                    indices_in=indices, z=z, codebook=codebook, N=N, M=M, K=K, D=D,
                    codebook_weight=0.7, commitment_weight=0.25)

    dz, dcodebook = run(emu, "vq_backward_cuda", "MfVqParams", backward, ["dz", "dcodebook"])
    want_dz, want_dcb = ref.vq_backward(dcodes, z, codebook, indices, 0.7, 0.25)
    assert_close(dz, want_dz, "default", "dz")
    assert_close(dcodebook - dcodebook0, want_dcb, "reduction", "dcodebook")
    # the scatter sums each code's rows in row order in double, as the C op does: its bits
    c_dcb = dcodebook0.copy()
    _C.vq_backward(dcodes, z, codebook, indices, c_dcb, 0.7, 0.25)
    assert np.array_equal(dcodebook, c_dcb)


def test_vq_out_of_range_ids_add_nothing(emu, rng):
    """An id outside [0, K) (which the wrapper refuses first) gives dz = dcodes and leaves the
    codebook gradient alone, never a write outside the buffers."""
    N, M, K, D = 3, 1, 4, 2
    z, codebook, dcodes = randn(rng, N, M, D), randn(rng, M, K, D), randn(rng, N, M, D)
    indices = np.array([[1], [-1], [K]], np.int32)
    dz, dcodebook = empty(N, M, D), np.zeros((M, K, D), np.float32)
    assert emu.call("vq_backward_cuda", "MfVqParams", dz=dz, dcodebook=dcodebook,
                    dcodes=dcodes, indices_in=indices, z=z, codebook=codebook, N=N, M=M, K=K,
                    D=D, codebook_weight=1.0, commitment_weight=1.0) == 0
    assert np.array_equal(dz[1:], dcodes[1:])
    assert np.array_equal(dcodebook[0, [0, 2, 3]], np.zeros((3, D), np.float32))
    assert_close(dcodebook[0, 1], 2 * (codebook[0, 1] - z[0, 0]), "default", "dcodebook")


def lstm_inputs(rng, B, T, C, H, initial):
    x, w_ih, w_hh, b = (randn(rng, B, T, C), randn(rng, 4 * H, C, scale=0.5),
                        randn(rng, 4 * H, H, scale=0.5), randn(rng, 4 * H, scale=0.5))
    h0, c0 = (randn(rng, B, H), randn(rng, B, H)) if initial else (None, None)
    return x, w_ih, w_hh, b, h0, c0


@pytest.mark.parametrize("B,T,C,H", LSTM_SIZES)
@pytest.mark.parametrize("initial", [False, True])
def test_lstm(emu, rng, B, T, C, H, initial):
    x, w_ih, w_hh, b, h0, c0 = lstm_inputs(rng, B, T, C, H, initial)

    def forward():
        return dict(h=empty(B, T, H), c=empty(B, T, H), gates=empty(B, T, 4 * H), x=x, w_ih=w_ih,
                    w_hh=w_hh, b=b, h0=h0, c0=c0, B=B, T=T, C=C, H=H)

    h, c, gates = run(emu, "lstm_forward_cuda", "MfLstmParams", forward, ["h", "c", "gates"])
    want = ref.lstm_forward(x, w_ih, w_hh, b, h0, c0)
    for name, got, expected in zip(("h", "c", "gates"), (h, c, gates), want):
        assert_close(got, expected, "reduction", name)

    dh = randn(rng, B, T, H)
    grads0 = [randn(rng, *a.shape) for a in (w_ih, w_hh, b)]
    scratch = B * T * 5 * H + 2 * B * H

    def backward():
        return dict(dx=empty(B, T, C), dw_ih=grads0[0].copy(), dw_hh=grads0[1].copy(),
                    db=grads0[2].copy(), dh0=empty(B, H), dc0=empty(B, H), dh=dh, x=x,
                    h_in=h, c_in=c, gates_in=gates, h0=h0, c0=c0, w_ih=w_ih, w_hh=w_hh,
                    B=B, T=T, C=C, H=H, scratch=empty(scratch), scratch_floats=scratch)

    got = run(emu, "lstm_backward_cuda", "MfLstmParams", backward,
              ["dx", "dw_ih", "dw_hh", "db", "dh0", "dc0"])
    expected = ref.lstm_backward(dh, x, w_ih, w_hh, *want, h0, c0)
    for name, g, e, g0 in zip(("dx", "dw_ih", "dw_hh", "db", "dh0", "dc0"), got, expected,
                              [0, *grads0, 0, 0]):
        assert_close(g - g0, e, "gradient", name)


def test_lstm_refuses_bad_sizes(emu):
    assert emu.call("lstm_forward_cuda", "MfLstmParams", B=0, T=1, C=1, H=1) == 1
    assert emu.call("vq_forward_cuda", "MfVqParams", N=1, M=1, K=0, D=1) == 1


def test_wrappers_match_the_c_ops(emu, rng):
    """mapformer.cuda.ops' vq and lstm (NumPy arrays on the emulated kernels) against
    mapformer._C's, which the C backend runs."""
    ops = emu.ops()
    z, codebook = randn(rng, 9, 2, 5), randn(rng, 2, 6, 5)
    got, want = ops.vq_forward(z, codebook), _C.vq_forward(z, codebook)
    assert np.array_equal(got[1], want[1]) and np.array_equal(got[0], want[0])
    assert_close(got[2], want[2], "reduction", "dist")
    assert got[3] == pytest.approx(want[3], rel=1e-5)
    dcodes = randn(rng, 9, 2, 5)
    dcb, dcb_c = np.zeros((2, 6, 5), np.float32), np.zeros((2, 6, 5), np.float32)
    assert_close(ops.vq_backward(dcodes, z, codebook, want[1], dcb, 0.5, 0.25),
                 _C.vq_backward(dcodes, z, codebook, want[1], dcb_c, 0.5, 0.25), "default", "dz")
    assert np.array_equal(dcb, dcb_c)
    with pytest.raises(ValueError, match="indices"):
        ops.vq_backward(dcodes, z, codebook, want[1] + 6, dcb, 0.5, 0.25)
    for initial in (False, True):
        x, w_ih, w_hh, b, h0, c0 = lstm_inputs(rng, 2, 4, 3, 5, initial)
        got, want = ops.lstm_forward(x, w_ih, w_hh, b, h0, c0), \
            _C.lstm_forward(x, w_ih, w_hh, b, h0, c0)
        for name, g, w in zip(("h", "c", "gates"), got, want):
            assert_close(g, w, "reduction", name)
        dh = randn(rng, 2, 4, 5)
        grads = [np.zeros(a.shape, np.float32) for a in (w_ih, w_hh, b)]
        grads_c = [a.copy() for a in grads]
        out = ops.lstm_backward(dh, x, w_ih, w_hh, *got, *grads, h0, c0)
        out_c = _C.lstm_backward(dh, x, w_ih, w_hh, *want, *grads_c, h0, c0)
        for g, w in zip([*out, *grads], [*out_c, *grads_c]):
            assert_close(g, w, "gradient", "lstm backward")


def test_tdb_enc_on_the_emulated_backend(emu):
    """A TDB with the enc objective (vq, the heads, l2_normalize, ema) on the CUDA backend of
    emulated kernels: the C backend's loss, gradients and teacher update."""
    kernels = emu.ops()
    ops = backends.cuda_backend(kernels, np, np.asarray)
    cfg = TDBConfig(n_obs=5, d_model=32, n_heads=2, n_layers=1, codes=8, head_hidden=8,
                    enc=True, ema=0.9)
    tokens = np.random.default_rng(0).integers(0, 5, (2, 10))
    tokens[:, 1::2] = 5 + tokens[:, 1::2] % 4
    models = [TDB(cfg, seed=1, backend=b) for b in ("c", ops)]
    losses = []
    for model in models:
        losses.append(model.loss(tokens))
        model.backward()
        model.update_teacher()
    assert losses[1] == pytest.approx(losses[0], rel=1e-5)
    assert_close(models[1].params.grad, models[0].params.grad, "gradient", "grad")
    assert_close(models[1].teacher.params.data, models[0].teacher.params.data, "default",
                 "teacher")
