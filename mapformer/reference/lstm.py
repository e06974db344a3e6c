"""Float64 NumPy reference of the lstm ops (csrc/ops/lstm.c): one LSTM layer, gates (i, f, g, o)."""
import numpy as np

from .common import _cast, returns


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


@returns("h", "c", "gates")
def lstm_forward(x, w_ih, w_hh, b, h0=None, c0=None, dtype=np.float64):
    """x (B, T, C), w_ih (4H, C), w_hh (4H, H), b (4H,), h0, c0 (B, H) or None (zeros) ->
    (h (B, T, H), c (B, T, H), gates (B, T, 4H)): per step pre = x_t w_ih^T + b + h_{t-1}
    w_hh^T, gates = (sigmoid(i), sigmoid(f), tanh(g), sigmoid(o)), c_t = f c_{t-1} + i g,
    h_t = o tanh(c_t)."""
    x, w_ih, w_hh, b = _cast(dtype, x, w_ih, w_hh, b)
    B, T, _ = x.shape
    H = w_hh.shape[1]
    hp = np.zeros((B, H), dtype) if h0 is None else np.asarray(h0, dtype)
    cp = np.zeros((B, H), dtype) if c0 is None else np.asarray(c0, dtype)
    h, c, gates = (np.zeros((B, T, H), dtype), np.zeros((B, T, H), dtype),
                   np.zeros((B, T, 4 * H), dtype))
    for t in range(T):
        pre = x[:, t] @ w_ih.T + b + hp @ w_hh.T
        i, f, g, o = np.split(pre, 4, axis=-1)
        i, f, g, o = _sigmoid(i), _sigmoid(f), np.tanh(g), _sigmoid(o)
        cp = f * cp + i * g
        hp = o * np.tanh(cp)
        h[:, t], c[:, t], gates[:, t] = hp, cp, np.concatenate([i, f, g, o], -1)
    return h, c, gates


@returns("dx", "dw_ih", "dw_hh", "db", "dh0", "dc0")
def lstm_backward(dh, x, w_ih, w_hh, h, c, gates, h0=None, c0=None, dtype=np.float64):
    """Backpropagation through time of :func:`lstm_forward` from dh (B, T, H), the gradient
    reaching every h_t, and the forward's h, c, gates -> (dx (B, T, C), dw_ih (4H, C),
    dw_hh (4H, H), db (4H,), dh0 (B, H), dc0 (B, H))."""
    dh, x, w_ih, w_hh, h, c, gates = _cast(dtype, dh, x, w_ih, w_hh, h, c, gates)
    B, T, _ = x.shape
    H = w_hh.shape[1]
    h0 = np.zeros((B, H), dtype) if h0 is None else np.asarray(h0, dtype)
    c0 = np.zeros((B, H), dtype) if c0 is None else np.asarray(c0, dtype)
    dx, dw_ih, dw_hh = np.zeros_like(x), np.zeros_like(w_ih), np.zeros_like(w_hh)
    db = np.zeros(4 * H, dtype)
    dh_next, dc_next = np.zeros((B, H), dtype), np.zeros((B, H), dtype)
    for t in reversed(range(T)):
        i, f, g, o = np.split(gates[:, t], 4, axis=-1)
        c_prev = c[:, t - 1] if t > 0 else c0
        h_prev = h[:, t - 1] if t > 0 else h0
        tc = np.tanh(c[:, t])
        dht = dh[:, t] + dh_next
        dct = dc_next + dht * o * (1 - tc * tc)
        dpre = np.concatenate([dct * g * i * (1 - i), dct * c_prev * f * (1 - f),
                               dct * i * (1 - g * g), dht * tc * o * (1 - o)], -1)
        dx[:, t] = dpre @ w_ih
        dw_ih += dpre.T @ x[:, t]
        dw_hh += dpre.T @ h_prev
        db += dpre.sum(0)
        dh_next, dc_next = dpre @ w_hh, dct * f
    return dx, dw_ih, dw_hh, db, dh_next, dc_next
