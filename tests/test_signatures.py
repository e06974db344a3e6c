"""The binding's tables as the one signature of every op (mapformer._C.signatures(), read by
mapformer.signatures): what they export, that the docstrings and references agree with them,
and the NumPy backend's generic adapter built from them."""
import ast
import re

import numpy as np
import pytest

from mapformer import _C, backend
from mapformer import reference as ref
from mapformer.signatures import numpy_op, signature, signatures

OPS = sorted(signatures())


def test_every_op_has_a_signature_with_its_rows():
    raw = _C.signatures()
    assert sorted(raw) == OPS and len(OPS) >= 60
    sig = signature("sln_backward")
    assert [a.name for a in sig.parameters] == ["dp", "delta", "gen", "start", "dgen",
                                                "dstart", "clamp"]
    assert sig.updated == ("dgen", "dstart") and sig.returned == ("ddelta",)
    clamp = sig.arg("clamp")
    assert (clamp.kind, clamp.default, clamp.low, clamp.high, clamp.low_open) == \
        ("float", 10.0, 0.0, 80.0, True)
    assert sig.arg("delta").letters == ("B", "T", "H", "NB")
    assert sig.sizes == {"B": "B", "T": "T", "H": "H", "D": "D", "NB": "NB", "F": "F"}


def test_rows_name_their_params_fields_and_flags():
    scan = signature("complex_scan_backward")
    assert scan.arg("dB").field == "dBm"  # the arg's name and its field differ
    assert scan.arg("ddelta_angle").when == "delta_angle"
    assert scan.sizes["S"] == "K"
    assert scan.arg("chunk").kind == "int" and scan.arg("chunk").low == 1
    assert scan.arg("bbar").choices == ("euler", "zoh") and scan.arg("bbar").kwonly
    linear = signature("linear_backward")
    assert linear.arg("dx").kind == "out_or_into" and linear.arg("dx").given == "accumulate_dx"
    assert signature("embedding_forward").arg("tokens").dtype == "int32"
    assert signature("attention_forward").arg("scale").accepts_none
    assert signature("attention_forward").index_arg == "pos_ids or prefix"
    assert signature("sln_forward").index_arg is None
    for sig in signatures().values():
        for a in sig.args:
            assert a.field, f"{sig.name}.{a.name} names no params field"
            assert (a.shape is not None) == a.is_array, f"{sig.name}.{a.name}"


def test_an_unknown_op_is_refused_by_name():
    with pytest.raises(ValueError, match="no op 'foo_forward'"):
        signature("foo_forward")
    with pytest.raises(KeyError, match="sln_forward has no argument 'q'"):
        signature("sln_forward").arg("q")


def _doc_call(op):
    """The call a docstring's first paragraph writes: (parameters, returned) as text."""
    head = " ".join(getattr(_C, op).__doc__.split("\n\n")[0].split())
    match = re.fullmatch(rf"{op}\((.*)\) -> (.+)", head)
    assert match, f"{op}'s docstring does not start with its call: {head!r}"
    return [p.strip() for p in match.group(1).split(",")], match.group(2)


@pytest.mark.parametrize("op", OPS)
def test_docstring_states_the_tables_call(op):
    """The docstring's first lines are the table's call: the same parameters in order, the
    same defaults (numbers equal, '<...>' a described default) and the same returns."""
    params, returned = _doc_call(op)
    sig = signature(op)
    want = sig.text()[len(op) + 1:].split(") -> ")
    want_params = [p.strip() for p in want[0].split(",")]
    assert [p.split("=")[0] for p in params] == [p.split("=")[0] for p in want_params]
    for got, table in zip(params, want_params):
        if "=" in table and not got.split("=")[1].startswith("<"):
            value = ast.literal_eval(got.split("=")[1])
            assert value == ast.literal_eval(table.split("=")[1]), f"{op}: {got} vs {table}"
    results = [a for a in sig.args if a.kind == "result"]
    if results and len(sig.returned) == 1:  # a float the op writes
        assert returned == "float", op
    else:
        assert returned == want[1], op


def test_references_name_what_the_table_returns():
    named = [op for op in OPS if hasattr(getattr(ref, op), "returns")]
    assert len(named) >= 15
    for op in named:
        sig = signature(op)
        assert set(sig.updated + sig.returned) <= set(ref.__dict__[op].returns), op


def test_numpy_op_accumulates_updated_and_given_arrays():
    rng = np.random.default_rng(0)
    B, T, H, D = 2, 3, 2, 8
    dp, delta = rng.standard_normal((B, T, H, D)), rng.standard_normal((B, T, H, D // 2))
    gen, start = rng.standard_normal((H, D // 2, 4)), rng.standard_normal((H, D))
    dgen, dstart = np.ones((H, D // 2, 4)), np.ones((H, D))
    ddelta = backend.NUMPY.sln_backward(dp, delta, gen, start, dgen, dstart, clamp=5.0)
    want_delta, want_gen, want_start = ref.sln_backward(dp, delta, gen, start, 5.0)
    np.testing.assert_array_equal(ddelta, want_delta)
    np.testing.assert_array_equal(dgen, 1.0 + want_gen)
    np.testing.assert_array_equal(dstart, 1.0 + want_start)
    # an out_or_into row given an array: accumulated into and returned
    N, C = 4, 5
    dy, x, mean_x = rng.standard_normal((N, C)), rng.standard_normal((N, C)), None
    w = rng.standard_normal(C)
    _, mean_x, rstd = ref.layernorm_forward(x, w, np.zeros(C))
    dx, dw, db = np.full((N, C), 2.0), np.zeros(C), np.zeros(C)
    got = backend.NUMPY.layernorm_backward(dy, x, mean_x, rstd, w, dw, db, dx=dx)
    want = ref.layernorm_backward(dy, x, mean_x, rstd, w)
    assert got is dx
    np.testing.assert_allclose(dx, 2.0 + want[0], rtol=1e-12)
    np.testing.assert_allclose(dw, want[1], rtol=1e-12)


def test_numpy_op_binds_as_the_c_op():
    op = backend.NUMPY.sln_forward
    with pytest.raises(TypeError, match="missing required argument 'start'"):
        op(np.zeros((1, 1, 1, 4)), np.zeros((1, 4, 4)))
    with pytest.raises(TypeError, match="unexpected keyword argument 'clip'"):
        op(np.zeros((1, 1, 1, 4)), np.zeros((1, 4, 4)), np.zeros((1, 8)), clip=1.0)
    with pytest.raises(TypeError, match="at most 4 positional"):
        op(1, 2, 3, 4, 5)
    with pytest.raises(TypeError, match="does not name its returns"):
        numpy_op("sln_forward", lambda delta, gen, start: None)
    with pytest.raises(TypeError, match="lacking"):
        numpy_op("sln_backward", ref.returns("ddelta")(lambda dp: dp))
    assert op.__doc__.startswith(signature("sln_forward").text())
