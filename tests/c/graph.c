/* The graph API from C: `graph [MODEL]`. An MLP learns two concentric rings (cross-entropy
 * below 0.05 within 400 AdamW steps); a forward graph checks reshape, permute, concat,
 * softmax, RMS norm and reductions against values computed here; with MODEL, a model's
 * embedding rows are gathered; misuse is an error. Prints "N passed, 0 failed". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"


enum { F32 = 0, I32 = 26, N = 64, H = 16 };

static uint64_t rng = 12345;
static float uniform(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((rng >> 40) / (double)(1ull << 24));
}

static void mlp(void) {
    TnnGraph *g = NULL;
    OK(tnn_graph_new(&g));
    int64_t x_ne[2] = {2, N}, y_ne[1] = {N}, w1_ne[2] = {2, H}, b1_ne[1] = {H}, w2_ne[2] = {H, 2}, b2_ne[1] = {2};
    TnnTensor x, y, w1, b1, w2, b2, h, a, logits, loss;
    OK(tnn_graph_input(g, "x", F32, x_ne, 2, &x));
    OK(tnn_graph_input(g, "y", I32, y_ne, 1, &y));
    OK(tnn_graph_param(g, "w1", w1_ne, 2, &w1));
    OK(tnn_graph_param(g, "b1", b1_ne, 1, &b1));
    OK(tnn_graph_param(g, "w2", w2_ne, 2, &w2));
    OK(tnn_graph_param(g, "b2", b2_ne, 1, &b2));
    OK(tnn_op_mul_mat(g, w1, x, &h));      /* [H, N] */
    OK(tnn_op_binary(g, 0, h, b1, &h));
    OK(tnn_op_unary(g, 3, h, &a));         /* tanh */
    OK(tnn_op_mul_mat(g, w2, a, &logits)); /* [2, N] */
    OK(tnn_op_binary(g, 0, logits, b2, &logits));
    OK(tnn_op_cross_entropy(g, logits, y, &loss));
    OK(tnn_graph_output(g, loss));
    EXPECT(tnn_op_unary(g, 99, h, &a) == TNN_ERR_INVALID, "unary 99");
    EXPECT(tnn_op_mul_mat(g, w1, y, &a) == TNN_ERR_INVALID, "mul_mat of an I32 input");
    TnnTensor params[4] = {w1, b1, w2, b2}, grads[4];
    OK(tnn_graph_backward(g, loss, params, 4, grads));
    OK(tnn_graph_optimizer(g, 0, params, grads, 4));
    OK(tnn_graph_set_optimizer(g, 0.05f, 0.9f, 0.999f, 1e-8f, 0.0f, 0.9f));
    EXPECT(tnn_graph_set_optimizer(g, 0.05f, 1.5f, 0.999f, 1e-8f, 0.0f, 0.9f) == TNN_ERR_INVALID, "beta1 1.5");
    EXPECT(tnn_tensor_write(g, x, NULL, 0) == TNN_ERR_INVALID, "write before compile");
    OK(tnn_graph_compile(g, 2));
    TnnTensor late;
    EXPECT(tnn_op_scale(g, x, 2.0f, &late) == TNN_ERR_INVALID, "building after compile");

    /* Two rings: radius 0.5 (class 0) and 1.5 (class 1). */
    float xs[2 * N];
    int32_t ys[N];
    for (int i = 0; i < N; i++) {
        float angle = 6.2831853f * (float)i / N, r = (i % 2) ? 1.5f : 0.5f;
        xs[2 * i] = r * cosf(angle);
        xs[2 * i + 1] = r * sinf(angle);
        ys[i] = i % 2;
    }
    OK(tnn_tensor_write(g, x, (const uint8_t *)xs, sizeof xs));
    OK(tnn_tensor_write(g, y, (const uint8_t *)ys, sizeof ys));
    EXPECT(tnn_tensor_write(g, x, (const uint8_t *)xs, 8) == TNN_ERR_INVALID, "a short write");
    float w1v[2 * H], w2v[2 * H];
    for (int i = 0; i < 2 * H; i++) {
        w1v[i] = uniform() * 2 - 1;
        w2v[i] = (uniform() * 2 - 1) * 0.5f;
    }
    OK(tnn_tensor_write(g, w1, (const uint8_t *)w1v, sizeof w1v));
    OK(tnn_tensor_write(g, w2, (const uint8_t *)w2v, sizeof w2v));
    float first = 0, l = 0;
    size_t n = 0;
    int step;
    for (step = 1; step <= 400; step++) {
        OK(tnn_graph_compute(g));
        OK(tnn_tensor_read(g, loss, &l, 1, &n));
        if (step == 1) first = l;
        if (l < 0.05f) break;
    }
    EXPECT(l < 0.05f && l < first, "loss %g -> %g after %d steps", first, l, step);
    float gw[2 * H];
    OK(tnn_tensor_read(g, grads[0], gw, 2 * H, &n));
    EXPECT(n == 2 * H, "gradient of w1 has %zu values", n);
    int64_t ne[4];
    uint32_t ty = 99;
    OK(tnn_tensor_shape(g, logits, ne, &ty));
    EXPECT(ne[0] == 2 && ne[1] == N && ty == F32, "logits [%lld, %lld] type %u", (long long)ne[0], (long long)ne[1], ty);
    OK(tnn_graph_free(g));
    EXPECT(tnn_graph_compute(g) == TNN_ERR_HANDLE, "a freed graph");
}

static void forward_ops(void) {
    TnnGraph *g = NULL;
    OK(tnn_graph_new(&g));
    int64_t ne[2] = {3, 2};
    TnnTensor a, r, p, c, s, norm, sum, mean, rows;
    OK(tnn_graph_input(g, "a", F32, ne, 2, &a));
    int64_t flat[1] = {6};
    OK(tnn_op_reshape(g, a, flat, 1, &r));
    uint32_t axes[4] = {1, 0, 2, 3};
    OK(tnn_op_permute(g, a, axes, &p));
    OK(tnn_op_cont(g, p, &p));              /* [2, 3] */
    OK(tnn_op_concat(g, a, a, 1, &c));      /* [3, 4] */
    OK(tnn_op_softmax(g, a, TNN_NONE, 1.0f, &s));
    OK(tnn_op_rms_norm(g, a, 0.0f, &norm));
    OK(tnn_op_reduce(g, 0, a, &sum));
    OK(tnn_op_reduce(g, 1, a, &mean));
    OK(tnn_op_reduce(g, 2, a, &rows));
    TnnTensor outs[] = {r, p, c, s, norm, sum, mean, rows};
    for (size_t i = 0; i < sizeof outs / sizeof outs[0]; i++) OK(tnn_graph_output(g, outs[i]));
    OK(tnn_graph_compile(g, 1));
    float v[6] = {1, 2, 3, 4, 5, 6}, o[12];
    size_t n = 0;
    OK(tnn_tensor_write(g, a, (const uint8_t *)v, sizeof v));
    OK(tnn_graph_compute(g));
    OK(tnn_tensor_read(g, p, o, 12, &n));
    EXPECT(n == 6 && o[0] == 1 && o[1] == 4 && o[2] == 2 && o[5] == 6, "transpose %g %g %g", o[0], o[1], o[2]);
    OK(tnn_tensor_read(g, c, o, 12, &n));
    EXPECT(n == 12 && o[6] == 1 && o[11] == 6, "concat");
    OK(tnn_tensor_read(g, s, o, 12, &n));
    double e = exp(0) + exp(1) + exp(2);
    EXPECT(fabs(o[0] - exp(0) / e) < 1e-6 && fabs(o[5] - exp(2) / e) < 1e-6, "softmax %g", o[0]);
    OK(tnn_tensor_read(g, norm, o, 12, &n));
    double rms = sqrt((1 + 4 + 9) / 3.0);
    EXPECT(fabs(o[2] - 3 / rms) < 1e-5, "rms norm %g vs %g", o[2], 3 / rms);
    OK(tnn_tensor_read(g, sum, o, 12, &n));
    EXPECT(n == 1 && o[0] == 21, "sum %g", o[0]);
    OK(tnn_tensor_read(g, mean, o, 12, &n));
    EXPECT(n == 2 && fabs(o[0] - 2) < 1e-6 && fabs(o[1] - 5) < 1e-6, "row means %g %g", o[0], o[1]);
    OK(tnn_tensor_read(g, rows, o, 12, &n));
    EXPECT(n == 2 && o[0] == 6 && o[1] == 15, "row sums %g %g", o[0], o[1]);
    EXPECT(tnn_tensor_read(g, rows, o, 1, &n) == TNN_ERR_BUFFER_TOO_SMALL && n == 2, "small buffer");
    OK(tnn_graph_free(g));
}

/* A quantized input from host bytes: a Q8_0 matrix (2 rows of one 32-value block: an f16
 * scale, then 32 int8) times an f32 vector equals the dot products computed here. */
static void quantized_input(void) {
    TnnGraph *g = NULL;
    OK(tnn_graph_new(&g));
    int64_t w_ne[2] = {32, 2}, x_ne[1] = {32};
    TnnTensor w, x, y;
    OK(tnn_graph_input(g, "w", 8 /* Q8_0 */, w_ne, 2, &w));
    OK(tnn_graph_input(g, "x", F32, x_ne, 1, &x));
    OK(tnn_op_mul_mat(g, w, x, &y));
    OK(tnn_graph_output(g, y));
    EXPECT(tnn_graph_input(g, "bad", 4242, x_ne, 1, &y) == TNN_ERR_INVALID, "unknown type");
    OK(tnn_graph_compile(g, 1));
    uint8_t blocks[2][34];
    float xv[32], want[2] = {0, 0};
    for (int r = 0; r < 2; r++) {
        blocks[r][0] = 0x00;
        blocks[r][1] = r == 0 ? 0x3C : 0x38; /* f16 1.0 and 0.5 */
        for (int i = 0; i < 32; i++) {
            int8_t q = (int8_t)((i * (r + 3)) % 17 - 8);
            blocks[r][2 + i] = (uint8_t)q;
        }
    }
    for (int i = 0; i < 32; i++) {
        xv[i] = (float)(i % 5) - 2.0f;
        for (int r = 0; r < 2; r++) want[r] += (r == 0 ? 1.0f : 0.5f) * (float)(int8_t)blocks[r][2 + i] * xv[i];
    }
    OK(tnn_tensor_write(g, w, &blocks[0][0], sizeof blocks));
    OK(tnn_tensor_write(g, x, (const uint8_t *)xv, sizeof xv));
    OK(tnn_graph_compute(g));
    float got[2];
    size_t n = 0;
    OK(tnn_tensor_read(g, y, got, 2, &n));
    /* The product rounds x to Q8 as ggml does: close, not exact. */
    EXPECT(n == 2 && fabsf(got[0] - want[0]) < 0.05f * (fabsf(want[0]) + 1) &&
               fabsf(got[1] - want[1]) < 0.05f * (fabsf(want[1]) + 1),
           "Q8_0 product %g %g vs %g %g", got[0], got[1], want[0], want[1]);
    OK(tnn_graph_free(g));
}

static void model_rows(const char *path) {
    TnnModel *m = NULL;
    OK(tnn_model_open(path, &m));
    TnnGraph *g = NULL;
    OK(tnn_graph_new(&g));
    TnnTensor table, ids, rows;
    OK(tnn_graph_model_tensor(g, m, "token_embd.weight", &table));
    EXPECT(tnn_graph_model_tensor(g, m, "no.such.tensor", &rows) == TNN_ERR_INVALID, "missing tensor");
    int64_t ne[1] = {3};
    OK(tnn_graph_input(g, "ids", I32, ne, 1, &ids));
    OK(tnn_op_get_rows(g, table, ids, &rows));
    OK(tnn_graph_output(g, rows));
    OK(tnn_model_free(m)); /* the graph keeps the model */
    OK(tnn_graph_compile(g, 1));
    int32_t v[3] = {1, 100, 1};
    OK(tnn_tensor_write(g, ids, (const uint8_t *)v, sizeof v));
    OK(tnn_graph_compute(g));
    int64_t shape[4];
    OK(tnn_tensor_shape(g, rows, shape, NULL));
    static float o[3 * 8192];
    size_t n = 0;
    OK(tnn_tensor_read(g, rows, o, 3 * 8192, &n));
    size_t d = (size_t)shape[0];
    int same = memcmp(o, o + 2 * d, d * sizeof(float)) == 0, differ = memcmp(o, o + d, d * sizeof(float)) != 0;
    EXPECT(n == 3 * d && same && differ && isfinite(o[0]), "rows of %zu values", d);
    OK(tnn_graph_free(g));
}

int main(int argc, char **argv) {
    mlp();
    forward_ops();
    quantized_input();
    if (argc > 1) model_rows(argv[1]);
    printf("%d passed, %d failed\n", passed, failed);
    return failed == 0 ? 0 : 1;
}
