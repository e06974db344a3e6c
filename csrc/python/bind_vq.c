/* Binding of csrc/ops/vq.c. */
#include "bind.h"

#define P(f) offsetof(MfVqParams, f)
static const MfSize sizes[] = {{"N", P(N), "N"}, {"M", P(M), "M"}, {"K", P(K), "K"},
                               {"D", P(D), "D"}, {0}};

static const MfArg forward_args[] = {
    {"z", 1, MF_IN, 0, "N M D", MF_FIELD(P, z)},
    {"codebook", 2, MF_IN, 0, "M K D", MF_FIELD(P, codebook)},
    {"codes", 0, MF_OUT, 0, "N M D", MF_FIELD(P, codes)},
    {"indices", 0, MF_OUT, 0, "N M", MF_FIELD(P, indices), .dtype = MF_I32},
    {"dist", 0, MF_OUT, 0, "N M", MF_FIELD(P, dist)},
    {"total", 0, MF_RESULT, MF_FIELD(P, total)},
    {0}};

/* K must fit an int32 index */
static int check_forward(MfCall *c, void *params) {
    const MfVqParams *p = params;
    (void)c;
    if (p->K > INT32_MAX) {
        PyErr_Format(PyExc_ValueError, "codebook has %lld codes, more than an int32 index holds",
                     (long long)p->K);
        return -1;
    }
    return 0;
}
static const MfOp forward = {"vq_forward", forward_args, sizes, sizeof(MfVqParams),
                             .run = MF_OP(vq_forward), .check = check_forward,
                             .scratch = MF_SCRATCH(vq_forward_scratch_floats),
                             MF_SCRATCH_FIELDS(MfVqParams)};

/* every index in [0, K), checked here for the message; the kernel checks each again as it
 * reads it (MF_EINDEX, raised naming indices) */
static int check_backward(MfCall *c, void *params) {
    const MfVqParams *p = params;
    (void)c;
    return mf_check_ids(p->indices_in, p->N * p->M, p->K, "indices");
}

static const MfArg backward_args[] = {
    {"dcodes", 1, MF_IN, 0, "N M D", MF_FIELD(P, dcodes)},
    {"z", 2, MF_IN, 0, "N M D", MF_FIELD(P, z)},
    {"codebook", 3, MF_IN, 0, "M K D", MF_FIELD(P, codebook)},
    {"indices", 4, MF_IN, 0, "N M", MF_FIELD(P, indices_in), .dtype = MF_I32},
    {"dcodebook", 5, MF_INOUT, 0, "M K D", MF_FIELD(P, dcodebook)},
    {"codebook_weight", 6, MF_FLOAT, 0, MF_FIELD(P, codebook_weight), .lo = 0,
     .hi = INFINITY, .open = MF_HI_OPEN},
    {"commitment_weight", 7, MF_FLOAT, 0, MF_FIELD(P, commitment_weight), .lo = 0,
     .hi = INFINITY, .open = MF_HI_OPEN},
    {"dz", 0, MF_OUT, 0, "N M D", MF_FIELD(P, dz)},
    {0}};
static const MfOp backward = {"vq_backward", backward_args, sizes, sizeof(MfVqParams),
                              .run = MF_OP(vq_backward), .check = check_backward,
                              .index_arg = "indices",
                              .scratch = MF_SCRATCH(vq_backward_scratch_floats),
                              MF_SCRATCH_FIELDS(MfVqParams)};

MF_DEFINE(vq_forward, forward)
MF_DEFINE(vq_backward, backward)

PyMethodDef mf_vq_methods[] = {
    MF_METHOD(vq_forward,
     "vq_forward(z, codebook) -> (codes, indices, dist, total)\n\n"
     "z float32 (N, M, D), codebook float32 (M, K, D): M codebooks of K codes.\n"
     "indices int32 (N, M) = argmin_k ||z[n, m] - codebook[m, k]||^2 (lowest k on ties, from\n"
     "one product z codebook^T per codebook), codes float32 (N, M, D) = the chosen codes,\n"
     "dist float32 (N, M) = ||z - codes||^2 recomputed in double, total = dist's sum."),
    MF_METHOD(vq_backward,
     "vq_backward(dcodes, z, codebook, indices, dcodebook, codebook_weight,\n"
     "            commitment_weight) -> dz\n\n"
     "Gradients of L(codes) + codebook_weight sum ||codes - sg(z)||^2\n"
     "+ commitment_weight sum ||sg(codes) - z||^2, codes straight through to z:\n"
     "dz float32 (N, M, D) = dcodes + 2 commitment_weight (z - codes) (new);\n"
     "dcodebook float32 (M, K, D) += 2 codebook_weight sum over the rows of each code of\n"
     "(code - z), in place (the same bits for any thread count)."),
    {NULL, NULL, 0, NULL}};
