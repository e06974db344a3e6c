/* Binding of csrc/ops/conv1d.c and csrc/ops/scan.c: the Mamba / MAMPa block's causal
 * depthwise conv1d and selective scans. */
#include "bind.h"

#define CV(f) offsetof(MfConv1dParams, f)
#define P(f) offsetof(MfScanParams, f)
static const MfSize conv_sizes[] = {{"B", CV(B), "B"}, {"T", CV(T), "T"}, {"E", CV(E), "E"},
                                    {"W", CV(W), "W"}, {0}};
static const MfSize scan_sizes[] = {{"B", P(B), "B"}, {"T", P(T), "T"}, {"E", P(E), "E"},
                                    {"K", P(K), "K"}, {0}};
/* the complex scans name the state floats S = 2K: their sizes give K the value of S, and the
 * check hook halves it */
static const MfSize complex_sizes[] = {{"B", P(B), "B"}, {"T", P(T), "T"}, {"E", P(E), "E"},
                                       {"S", P(K), "K"}, {0}};
static const char *const bbars[] = {"euler", "zoh", NULL};
/* the step's activation: "none" (index 0) or "softplus" (delta_softplus = 1) */
static const char *const delta_activations[] = {"none", "softplus", NULL};

/* the conv's activation: "none" (index 0) or "silu" (silu = 1) */
static const char *const conv_activations[] = {"none", "silu", NULL};
#define CONV_ACTIVATION(pos) {"activation", pos, MF_CHOICE, MF_OPTIONAL | MF_KWONLY, \
                              MF_FIELD(CV, silu), .choices = conv_activations}

static const MfArg conv_forward_args[] = {
    {"x", 1, MF_IN, 0, "B T E", MF_FIELD(CV, x)},
    {"weight", 2, MF_IN, 0, "E W", MF_FIELD(CV, weight)},
    {"bias", 3, MF_IN, 0, "E", MF_FIELD(CV, bias)},
    CONV_ACTIVATION(4),
    {"y", 0, MF_OUT, 0, "B T E", MF_FIELD(CV, y)},
    {0}};
static const MfOp conv_forward = {"causal_conv1d_forward", conv_forward_args, conv_sizes,
                                  sizeof(MfConv1dParams), .run = MF_OP(causal_conv1d_forward),
                                  .scratch = MF_SCRATCH(causal_conv1d_forward_scratch_floats),
                                  MF_SCRATCH_FIELDS(MfConv1dParams)};

static const MfArg conv_backward_args[] = {
    {"dy", 1, MF_IN, 0, "B T E", MF_FIELD(CV, dy)},
    {"x", 2, MF_IN, 0, "B T E", MF_FIELD(CV, x)},
    {"weight", 3, MF_IN, 0, "E W", MF_FIELD(CV, weight)},
    {"dweight", 4, MF_INOUT, 0, "E W", MF_FIELD(CV, dweight)},
    {"dbias", 5, MF_INOUT, 0, "E", MF_FIELD(CV, dbias)},
    {"bias", 6, MF_IN, MF_OPTIONAL | MF_NONE | MF_KWONLY, "E", MF_FIELD(CV, bias)},
    CONV_ACTIVATION(7),
    {"dx", 0, MF_OUT, 0, "B T E", MF_FIELD(CV, dx)},
    {0}};

/* the backward recomputes the convolution for SiLU: the bias then, and only then */
static int conv_backward_check(MfCall *c, void *params) {
    (void)c;
    const MfConv1dParams *p = params;
    if (p->silu && p->bias == NULL) {
        PyErr_SetString(PyExc_ValueError, "bias is required with activation='silu' (the "
                        "backward recomputes the convolution)");
        return -1;
    }
    if (!p->silu && p->bias != NULL) {
        PyErr_SetString(PyExc_ValueError, "bias is read only with activation='silu'");
        return -1;
    }
    return 0;
}

static const MfOp conv_backward = {"causal_conv1d_backward", conv_backward_args, conv_sizes,
                                   sizeof(MfConv1dParams), .run = MF_OP(causal_conv1d_backward),
                                   .scratch = MF_SCRATCH(causal_conv1d_backward_scratch_floats),
                                   MF_SCRATCH_FIELDS(MfConv1dParams),
                                   .check = conv_backward_check};

/* NC = ceil(T / min(chunk, T)): pinned for the forward's new states, checked for the
 * backward's (a chunk longer than T is one chunk: clamped before any arithmetic, as the ops
 * clamp it); the state per channel S = K (real) or 2K (complex) floats at most 256 */
static int scan_check(MfCall *c, void *params, int cx, const char *state_arg) {
    const MfScanParams *p = params;
    const int64_t chunk = p->chunk < p->T ? p->chunk : p->T;
    const int64_t S = cx ? 2 * p->K : p->K, NC = (p->T + chunk - 1) / chunk;
    if (S > 256) {
        PyErr_Format(PyExc_ValueError,
                     "A has K = %lld states: at most %d%s", (long long)p->K, cx ? 128 : 256,
                     cx ? " complex states (2K <= 256 floats)" : "");
        return -1;
    }
    const int64_t have = mf_size(c, "NC");
    if (have < 0) return mf_pin(c, "NC", NC, "chunk");
    if (have != NC) {
        PyErr_Format(PyExc_ValueError,
                     "%s has %lld chunks on axis 1, but T = %lld and chunk = %lld give %lld",
                     state_arg, (long long)have, (long long)p->T, (long long)p->chunk,
                     (long long)NC);
        return -1;
    }
    return 0;
}
static int real_check(MfCall *c, void *p) { return scan_check(c, p, 0, "states"); }
static int complex_check(MfCall *c, void *p) {
    ((MfScanParams *)p)->K /= 2; /* S = 2K, even: A (E, S/2) fixed it */
    return scan_check(c, p, 1, "states");
}
/* the backwards: delta_bias's gradient goes to ddelta_bias, given with it and only then */
static int bias_grad_check(const MfScanParams *p) {
    if ((p->delta_bias == NULL) != (p->ddelta_bias == NULL)) {
        PyErr_SetString(PyExc_ValueError, p->delta_bias ? "ddelta_bias is required with "
                        "delta_bias (its gradient is accumulated there)"
                        : "ddelta_bias is given without delta_bias");
        return -1;
    }
    return 0;
}
static int real_backward_check(MfCall *c, void *p) {
    return bias_grad_check(p) < 0 ? -1 : real_check(c, p);
}
static int complex_backward_check(MfCall *c, void *p) {
    return bias_grad_check(p) < 0 ? -1 : complex_check(c, p);
}

#define CHUNK(pos) {"chunk", pos, MF_INT, MF_OPTIONAL | MF_KWONLY, MF_FIELD(P, chunk), .lo = 1, \
                     .dflt = 256}
#define BBAR(pos) {"bbar", pos, MF_CHOICE, MF_OPTIONAL | MF_KWONLY, MF_FIELD(P, bbar), \
                   .choices = bbars}
/* Mamba's delta_bias and delta_softplus: the step is delta + delta_bias, through softplus */
#define STEP(pos) {"delta_bias", pos, MF_IN, MF_OPTIONAL | MF_NONE | MF_KWONLY, "E", \
                   MF_FIELD(P, delta_bias)}, \
                  {"delta_activation", pos + 1, MF_CHOICE, MF_OPTIONAL | MF_KWONLY, \
                   MF_FIELD(P, delta_softplus), .choices = delta_activations}
#define STEP_GRAD(pos) {"ddelta_bias", pos, MF_INOUT, MF_OPTIONAL | MF_NONE | MF_KWONLY, "E", \
                        MF_FIELD(P, ddelta_bias)}

static const MfArg real_forward_args[] = {
    {"x", 1, MF_IN, 0, "B T E", MF_FIELD(P, x)},
    {"delta", 2, MF_IN, 0, "B T E", MF_FIELD(P, delta)},
    {"A", 3, MF_IN, 0, "E K", MF_FIELD(P, A)},
    {"B", 4, MF_IN, 0, "B T K", MF_FIELD(P, Bm)},
    {"C", 5, MF_IN, 0, "B T K", MF_FIELD(P, Cm)},
    {"D", 6, MF_IN, 0, "E", MF_FIELD(P, D)},
    CHUNK(7),
    BBAR(8),
    STEP(9),
    {"y", 0, MF_OUT, 0, "B T E", MF_FIELD(P, y)},
    {"states", 0, MF_OUT, 0, "B NC E K", MF_FIELD(P, states)},
    {0}};
static const MfOp real_forward = {"selective_scan_forward", real_forward_args, scan_sizes,
                                  sizeof(MfScanParams), .run = MF_OP(selective_scan_forward),
                                  .check = real_check};

static const MfArg real_backward_args[] = {
    {"dy", 1, MF_IN, 0, "B T E", MF_FIELD(P, dy)},
    {"x", 2, MF_IN, 0, "B T E", MF_FIELD(P, x)},
    {"delta", 3, MF_IN, 0, "B T E", MF_FIELD(P, delta)},
    {"A", 4, MF_IN, 0, "E K", MF_FIELD(P, A)},
    {"B", 5, MF_IN, 0, "B T K", MF_FIELD(P, Bm)},
    {"C", 6, MF_IN, 0, "B T K", MF_FIELD(P, Cm)},
    {"D", 7, MF_IN, 0, "E", MF_FIELD(P, D)},
    {"states", 8, MF_IN, 0, "B NC E K", MF_FIELD(P, states_in)},
    {"dA", 9, MF_INOUT, 0, "E K", MF_FIELD(P, dA)},
    {"dD", 10, MF_INOUT, 0, "E", MF_FIELD(P, dD)},
    CHUNK(11),
    BBAR(12),
    STEP(13),
    STEP_GRAD(15),
    {"dx", 0, MF_OUT, 0, "B T E", MF_FIELD(P, dx)},
    {"ddelta", 0, MF_OUT, 0, "B T E", MF_FIELD(P, ddelta)},
    {"dB", 0, MF_OUT, 0, "B T K", MF_FIELD(P, dBm)},
    {"dC", 0, MF_OUT, 0, "B T K", MF_FIELD(P, dCm)},
    {0}};
static const MfOp real_backward = {"selective_scan_backward", real_backward_args, scan_sizes,
                                   sizeof(MfScanParams), .run = MF_OP(selective_scan_backward),
                                   .scratch = MF_SCRATCH(selective_scan_backward_scratch_floats),
                                   MF_SCRATCH_FIELDS(MfScanParams),
                                   .check = real_backward_check};

static const MfArg complex_forward_args[] = {
    {"x", 1, MF_IN, 0, "B T E", MF_FIELD(P, x)},
    {"delta", 2, MF_IN, 0, "B T E", MF_FIELD(P, delta)},
    {"delta_angle", 3, MF_IN, MF_NONE, "B T E", MF_FIELD(P, delta_angle)},
    {"A", 4, MF_IN, 0, "E S/2", MF_FIELD(P, A)},
    {"omega", 5, MF_IN, 0, "E S/2", MF_FIELD(P, omega)},
    {"B", 6, MF_IN, 0, "B T S", MF_FIELD(P, Bm)},
    {"C", 7, MF_IN, 0, "B T S", MF_FIELD(P, Cm)},
    {"D", 8, MF_IN, 0, "E", MF_FIELD(P, D)},
    CHUNK(9),
    BBAR(10),
    STEP(11),
    {"y", 0, MF_OUT, 0, "B T E", MF_FIELD(P, y)},
    {"states", 0, MF_OUT, 0, "B NC E S", MF_FIELD(P, states)},
    {0}};
static const MfOp complex_forward = {"complex_scan_forward", complex_forward_args, complex_sizes,
                                     sizeof(MfScanParams), .run = MF_OP(complex_scan_forward),
                                     .check = complex_check};

static const MfArg complex_backward_args[] = {
    {"dy", 1, MF_IN, 0, "B T E", MF_FIELD(P, dy)},
    {"x", 2, MF_IN, 0, "B T E", MF_FIELD(P, x)},
    {"delta", 3, MF_IN, 0, "B T E", MF_FIELD(P, delta)},
    {"delta_angle", 4, MF_IN, MF_NONE, "B T E", MF_FIELD(P, delta_angle)},
    {"A", 5, MF_IN, 0, "E S/2", MF_FIELD(P, A)},
    {"omega", 6, MF_IN, 0, "E S/2", MF_FIELD(P, omega)},
    {"B", 7, MF_IN, 0, "B T S", MF_FIELD(P, Bm)},
    {"C", 8, MF_IN, 0, "B T S", MF_FIELD(P, Cm)},
    {"D", 9, MF_IN, 0, "E", MF_FIELD(P, D)},
    {"states", 10, MF_IN, 0, "B NC E S", MF_FIELD(P, states_in)},
    {"dA", 11, MF_INOUT, 0, "E S/2", MF_FIELD(P, dA)},
    {"domega", 12, MF_INOUT, 0, "E S/2", MF_FIELD(P, domega)},
    {"dD", 13, MF_INOUT, 0, "E", MF_FIELD(P, dD)},
    CHUNK(14),
    BBAR(15),
    STEP(16),
    STEP_GRAD(18),
    {"dx", 0, MF_OUT, 0, "B T E", MF_FIELD(P, dx)},
    {"ddelta", 0, MF_OUT, 0, "B T E", MF_FIELD(P, ddelta)},
    /* None without delta_angle (ddelta holds its part) */
    {"ddelta_angle", 0, MF_OUT, MF_OPTIONAL, "B T E", MF_FIELD(P, ddelta_angle),
     .when = P(delta_angle), .when_name = "delta_angle"},
    {"dB", 0, MF_OUT, 0, "B T S", MF_FIELD(P, dBm)},
    {"dC", 0, MF_OUT, 0, "B T S", MF_FIELD(P, dCm)},
    {0}};
static const MfOp complex_backward = {"complex_scan_backward", complex_backward_args,
                                      complex_sizes, sizeof(MfScanParams),
                                      .run = MF_OP(complex_scan_backward),
                                      .scratch = MF_SCRATCH(complex_scan_backward_scratch_floats),
                                      MF_SCRATCH_FIELDS(MfScanParams),
                                      .check = complex_backward_check};

MF_DEFINE(causal_conv1d_forward, conv_forward)
MF_DEFINE(causal_conv1d_backward, conv_backward)
MF_DEFINE(selective_scan_forward, real_forward)
MF_DEFINE(selective_scan_backward, real_backward)
MF_DEFINE(complex_scan_forward, complex_forward)
MF_DEFINE(complex_scan_backward, complex_backward)

PyMethodDef mf_scan_methods[] = {
    MF_METHOD(causal_conv1d_forward,
     "causal_conv1d_forward(x, weight, bias, *, activation='none') -> y\n\n"
     "x float32 (B, T, E), weight (E, W), bias (E,) -> y (B, T, E) = bias +\n"
     "sum_{j < W} weight[:, j] x[:, t - W + 1 + j] (zero before t = 0): depthwise, causal;\n"
     "activation 'silu': y = silu of that in the same pass (the Mamba block's conv and SiLU;\n"
     "the bits of silu_forward on the plain output)."),
    MF_METHOD(causal_conv1d_backward,
     "causal_conv1d_backward(dy, x, weight, dweight, dbias, *, bias=None, activation='none')\n"
     "-> dx\n\n"
     "dy, x float32 (B, T, E), weight (E, W) -> dx (B, T, E); dweight (E, W) and dbias (E,)\n"
     "are accumulated in place. activation 'silu': dy is the gradient of the forward's SiLU\n"
     "output; the convolution is recomputed from x and bias (E,), required then only."),
    MF_METHOD(selective_scan_forward,
     "selective_scan_forward(x, delta, A, B, C, D, *, chunk=256, bbar='euler',\n"
     "delta_bias=None, delta_activation='none') -> (y, states)\n\n"
     "Mamba's selective scan (real diagonal A): x, delta float32 (B, T, E), A (E, K),\n"
     "B, C (B, T, K), D (E,) -> y (B, T, E) = sum_k C_t[k] h_t[k] + D x_t with\n"
     "h_t = exp(d_t A) h_{t-1} + d_t x_t phi B_t (phi = 1 for bbar 'euler', (e^z - 1)/z,\n"
     "z = d A, for 'zoh'), and states (B, ceil(T / chunk), E, K): h at each chunk's end.\n"
     "The step d = delta + delta_bias (E,) when given, through softplus with\n"
     "delta_activation 'softplus' (Mamba's delta_bias, delta_softplus; softplus_forward's\n"
     "bits), formed inside the scan."),
    MF_METHOD(selective_scan_backward,
     "selective_scan_backward(dy, x, delta, A, B, C, D, states, dA, dD, *, chunk=256,\n"
     "bbar='euler', delta_bias=None, delta_activation='none', ddelta_bias=None)\n"
     "-> (dx, ddelta, dB, dC)\n\n"
     "The forward's inputs and states (same chunk, bbar and step) -> dx, ddelta (B, T, E),\n"
     "dB, dC (B, T, K); dA (E, K) and dD (E,) are accumulated in place, and with delta_bias\n"
     "its gradient into ddelta_bias (E,) (required then). ddelta is delta's gradient (through\n"
     "the softplus). Each chunk is recomputed from the previous chunk's state."),
    MF_METHOD(complex_scan_forward,
     "complex_scan_forward(x, delta, delta_angle, A, omega, B, C, D, *, chunk=256,\n"
     "bbar='euler', delta_bias=None, delta_activation='none') -> (y, states)\n\n"
     "MAMPa's scan, K complex states (2x2 rotation-scaling blocks) per channel: x, delta,\n"
     "delta_angle float32 (B, T, E), A, omega (E, K), B, C (B, T, 2K) as (re, im) pairs,\n"
     "D (E,) -> y (B, T, E) = sum_k Re(conj(c) h) + D x with z = d A + i delta_angle omega,\n"
     "h_t = e^z h_{t-1} + d x phi(z) (b_re + i b_im), and states (B, NC, E, 2K). The step d\n"
     "as selective_scan_forward's; delta_angle None: the rotation takes the step d too."),
    MF_METHOD(complex_scan_backward,
     "complex_scan_backward(dy, x, delta, delta_angle, A, omega, B, C, D, states, dA, domega,\n"
     "dD, *, chunk=256, bbar='euler', delta_bias=None, delta_activation='none',\n"
     "ddelta_bias=None) -> (dx, ddelta, ddelta_angle, dB, dC)\n\n"
     "The forward's inputs and states -> dx, ddelta, ddelta_angle (B, T, E), dB, dC\n"
     "(B, T, 2K); dA, domega (E, K) and dD (E,) are accumulated in place, delta_bias's\n"
     "gradient into ddelta_bias (E,) (required with it). delta_angle None: ddelta_angle is\n"
     "None and ddelta holds the rotation's part."),
    {NULL, NULL, 0, NULL}};
