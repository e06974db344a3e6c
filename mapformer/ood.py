"""Where a model loses long, sparse (out-of-distribution) sequences: instruments of issue 16.

Three questions, each answered per scored position (a *recall*: a navigation revisit, a
selective-copy answer) and bucketed by the number of keys its softmax sees (its position)
and by the lag back to the key it should retrieve:

- :func:`accuracy_by_position_and_lag`: is the error at long lags or at many keys?
- :func:`attention_mass`: how much weight the softmax puts on the correct key, beside the
  correct key's logit and the log-sum-exp of the wrong keys' logits (a correct logit that
  falls with the lag is drift; a wrong-key log-sum-exp that grows with the number of keys,
  the correct logit staying, is dilution), where the most weighted key lies (the right one, a
  neighbour: :func:`top_key_offsets`) and, for navigation on a larger grid than the
  training one, the weight on cells equal modulo the training grid (:func:`alias_cells`);
- :func:`angle_errors`: the float32 path-integrated angles of the C model against a float64
  recomputation (the same parameters on the NumPy reference backend), on the angle between
  a recall and its key; for navigation also how far the learned integrator is from closing
  (the angle between two visits of a cell, ~0 for a perfect map).

:func:`recalls` says what the correct key of each recall is:

- navigation (tokens a_1, o_1, ..., a_T, o_T): the recall at action position i = 2t (its
  target o_t is the content of cell p_t) should retrieve the observation o_s of the last
  earlier visit s < t of p_t, at token 2s + 1; lag = t - s, in steps. Every earlier
  observation of the cell holds the right answer: they form the recall's *group*.
- selective copy (data and blanks, SEP, answers): the answer column N + k (target: data token
  k) should retrieve data token k at its column p_k; lag = N + k - p_k, in tokens. Its group
  is that key alone.

Shapes: B sequences, T tokens, P recalls, H heads, NB rotation blocks. All math here is
float64 NumPy on the traces the layers keep (see :mod:`mapformer.analysis`). Running any of
these overwrites the activations the model keeps for backward().
"""
from dataclasses import dataclass

import numpy as np

from .analysis import _block, _float64, _path, _rotated_queries_keys, attention_rows, wrap
from .models import ModelConfig, Transformer
from .tasks import navigation, selective_copy


@dataclass
class Recalls:
    """The scored positions of a batch and the key each should retrieve (P recalls).

    sequence, query, key, lag, target: int64 (P,): the recall's sequence b, its token index i
    (a masked position), the correct key's token index j < i, the lag (navigation: steps since
    the cell was last visited; selective copy: i - j tokens), the target token.
    is_object: bool (P,): the target is not blank (every selective-copy target).
    key_group: int64 (B, T): each token's group as a key (-1: never a correct key);
    group: int64 (P,): the recall's group: every key j <= i of that group holds its answer."""

    sequence: np.ndarray
    query: np.ndarray
    key: np.ndarray
    lag: np.ndarray
    target: np.ndarray
    is_object: np.ndarray
    key_group: np.ndarray
    group: np.ndarray


def recalls(batch, task):
    """The :class:`Recalls` of a navigation Batch (task: its NavigationConfig) or a
    selective-copy batch (task: its SelectiveCopyConfig). ValueError for other tasks."""
    mask = np.asarray(batch.mask)
    bsz, t_len = mask.shape
    seq, query = np.nonzero(mask)
    target = np.asarray(batch.targets)[seq, query].astype(np.int64)
    if isinstance(task, navigation.NavigationConfig):
        pos = np.asarray(batch.positions)
        cell = np.ravel_multi_index(tuple(np.moveaxis(pos, -1, 0)), (task.grid_size,) * task.dims)
        key_group = np.full((bsz, t_len), -1, dtype=np.int64)
        key_group[:, 1::2] = cell
        steps = query // 2
        lag = navigation.visit_lags(batch)[seq, steps]
        if (lag == 0).any():
            raise ValueError("a masked position is not a revisit: the batch does not fit task")
        return Recalls(seq, query, 2 * (steps - lag) + 1, lag, target,
                       target != task.blank_id, key_group, cell[seq, steps])
    if isinstance(task, selective_copy.SelectiveCopyConfig):
        positions = np.asarray(batch.positions)
        k = query - task.separator_index
        key = positions[seq, k]
        key_group = np.full((bsz, t_len), -1, dtype=np.int64)
        key_group[np.repeat(np.arange(bsz), positions.shape[1]), positions.ravel()] = np.tile(
            np.arange(positions.shape[1]), bsz)
        return Recalls(seq, query, key, query - key, target, np.ones(seq.size, dtype=bool),
                       key_group, k.astype(np.int64))
    raise ValueError(f"recalls knows navigation and selective copy, not {type(task).__name__}")


def log2_edges(max_value):
    """Bucket edges 1, 2, 4, ..., up to the first power of two above ``max_value``: bucket k
    holds the values v with edges[k] <= v < edges[k + 1]. int64 (K + 1,)."""
    top = max(int(np.ceil(np.log2(max(float(max_value), 1.0) + 1.0))), 1)
    return 2 ** np.arange(top + 1, dtype=np.int64)


def bucket_table(values, columns, edges):
    """Means of ``columns`` in buckets of ``values``.

    values: (P,) numbers; columns: {name: (P,) float (nan: not counted in that column)};
    edges: increasing (K + 1,). Returns a list, one dict per non-empty bucket in order:
    {"lo": edges[k], "hi": edges[k + 1], "n": values in [lo, hi), name: the mean of the
    column's finite entries there (None if none)}."""
    values = np.asarray(values)
    table = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        inside = (values >= lo) & (values < hi)
        if not inside.any():
            continue
        row = {"lo": int(lo), "hi": int(hi), "n": int(inside.sum())}
        for name, column in columns.items():
            part = np.asarray(column, dtype=np.float64)[inside]
            part = part[np.isfinite(part)]
            row[name] = float(part.mean()) if part.size else None
        table.append(row)
    return table


def _module(task):
    return navigation if isinstance(task, navigation.NavigationConfig) else selective_copy


def _run(model, batch, task, keep=True):
    """Forward in evaluation mode (Transformer.evaluating) with the task's coordinates,
    keeping what ``keep`` says (Transformer.forward: True, the layers' traces for the
    analyses here; False, nothing); logits (B, T, V) as NumPy."""
    with model.evaluating():
        model.forward(batch.tokens, _module(task).token_coordinates(batch), keep=keep)
    return model.ops.to_numpy(model.logits).reshape(batch.tokens.shape + (-1,))


def accuracy_by_position_and_lag(model, batches, task, edges=None):
    """Accuracy of the recalls bucketed by position and by lag.

    batches: an iterable of batches of ``task`` (e.g. ``eval_set``). edges: bucket edges
    (default :func:`log2_edges` of the largest value, per table). Returns a dict:
    accuracy, object_accuracy (recalls whose target is not blank; = accuracy for selective
    copy), n (recalls), n_objects; by_position: :func:`bucket_table` over the number of keys
    i + 1 of each recall, with columns accuracy, object_accuracy, objects (the fraction of
    object targets); by_lag: the same over the lag."""
    n_keys, lags, hits, objects = [], [], [], []
    for batch in batches:
        pred = _run(model, batch, task, keep=False).argmax(-1)
        r = recalls(batch, task)
        n_keys.append(r.query + 1)
        lags.append(r.lag)
        hits.append((pred[r.sequence, r.query] == r.target).astype(np.float64))
        objects.append(r.is_object)
    n_keys, lags, hits, objects = (np.concatenate(a) for a in (n_keys, lags, hits, objects))
    columns = {"accuracy": hits, "object_accuracy": np.where(objects, hits, np.nan),
               "objects": objects.astype(np.float64)}
    return {"accuracy": float(hits.mean()), "object_accuracy": float(hits[objects].mean())
            if objects.any() else None, "n": int(hits.size), "n_objects": int(objects.sum()),
            "by_position": bucket_table(n_keys, columns,
                                        log2_edges(n_keys.max()) if edges is None else edges),
            "by_lag": bucket_table(lags, columns,
                                   log2_edges(lags.max()) if edges is None else edges)}


def key_statistics(probs, logits, key, query, group_keys, alias_keys=None):
    """What one sequence's attention rows put on each recall's correct key.

    probs, logits: (H, P, T) rows of the recalls (logits -inf above the diagonal, or None);
    key, query: (P,) token indices of the correct key and of the recall; group_keys: bool
    (P, T): the keys holding the recall's answer (its group), the correct key among them;
    alias_keys: bool (P, T) or None: other keys to total (aliases).
    Returns {name: float64 (P, H)}: mass (weight on the correct key), group_mass (on its
    group), wrong_max (the largest weight on a key outside the group), alias_mass (the weight
    on alias_keys; nan without them); with logits also
    correct_logit, wrong_lse (log-sum-exp of the logits outside the group; -inf when there is
    none) and wrong_max_logit (nan without logits)."""
    p = np.arange(key.size)
    out = {"mass": probs[:, p, key].T, "group_mass": (probs * group_keys).sum(-1).T}
    wrong = ~group_keys & (np.arange(probs.shape[-1]) <= query[:, None])
    out["wrong_max"] = np.where(wrong, probs, 0.0).max(-1).T
    out["alias_mass"] = (np.full((key.size, probs.shape[0]), np.nan) if alias_keys is None
                         else (probs * alias_keys).sum(-1).T)
    if logits is None:
        for name in ("correct_logit", "wrong_lse", "wrong_max_logit"):
            out[name] = np.full((key.size, probs.shape[0]), np.nan)
        return out
    out["correct_logit"] = logits[:, p, key].T
    z = np.where(wrong, logits, -np.inf)
    top = z.max(-1)
    safe = np.where(np.isfinite(top), top, 0.0)
    with np.errstate(divide="ignore"):
        out["wrong_lse"] = (safe + np.log(np.exp(z - safe[..., None]).sum(-1))).T
    out["wrong_max_logit"] = top.T
    return out


def top_key_offsets(r, top, task):
    """How far the key each head weighs most is from the right place.

    r: the :class:`Recalls` of a batch of ``task``; top: int (P, H) the token index of each
    recall's most weighted key per head. Returns float64 (P, H): selective copy: the data
    index of the top key minus the recall's (0: the right token, +-1: a neighbour); navigation:
    the torus distance (L1, in cells) from the top key's cell to the recall's (0: a visit of
    the right cell); nan where the top key is not a data token / an observation."""
    group = r.key_group[r.sequence[:, None], top]  # (P, H)
    out = np.full(top.shape, np.nan)
    valid = group >= 0
    if isinstance(task, navigation.NavigationConfig):
        shape = (task.grid_size,) * task.dims
        a = np.stack(np.unravel_index(np.where(valid, group, 0), shape))  # (n, P, H)
        b = np.stack(np.unravel_index(r.group, shape))[:, :, None]
        d = np.abs(a - b)
        dist = np.minimum(d, task.grid_size - d).sum(0)
        out[valid] = dist[valid]
    else:
        out[valid] = (group - r.group[:, None])[valid]
    return out


def alias_cells(batch, task, grid):
    """Navigation: each token's cell reduced modulo ``grid`` on every axis, as one id, int64
    (B, T) (-1 at action tokens), and each recall's, (P,). On a torus of side ``grid`` (the
    training task's) the cells p and p + grid are one cell: a model trained there may give
    them the same angles, and a test grid larger than ``grid`` then holds aliases."""
    r = recalls(batch, task)
    pos = np.asarray(batch.positions) % grid
    cell = np.ravel_multi_index(tuple(np.moveaxis(pos, -1, 0)), (grid,) * task.dims)
    keys = np.full(r.key_group.shape, -1, dtype=np.int64)
    keys[:, 1::2] = cell
    return keys, cell[r.sequence, r.query // 2]


def attention_mass(model, batch, task, layers=None, alias_grid=None):
    """The attention on each recall's correct key, per layer and head.

    batch: one batch of ``task``; layers: layer indices (default all); alias_grid
    (navigation): the training grid's side: alias_mass is then the weight on observations of
    other cells that are the recall's cell modulo alias_grid (:func:`alias_cells`). Returns
    a dict: n_keys, lag: int64 (P,) of the recalls (in :func:`recalls` order); layers:
    {layer: {name: float64 (P, H)}} with the names of :func:`key_statistics` and top_offset
    (:func:`top_key_offsets` of the most weighted key). Attention and conjunctive mixers (not
    cope)."""
    r = recalls(batch, task)
    aliases = None
    if alias_grid is not None and isinstance(task, navigation.NavigationConfig):
        aliases = alias_cells(batch, task, alias_grid)
    layers = range(len(model.blocks)) if layers is None else layers
    _run(model, batch, task)
    out = {"n_keys": r.query + 1, "lag": r.lag, "layers": {}}
    t_len = batch.tokens.shape[1]
    for layer in layers:
        parts = []
        for b in np.unique(r.sequence):
            sel = r.sequence == b
            probs, logits = attention_rows(model, r.query[sel], layer, int(b), "attention_mass")
            group_keys = (r.key_group[b][None, :] == r.group[sel][:, None])
            group_keys &= np.arange(t_len) <= r.query[sel][:, None]
            alias_keys = None
            if aliases is not None:
                alias_keys = (aliases[0][b][None, :] == aliases[1][sel][:, None])
                alias_keys &= ~group_keys & (r.key_group[b] >= 0)
                alias_keys &= np.arange(t_len) <= r.query[sel][:, None]
            parts.append(key_statistics(probs, logits, r.key[sel], r.query[sel], group_keys,
                                        alias_keys))
            parts[-1]["top"] = probs.argmax(-1).T  # (R, H)
        stats = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
        stats["top_offset"] = top_key_offsets(r, stats.pop("top"), task)
        out["layers"][layer] = stats
    return out


def attention_tables(mass, edges=None):
    """:func:`attention_mass`'s output bucketed: {layer: {"head h" or "best": {"by_keys":
    table, "by_lag": table}}}, tables of :func:`bucket_table` with the columns of
    :func:`key_statistics`, top_offset replaced by top_right (the fraction of recalls whose
    most weighted key is a right one, offset 0), top_near (offset +-1: a neighbour) and
    top_abs_offset (the mean |offset|, over top keys that are data tokens / observations);
    "best" takes, per recall, the head with the most mass on the correct key (heads may split
    the work)."""
    keys_edges = log2_edges(mass["n_keys"].max()) if edges is None else edges
    lag_edges = log2_edges(mass["lag"].max()) if edges is None else edges
    tables = {}
    for layer, stats in mass["layers"].items():
        per = {}
        stats = dict(stats)
        offset = stats.pop("top_offset")
        stats["top_right"] = np.where(np.isnan(offset), 0.0, offset == 0)
        stats["top_near"] = np.where(np.isnan(offset), 0.0, np.abs(offset) == 1)
        stats["top_abs_offset"] = np.abs(offset)
        best = stats["mass"].argmax(1)
        heads = [(f"head {h}", {k: v[:, h] for k, v in stats.items()})
                 for h in range(stats["mass"].shape[1])]
        heads.append(("best", {k: np.take_along_axis(v, best[:, None], 1)[:, 0]
                               for k, v in stats.items()}))
        for label, columns in heads:
            per[label] = {"by_keys": bucket_table(mass["n_keys"], columns, keys_edges),
                          "by_lag": bucket_table(mass["lag"], columns, lag_edges)}
        tables[str(layer)] = per
    return tables


def float64_twin(model):
    """The model's architecture on the NumPy (float64) backend with its parameters: the
    float64 recomputation of everything the C model computes in float32."""
    twin = Transformer(model.config, backend="numpy")
    twin.params.data[:] = model.ops.to_numpy(model.params.data)
    return twin


def with_options(model, **options):
    """A model of the same parameters with options changed (options that declare no
    parameters, e.g. the query-scaling ``attn_scale``, ``attn_log_scale``,
    ``attn_log_clamp``): evaluate a trained model at another temperature."""
    values = model.config.to_dict()
    values["options"] = {**values["options"], **options}
    other = Transformer(ModelConfig.from_dict(values), backend=model.ops)
    if other.params.size != model.params.size:
        raise ValueError(f"options {sorted(options)} change the parameters: not a view of the "
                         "same model")
    other.params.data[:] = model.params.data
    return other


def angle_errors(model, batch, task, layer=0, twin=None):
    """Path-integration angles at the recalls: float32 against float64, and (navigation) how
    far the learned integrator is from closing.

    batch: one batch of ``task``; twin: :func:`float64_twin` of the model (made when None).
    Returns a dict:
      n_keys, lag: int64 (P,) of the recalls;
      model_error: float64 (P, H): max over blocks of |wrap((theta32_i - theta32_j) -
        (Theta64_i - Theta64_j))|, the C model's angle between recall i and its key j (its
        ``theta`` trace) against the float64 model's (omega * cumsum Delta, from the same
        parameters): everything float32 changed, Delta's inputs included;
      op_error: float64 (B, T): max over heads and blocks of |wrap(theta32 - omega *
        cumsum(Delta32))| (cumsum in float64 of the C model's own Delta): the path-integration
        op's own rounding;
      closure_slowest, closure_mean, closure_weighted: float64 (P, H): |wrap(Theta64_i -
        Theta64_j)| at the block of smallest |omega| of each head, its mean over blocks, and
        its mean weighted by how much each block can move the logit of this query and key,
        |q_i,b| |k_j,b| (the rotated queries and keys the softmax compared: a block whose
        share is ~0 may drift freely); navigation only: recall and key are at the same cell,
        so a perfect integrator gives 0; nan for selective copy, whose key is at another
        place.
    ValueError for a layer without path integration (Delta)."""
    r = recalls(batch, task)
    scheme = _path(model, layer, "angle_errors")
    twin = float64_twin(model) if twin is None else twin
    _run(model, batch, task)
    q, k = (_float64(model, x) for x in _rotated_queries_keys(_block(model, layer).mixer))
    theta32 = _float64(model, scheme.theta)
    delta32 = _float64(model, scheme.delta)
    omega = _float64(model, scheme.frequencies)
    op_error = np.abs(wrap(theta32 - omega * np.cumsum(delta32, axis=1))).max((2, 3))
    _run(twin, batch, task)
    tw = _path(twin, layer, "angle_errors")
    theta64 = np.cumsum(_float64(twin, tw.delta), axis=1) * _float64(twin, tw.frequencies)
    i, j, b = r.query, r.key, r.sequence
    rel32, rel64 = theta32[b, i] - theta32[b, j], theta64[b, i] - theta64[b, j]  # (P, H, NB)
    out = {"n_keys": i + 1, "lag": r.lag, "op_error": op_error,
           "model_error": np.abs(wrap(rel32 - rel64)).max(-1)}
    if isinstance(task, navigation.NavigationConfig):
        closure = np.abs(wrap(rel64))
        slowest = np.abs(omega).argmin(-1)  # (H,)
        out["closure_slowest"] = closure[:, np.arange(omega.shape[0]), slowest]
        out["closure_mean"] = closure.mean(-1)
        pairs = q.shape[:3] + (q.shape[3] // 2, 2)
        norm_q = np.sqrt((q.reshape(pairs) ** 2).sum(-1))[b, i]  # (P, H, NB)
        norm_k = np.sqrt((k.reshape(pairs) ** 2).sum(-1))[b, j]
        w = norm_q * norm_k
        out["closure_weighted"] = (w * closure).sum(-1) / np.maximum(w.sum(-1), 1e-30)
    else:
        for name in ("closure_slowest", "closure_mean", "closure_weighted"):
            out[name] = np.full(out["model_error"].shape, np.nan)
    return out


def angle_tables(angles, edges=None):
    """:func:`angle_errors`' output bucketed by lag: {"head h": table} with columns
    model_error, closure_slowest, closure_mean, closure_weighted (means; the max of
    model_error as
    model_error_max), and "op_by_position": the op's error bucketed by token position + 1
    (column op_error, its mean, and op_error_max)."""
    lag_edges = log2_edges(angles["lag"].max()) if edges is None else edges
    tables = {}
    for h in range(angles["model_error"].shape[1]):
        cols = {k: angles[k][:, h] for k in ("model_error", "closure_slowest", "closure_mean",
                                             "closure_weighted")}
        table = bucket_table(angles["lag"], cols, lag_edges)
        for row in table:
            inside = (angles["lag"] >= row["lo"]) & (angles["lag"] < row["hi"])
            row["model_error_max"] = float(angles["model_error"][inside, h].max())
        tables[f"head {h}"] = table
    op = angles["op_error"]
    position = np.broadcast_to(np.arange(1, op.shape[1] + 1), op.shape).ravel()
    pos_edges = log2_edges(op.shape[1]) if edges is None else edges
    table = bucket_table(position, {"op_error": op.ravel()}, pos_edges)
    for row in table:
        inside = (position >= row["lo"]) & (position < row["hi"])
        row["op_error_max"] = float(op.ravel()[inside].max())
    tables["op_by_position"] = table
    return tables
