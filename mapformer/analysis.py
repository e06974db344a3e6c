"""Analyses of a trained model: what a learned cognitive map looks like (MapFormer paper,
section 5.4 and Figures 3 and 5).

A MapFormer has learned a map when

- actions have non-zero integration times Delta and observations ~0
  (:func:`integration_times`);
- an action and its inverse have opposite Delta, cosine ~ -1 (:func:`action_similarity`);
- value vectors of actions are near 0 and those of observations are not (:func:`value_norms`);
- a recall attends to the earlier visit of the same cell (:func:`attention_map`,
  :func:`recall_key`);
- the path-integrated angles of a walk that returns to its start come back to their start
  values (:func:`closed_walk`, :func:`path_angles`, :func:`closure_error`,
  :func:`project_to_plane`);
- in 1D, one integrated number is the position, and the longest distance covered is about one
  cycle of the lowest frequency (:func:`scalar_positions`, :func:`effective_frequencies`,
  :func:`position_map`, :func:`position_fit`: Fig. 6a).

Every function runs the model's own forward (the C core, dropout off) and reads the traces its
layers keep, through a block's mixer (``block.mixer``: values ``vh``, the queries and keys
its softmax compared) and its positional scheme (``block.mixer.scheme``: integration times
``delta``, angles ``theta``, ``frequencies``); each mixer and scheme lists its ``traces``.
Only one-off NumPy math is done here (float64).

Token layout (forced navigation, :mod:`mapformer.tasks.navigation`): a sequence is
a_1, o_1, ..., a_L, o_L, so even positions hold actions and odd positions observations.
Shapes: B sequences, T = 2L tokens, H heads, D head dim, NB = D / 2 rotation blocks,
n = task.dims, r = delta_rank.

Calling any of these functions overwrites the activations the model keeps for backward().
"""
import numpy as np

from .schemes import SCHEMES
from .tasks import navigation

AXIS_NAMES = "xyzuvw"


# ---- helpers -----------------------------------------------------------------------------
def _tokens(batch):
    """A Batch, tokens (B, T) or one sequence (T,) -> int32 (B, T)."""
    tokens = np.asarray(getattr(batch, "tokens", batch))
    if tokens.ndim == 1:
        tokens = tokens[None]
    if tokens.ndim != 2 or tokens.size == 0 or not np.issubdtype(tokens.dtype, np.integer):
        raise ValueError(f"expected integer tokens (B, T) or (T,) (or a Batch), got shape "
                         f"{tokens.shape} dtype {tokens.dtype}")
    return np.ascontiguousarray(tokens, dtype=np.int32)


def _block(model, layer):
    n = len(model.blocks)
    if not isinstance(layer, (int, np.integer)) or not -n <= layer < n:
        raise ValueError(f"layer must be an integer in [0, {n}), the model has {n} layer(s); "
                         f"got {layer!r}")
    return model.blocks[layer]


def _scheme(model, layer):
    return _block(model, layer).mixer.scheme


def _float64(model, array):
    """A trace of the model (any backend) as a new float64 NumPy array."""
    return np.array(model.ops.to_numpy(array), dtype=np.float64)


def _path(model, layer, what):
    """The layer's scheme if it integrates Delta (it traces ``delta``), else a ValueError
    saying the scheme has no Delta."""
    scheme = _scheme(model, layer)
    if "delta" not in scheme.traces:
        integrating = [name for name, cls in SCHEMES.entries.items() if "delta" in cls.traces]
        raise ValueError(
            f"{what} needs integration times Delta, but positional scheme {scheme.name!r} keeps "
            f"none (only path-integrating schemes do: {', '.join(integrating)})")
    return scheme


def _rotated_queries_keys(mixer):
    """The queries and keys that angles rotated (B, T, H, D): the positional ones of the
    conjunctive mixer, the ones the attention mixer's softmax compared."""
    return (mixer.qp, mixer.kp) if mixer.name == "conjunctive" else (mixer.q_att, mixer.k_att)


def _forward(model, tokens):
    """model.forward in evaluation mode (each block's dropout and bottleneck flags restored
    afterwards: Transformer.evaluating)."""
    with model.evaluating():
        return model.forward(tokens)


def _is_action(tokens, task):
    """bool (B, T): action tokens, by id when the task is given, else by the layout."""
    if task is not None:
        return tokens < task.n_actions
    return np.broadcast_to(np.arange(tokens.shape[1]) % 2 == 0, tokens.shape)


def wrap(theta):
    """Angles reduced to [-pi, pi) (same shape)."""
    return theta - 2 * np.pi * np.floor(theta / (2 * np.pi) + 0.5)


def action_names(task):
    """Labels of the task's action ids, e.g. ['+x', '-x', '+y', '-y'] in 2D (id 2j is +1 on
    axis j, id 2j+1 is -1)."""
    axes = [AXIS_NAMES[j] if j < len(AXIS_NAMES) else f"a{j}" for j in range(task.dims)]
    return [f"{'+-'[a % 2]}{axes[a // 2]}" for a in range(task.n_actions)]


# ---- integration times, action similarity, values ---------------------------------------
def integration_times(model, batch, layer=0, task=None):
    """Integration times Delta of every token, and how they split between actions and
    observations.

    batch: a navigation Batch or tokens int (B, T) (T = 2L). task: a NavigationConfig to tell
    actions by id (id < 2 dims); without it the layout decides (even positions are actions).
    Returns a dict:
      delta (B, T, H, NB) float64; is_action bool (B, T);
      action_abs_mean, observation_abs_mean: mean |Delta| over action / observation tokens
      (over every head and block); ratio = action_abs_mean / observation_abs_mean;
      per_action: {action id: mean Delta (H, NB)} over the action tokens with that id;
      observation_mean: mean Delta (H, NB) over observation tokens (a common offset shared by
      every step: it adds the same angle to each step, which the queries can absorb);
      observation_spread: mean |Delta - observation_mean| over observation tokens (~0 when
      no observation moves the map relative to another).
    Raises ValueError if the layer's scheme has no Delta (rope, cope, tape, none)."""
    tokens = _tokens(batch)
    path = _path(model, layer, "integration_times")
    _forward(model, tokens)
    delta = _float64(model, path.delta)
    act = np.array(_is_action(tokens, task))
    a_abs = float(np.abs(delta[act]).mean()) if act.any() else float("nan")
    o_abs = float(np.abs(delta[~act]).mean()) if (~act).any() else float("nan")
    per_action = {int(a): delta[act & (tokens == a)].mean(0) for a in np.unique(tokens[act])}
    obs_mean = delta[~act].mean(0) if (~act).any() else None
    spread = float(np.abs(delta[~act] - obs_mean).mean()) if (~act).any() else float("nan")
    return {"delta": delta, "is_action": act, "action_abs_mean": a_abs,
            "observation_abs_mean": o_abs, "ratio": a_abs / o_abs, "per_action": per_action,
            "observation_mean": obs_mean, "observation_spread": spread}


def action_similarity(model, task, layer=0, space="delta", step=False):
    """Cosine similarities between the integration-time vectors of the task's actions.

    Each token id runs through the model alone (a batch of sequences of one token), so at
    layer 0 its vector is exactly its embedding through ln1 and the Delta projections.
    space: 'delta' (Delta = W_out W_in x, H * NB values) or 'delta_in' (W_in x, r values: the
    paper's Delta^in of Figure 5b; with r = 1 every cosine is +-1).
    step: add the mean vector of the observation ids to each action's: the integration time
    of a whole step (a_t, o_t). Every action is followed by one observation, so a common
    offset of the observations is indistinguishable from one of the actions; with step=True
    the table does not depend on how the model split it (the paper's reading, Delta_o ~ 0,
    is the split where both tables agree).
    Returns (ids int (n_actions,), matrix (n_actions, n_actions)); an action and its inverse
    (ids 2j, 2j+1) should be near -1. Raises ValueError without Delta or for a bad space."""
    if space not in ("delta", "delta_in"):
        raise ValueError(f"space must be 'delta' or 'delta_in', got {space!r}")
    if model.config.vocab_size != task.vocab_size:
        raise ValueError(f"the model's vocab_size {model.config.vocab_size} is not the task's "
                         f"{task.vocab_size}")
    path = _path(model, layer, "action_similarity")
    ids = np.arange(task.n_actions)
    every = np.arange(task.vocab_size)
    _forward(model, (every if step else ids).reshape(-1, 1))
    vectors = _float64(model, path.delta if space == "delta" else path.delta_r)
    vectors = vectors.reshape(len(every) if step else len(ids), -1)
    if step:
        vectors = vectors[ids] + vectors[task.n_actions:].mean(0)
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-30)
    return ids, unit @ unit.T


def value_norms(model, batch, layer=0, task=None):
    """Norms of the value vectors (all heads together) of action vs observation tokens.

    batch: a Batch or tokens (B, T); task: as in :func:`integration_times`.
    Returns a dict: norms (B, T) float64; action_mean, observation_mean (floats);
    ratio = observation_mean / action_mean (>> 1 once trained, Figure 5b bottom);
    per_token: {token id: mean norm}. Works for every mixer that keeps values (``vh``)."""
    tokens = _tokens(batch)
    mixer = _block(model, layer).mixer
    if "vh" not in mixer.traces:
        raise ValueError(f"value_norms: mixer {mixer.name!r} keeps no values")
    _forward(model, tokens)
    v = _float64(model, mixer.vh)
    norms = np.sqrt((v.reshape(v.shape[0], v.shape[1], -1) ** 2).sum(-1))
    act = np.array(_is_action(tokens, task))
    a, o = float(norms[act].mean()), float(norms[~act].mean())
    return {"norms": norms, "action_mean": a, "observation_mean": o, "ratio": o / a,
            "per_token": {int(t): float(norms[tokens == t].mean()) for t in np.unique(tokens)}}


# ---- attention of one query ---------------------------------------------------------------
def _split_index(tokens, index):
    if isinstance(index, (tuple, list)):
        b, i = (int(x) for x in index)
    elif tokens.shape[0] == 1:
        b, i = 0, int(index)
    else:
        raise ValueError(f"the batch holds {tokens.shape[0]} sequences: give index as "
                         "(sequence, position)")
    if not (0 <= b < tokens.shape[0] and 0 <= i < tokens.shape[1]):
        raise ValueError(f"index {(b, i)} is outside the tokens' shape {tokens.shape}")
    return b, i


def _softmax(z):
    z = z - z.max(-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(-1, keepdims=True)


def _attention_source(model, layer, what):
    """The layer's mixer and the object holding the queries and keys its softmax compared
    (the mixer, or an ``attention`` scheme that keeps them); ValueError for others."""
    mixer = _block(model, layer).mixer
    scheme = mixer.scheme
    if mixer.name == "attention":
        source = scheme if scheme.kind == "attention" else mixer
        if "q_att" not in source.traces:
            raise ValueError(
                f"{what}: positional scheme {scheme.name!r} runs its own attention, "
                "whose logits are not products of saved queries and keys (cope adds q.e[p_ij] "
                "terms at interpolated contextual positions)")
        return mixer, source
    if mixer.name != "conjunctive":
        raise ValueError(f"{what} knows the attention and conjunctive mixers, not "
                         f"{mixer.name!r}")
    return mixer, mixer


def attention_rows(model, rows, layer=0, sequence=0, what="attention_rows"):
    """Rows of the causal attention of one sequence of the model's LAST forward, from the
    queries and keys its layer saved (no forward is run here).

    rows: query positions int (R,); sequence: its index in the last forward's batch.
    Returns (probs, logits): float64 (H, R, T), probs[h, r, j] the weight of key j in row
    rows[r] (0 for j > rows[r]); logits the pre-softmax scores there (-inf for j > rows[r]),
    or None for mapem_os's softmax_product mode (a product of two softmaxes has none).
    Query-scaling options are included: the saved queries carry their factors. The modes as
    in :func:`attention_map`."""
    mixer, source = _attention_source(model, layer, what)
    rows = np.asarray(rows, dtype=np.int64).reshape(-1)
    d = model.config.head_dim
    scale = 1.0 / np.sqrt(d)

    def scores(q, k):  # q, k (B, T, H, D) -> (H, R, T), -inf above the diagonal
        q = _float64(model, q[sequence])[rows]
        k = _float64(model, k[sequence])
        out = np.einsum("rhd,jhd->hrj", q, k)
        return np.where(np.arange(k.shape[0]) <= rows[:, None], out, -np.inf)

    if mixer.name == "attention":
        logits = scale * scores(source.q_att, source.k_att)
    elif mixer.qx is None:  # positional scores alone
        logits = scale * scores(mixer.qp, mixer.kp)
    else:
        sx, sp = scores(mixer.qx, mixer.kx), scores(mixer.qp, mixer.kp)
        if mixer.mode == "score_product":
            logits = scale * np.where(np.isfinite(sx), sx * sp, -np.inf)
        elif mixer.mode == "sum":
            logits = scale * (sx + sp)
        else:
            return _softmax(scale * sx) * _softmax(scale * sp), None
    return _softmax(logits), logits


def attention_map(model, batch, index, layer=0, head=None):
    """Attention weights of one query position over all keys, from the tensors the layer saved.

    batch: a Batch, tokens (B, T) or (T,); index: the query position i (a recall is a masked
    position, an action token), or (b, i) when B > 1. head: None for every head.
    Returns float64 (H, T), or (T,) for one head: row i of the causal attention matrix, zero
    for keys j > i. The attention mixer: softmax_j(q_i . k_j / sqrt(D)) on the queries and
    keys its softmax compared (``q_att``, ``k_att``: content ones for mapem_o, rotated for
    rope and mapwm, multiplied by TAPE's state for tape). The conjunctive mixer: the same on
    the positional queries and keys for mapem_s; for mapem_os its mode (score_product: softmax
    of the scaled product of the scores; sum: softmax of their sum; softmax_product: the
    product of the two softmaxes, whose rows sum to less than 1). Only row i is computed,
    never the T x T matrix. Raises ValueError for cope (its logits add interpolated contextual
    position terms that are not saved)."""
    tokens = _tokens(batch)
    b, i = _split_index(tokens, index)
    _attention_source(model, layer, "attention_map")
    _forward(model, tokens[b:b + 1])
    out = attention_rows(model, [i], layer, what="attention_map")[0][:, 0]
    if head is None:
        return out
    n_heads = model.config.n_heads
    if not 0 <= head < n_heads:
        raise ValueError(f"head must be in [0, {n_heads}), got {head!r}")
    return out[head]


def recall_key(batch, index):
    """The key a recall should attend to: the last earlier observation of the cell.

    batch: a navigation Batch (tokens (B, T), positions (B, L, n)); index: an action position
    i = 2t (or (b, i)) whose next token o_t is at positions[b, t]. Returns the token index
    2s + 1 of the latest observation o_s, s < t, of that cell. Raises ValueError if i is not an
    action position or the cell was not visited before (not a recall)."""
    tokens = _tokens(batch)
    b, i = _split_index(tokens, index)
    if i % 2:
        raise ValueError(f"position {i} is an observation; recalls are queried at action "
                         "positions (even)")
    pos = np.asarray(batch.positions)[b]
    t = i // 2
    earlier = np.nonzero((pos[:t] == pos[t]).all(-1))[0]
    if earlier.size == 0:
        raise ValueError(f"position {i}: the cell {pos[t].tolist()} was not visited before, "
                         "so it is not a recall")
    return int(2 * earlier[-1] + 1)


# ---- path integration -------------------------------------------------------------------
def path_angles(model, tokens, layer=0):
    """Unwrapped path-integrated angles of one sequence: theta = omega * cumsum_t(Delta).

    tokens: (T,) or (1, T) (or a Batch of one sequence). Returns float64 (T, H, NB); reduced
    to [-pi, pi) it equals the layer's ``theta``. A scheme of fixed ``frequencies`` without
    Delta (rope) gives its angles omega * (t + 1), those of a constant Delta = 1. Raises
    ValueError for the others (cope, tape, none)."""
    tokens = _tokens(tokens)
    if tokens.shape[0] != 1:
        raise ValueError(f"path_angles takes one sequence, got {tokens.shape[0]}")
    scheme = _scheme(model, layer)
    if "delta" not in scheme.traces and "frequencies" in scheme.traces:
        t = np.arange(1, tokens.shape[1] + 1, dtype=np.float64)
        return t[:, None, None] * _float64(model, scheme.frequencies)
    path = _path(model, layer, "path_angles")
    _forward(model, tokens)
    return np.cumsum(_float64(model, path.delta[0]), axis=0) * _float64(model,
                                                                         path.frequencies)


def scalar_positions(model, batch, layer=0):
    """The position a rank-1 path integrator keeps (the paper's Fig. 6a) and the frequencies
    that turn it into angles.

    A layer of delta_rank 1 (1D navigation, selective copy) integrates one number per token,
    Delta^in = W_in x (the ``delta_r`` trace), and every block's angle is that running sum
    times an effective frequency: theta = nu * p with p = cumsum_t Delta^in and
    nu = omega * W_out (the learned omega scaled by the block's row of W_out).

    batch: a Batch or tokens int (B, T). Returns {"position": float64 (B, T) p,
    "frequencies": float64 (H, NB) nu (radians per unit of p; signed)}. ValueError when the
    layer has no Delta or its delta_rank is not 1."""
    tokens = _tokens(batch)
    nu = effective_frequencies(model, layer)
    path = _scheme(model, layer)
    _forward(model, tokens)
    position = np.cumsum(_float64(model, path.delta_r).reshape(tokens.shape), axis=1)
    return {"position": position, "frequencies": nu}


def effective_frequencies(model, layer=0):
    """nu = omega * W_out (float64 (H, NB), signed): the radians per unit of the integrated
    number that each block of a rank-1 path integrator turns (:func:`scalar_positions`), read
    from the weights alone (no forward). ValueError when the layer has no Delta or its
    delta_rank is not 1."""
    path = _path(model, layer, "scalar_positions")
    rank = path.config.options["delta_rank"]
    if rank != 1:
        raise ValueError(f"scalar_positions needs delta_rank 1 (one number integrated per "
                         f"token), layer {layer} has delta_rank {rank}")
    return _float64(model, path.frequencies) * _float64(
        model, path.delta_out.weight.value).reshape(path.frequencies.shape)


def position_map(model, batches, task, layer=0, bins=60):
    """How a rank-1 path integrator's position (:func:`scalar_positions`) maps 1D navigation's
    cells: the Fig. 6a histogram and what the paper reads from it (appendix 10.2: the
    longest distance the model covers should be about one cycle of its lowest frequency).

    batches: Batches of 1D navigation (tokens (B, 2L)); task: their NavigationConfig. The
    positions of every token are read by :func:`position_fit` against the walk's unwrapped
    displacement (:func:`mapformer.tasks.navigation.unwrapped_displacement`); returns its
    dict."""
    if task.dims != 1:
        raise ValueError(f"position_map reads 1D navigation, got dims={task.dims}")
    positions, displacements, actions, nu = [], [], [], None
    for batch in batches:
        read = scalar_positions(model, batch, layer)
        nu = read["frequencies"]
        positions.append(read["position"])
        displacements.append(np.repeat(
            navigation.unwrapped_displacement(batch, 1)[..., 0], 2, axis=1))
        actions.append(np.array(_is_action(_tokens(batch), task)))
    if nu is None:
        raise ValueError("position_map needs at least one batch")
    return position_fit(np.concatenate(positions), np.concatenate(displacements),
                        np.concatenate(actions), nu, bins)


def position_fit(position, displacement, is_action, frequencies, bins=60):
    """Least squares position = slope * d + drift_action * n_a + drift_observation * n_o + c
    over tokens, where n_a, n_o count the actions and observations read so far in a
    sequence.

    position float (B, T) (one sequence: (T,)); displacement (same shape): the cells moved from
    the start after each token; is_action bool (same shape); frequencies nu (any shape): the
    effective frequencies (radians per unit of position). A map has r2 near 1; a drift per step
    (drift_action + drift_observation) adds an angle that grows with the lag between a visit and
    its recall, which a map must keep near 0.

    Returns {"edges" (bins + 1,), "counts" (bins,): the histogram of the positions; "slope"
    (units of position per cell), "drift_action", "drift_observation" (per token read),
    "r2"; "extent": the positions' 0.5 to 99.5 percentile range; "nu_min", "nu_max": the
    smallest and largest |nu|; "min_period", "max_period": 2 pi / nu (units of position;
    None for nu = 0); "min_period_cells", "max_period_cells": the same in cells (/ |slope|);
    "extent_over_min_period"; "extent_cells": extent / |slope|; "drift_action_cells",
    "drift_observation_cells": the drifts in cells (/ slope); "drift_cells_per_step": their
    sum}."""
    p = np.asarray(position, dtype=np.float64)
    d = np.asarray(displacement, dtype=np.float64)
    act = np.asarray(is_action, dtype=bool)
    if not p.shape == d.shape == act.shape or p.size == 0:
        raise ValueError(f"position, displacement and is_action must share one non-empty "
                         f"shape, got {p.shape}, {d.shape}, {act.shape}")
    p2, d2, a2 = (np.atleast_2d(v) for v in (p, d, act))
    x = np.stack([d2, np.cumsum(a2, axis=1), np.cumsum(~a2, axis=1), np.ones(d2.shape)],
                 axis=-1).reshape(-1, 4)
    p = p2.ravel()
    coef, *_ = np.linalg.lstsq(x, p, rcond=None)
    residual = p - x @ coef
    r2 = 1.0 - float(residual @ residual) / max(float(((p - p.mean()) ** 2).sum()), 1e-300)
    slope, drift_a, drift_o = (float(c) for c in coef[:3])
    low, high = np.percentile(p, [0.5, 99.5])
    counts, edges = np.histogram(p, bins=bins, range=(float(p.min()), float(p.max())))
    magnitude = np.abs(np.asarray(frequencies, dtype=np.float64))
    nu_min, nu_max = float(magnitude.min()), float(magnitude.max())
    extent, scale = float(high - low), abs(slope)

    def period(f, unit=1.0):
        return 2 * np.pi / f / unit if f > 0 and unit > 0 else None

    return {"edges": edges.tolist(), "counts": counts.tolist(), "slope": slope,
            "drift_action": drift_a, "drift_observation": drift_o, "r2": r2,
            "extent": extent, "nu_min": nu_min, "nu_max": nu_max,
            "min_period": period(nu_min), "max_period": period(nu_max),
            "min_period_cells": period(nu_min, scale), "max_period_cells": period(nu_max, scale),
            "extent_over_min_period": extent * nu_min / (2 * np.pi),
            "extent_cells": extent / scale if scale > 0 else None,
            "drift_action_cells": drift_a / slope if slope else None,
            "drift_observation_cells": drift_o / slope if slope else None,
            "drift_cells_per_step": (drift_a + drift_o) / slope if slope else None}


def unwrap_positions(positions, grid_size):
    """Torus coordinates along a walk (L, n) -> coordinates in the plane (L, n), float64,
    assuming each step moves less than half the grid on every axis."""
    p = np.asarray(positions, dtype=np.float64)
    step = np.diff(p, axis=0)
    step -= grid_size * np.round(step / grid_size)
    return np.concatenate([p[:1], p[:1] + np.cumsum(step, axis=0)])


def _features(theta):
    theta = np.asarray(theta, dtype=np.float64)
    theta = theta.reshape(theta.shape[0], -1)
    return np.concatenate([np.cos(theta), np.sin(theta)], axis=1)


def project_to_plane(theta, positions=None, grid_size=None, n_components=None):
    """Project angles to 2D through the features [cos theta, sin theta].

    theta (T, H, NB) (or (T, F)). Without positions: the top two principal components of the
    features. With positions (T, n) per token or (T / 2, n) per step (each step's position
    holds for its action and observation), n <= 2: the least-squares linear map (with
    intercept) from the features to the positions, fitted on the top ``n_components``
    principal components (default max(2, T // 8), at most the feature count) so that it cannot
    interpolate arbitrary points; n = 1 gets the first principal component as second axis.
    grid_size: unwrap torus positions first (see :func:`unwrap_positions`).
    Returns float64 (T, 2)."""
    feats = _features(theta)
    t = feats.shape[0]
    feats = feats - feats.mean(0)
    _, _, vt = np.linalg.svd(feats, full_matrices=False)
    pcs = feats @ vt.T  # (T, min(T, F)) principal component scores
    if positions is None:
        out = np.zeros((t, 2))
        out[:, :min(2, pcs.shape[1])] = pcs[:, :2]
        return out
    pos = np.asarray(positions, dtype=np.float64)
    if pos.ndim == 1:
        pos = pos[:, None]
    if grid_size is not None:
        pos = unwrap_positions(pos, grid_size)
    if pos.shape[0] * 2 == t:
        pos = np.repeat(pos, 2, axis=0)
    if pos.shape[0] != t or pos.shape[1] > 2:
        raise ValueError(f"positions must be (T, n) or (T / 2, n) with n <= 2 for T = {t}, "
                         f"got {pos.shape}")
    k = min(n_components or max(2, t // 8), pcs.shape[1])
    design = np.concatenate([pcs[:, :k], np.ones((t, 1))], axis=1)
    weights, *_ = np.linalg.lstsq(design, pos, rcond=None)
    fit = design @ weights
    if fit.shape[1] == 1:
        fit = np.concatenate([fit, pcs[:, :1]], axis=1)
    return fit


def closed_walk(task, length, rng=None, shuffle=False):
    """A navigation sequence whose walk returns to its first cell.

    length: L steps, odd >= 1: a first action a_1 (to p_1), a random walk of (L - 1) / 2 steps,
    then the inverses of those steps (in reverse order, or shuffled when ``shuffle``: the
    loop then encloses an area), so positions[0, -1] == positions[0, 0] (= p_1). Observations
    follow a map drawn like the task's (or the task's fixed map). rng: Generator or seed.
    Returns a navigation Batch of one sequence: tokens, targets, mask (1, 2L), positions
    (1, L, n)."""
    if not isinstance(length, (int, np.integer)) or length < 1 or length % 2 == 0:
        raise ValueError(f"length must be an odd integer >= 1 (one step, then k steps and "
                         f"their k inverses), got {length!r}")
    rng = np.random.default_rng(rng)
    k = (length - 1) // 2
    half = rng.integers(0, task.n_actions, size=k)
    back = (half ^ 1)[::-1]  # id 2j <-> 2j+1 is the inverse move
    if shuffle:
        back = rng.permutation(back)
    actions = np.concatenate([rng.integers(0, task.n_actions, size=1), half, back])
    g, n = task.grid_size, task.dims
    moves = np.zeros((length, n), dtype=np.int64)
    moves[np.arange(length), actions // 2] = 1 - 2 * (actions % 2)
    positions = (rng.integers(0, g, size=n) + np.cumsum(moves, axis=0)) % g
    cells = np.ravel_multi_index(tuple(positions.T), (g,) * n)
    _, first, inverse = np.unique(cells, return_index=True, return_inverse=True)
    if task.fixed_map:
        obs = navigation.fixed_map(task).ravel()[cells]
    else:
        objects = rng.integers(task.n_actions, task.blank_id, size=first.size)
        contents = np.where(rng.random(first.size) < task.p_empty, task.blank_id, objects)
        obs = contents[inverse]
    tokens = np.empty((1, 2 * length), dtype=np.int32)
    tokens[0, 0::2], tokens[0, 1::2] = actions, obs
    targets = np.empty_like(tokens)
    targets[:, :-1], targets[:, -1] = tokens[:, 1:], task.blank_id
    mask = np.zeros_like(tokens, dtype=bool)
    mask[0, 0::2] = first[inverse] != np.arange(length)
    return navigation.Batch(tokens=tokens, targets=targets, mask=mask,
                            positions=positions[None])


def closure_error(model, tokens, layer=0, reduce="max"):
    """How far the path-integrated angles of a closed walk are from closing.

    tokens: a closed walk of L steps (from :func:`closed_walk`; (2L,), (1, 2L) or its Batch)
    whose positions satisfy p_L = p_1. Compares theta at token 1 (o_1, at p_1) with theta at
    the last token (o_L, at p_L): e = |wrap(omega * (sum of Delta over tokens 2 .. 2L-1))|
    per head and block, in radians, in [0, pi]. reduce:
      'slowest' (float): e at the block with the smallest |omega|. It turns the least per unit
        of Delta, so it is the last to wrap: its error cannot hide behind a whole turn, and
        it is not dominated by fast blocks that the attention may leave unused (free to drift).
      'weighted' (float): the mean of e weighted by how much the attention uses each block:
        the spread (std over keys j <= i) of the block's share of the logits, q_i,b . k_j,b
        / sqrt(D), averaged over the walk's action tokens i >= 2 (the queries of recalls; a
        block whose share is the same for every key cannot move the softmax, however much it
        drifts). Needs L >= 2.
      'max', 'mean' (float): over every block, used or not.
      None: the (H, NB) array.
    ~0 for a trained MapWM; rope gives wrap(omega * (2L - 2)) (its slowest block barely turns).
    Raises ValueError for schemes without path-integrated angles."""
    theta = path_angles(model, tokens, layer)
    if theta.shape[0] < 2:
        raise ValueError("a closed walk needs at least one step (2 tokens)")
    err = np.abs(wrap(theta[-1] - theta[1]))
    if reduce is None:
        return err
    if reduce == "max":
        return float(err.max())
    if reduce == "mean":
        return float(err.mean())
    scheme = _scheme(model, layer)
    if reduce == "slowest":
        omega = np.abs(_float64(model, scheme.frequencies))
        return float(err.reshape(-1)[np.argmin(omega.reshape(-1))])
    if reduce == "weighted":
        if "delta" not in scheme.traces:  # path_angles computed fixed angles without a forward
            _forward(model, _tokens(tokens))
        q, k = _rotated_queries_keys(_block(model, layer).mixer)
        t = q.shape[1]
        q, k = (_float64(model, x[0]).reshape(t, *err.shape, 2) for x in (q, k))
        scale = 1.0 / np.sqrt(2 * err.shape[1])
        queries = range(2, t, 2)  # action tokens: where recalls are asked
        if not queries:
            raise ValueError("reduce='weighted' needs a walk of at least 2 steps")
        w = sum(((q[i] * k[:i + 1]).sum(-1) * scale).std(0) for i in queries) / len(queries)
        return float((w * err).sum() / max(w.sum(), 1e-30))
    raise ValueError(f"reduce must be 'slowest', 'weighted', 'max', 'mean' or None, got "
                     f"{reduce!r}")
