/* One decoder layer's decoding step as one native call: aiayn_decoder_layer_step, called through ctypes by
 * aiayn/generate/native_step.py for each layer at each step of a batched decode.
 *
 * The step's work is the same products and attention as aiayn/generate/fast_step.py's Python loop, by the same
 * kernels (kernels.c: aiayn_panel_linear or aiayn_rows_linear as each layer's plan chose, and
 * aiayn_few_query_attention); what this file adds is the glue between them: the norms and residual sums, the
 * cache write, and no Python, no dispatched torch op and no fresh tensor in between (the scratch is the caller's,
 * kept across steps). Threads: OpenMP, as kernels.c. */
#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(_OPENMP)
#include <omp.h>
#endif

#include "kernels.h"

/* A linear layer's product as its plan chose it. kind 1: aiayn_panel_linear, w packed by aiayn_pack_panels;
 * kind 2: aiayn_rows_linear, w = W^T (k, n) with row stride w_sk; kind 3: aiayn_int8_rows_linear, w the int8 weight
 * (n, k) with row stride w_sk and a scale per output in scales. act: 0 none, 1 ReLU, 2 GELU (kernels.c). */
typedef struct {
    int64_t kind;
    const void* w;
    int64_t w_sk;
    const float* bias;
    int64_t n, k, act;
    const float* scales;
} aiayn_product;

/* A residual wiring (aiayn.nn.layers.Residual in eval mode). pre: enter = norm(x), exit = x + y; else enter = x,
 * exit = norm(alpha x + y). norm over the last dimension: 0 identity, 1 LayerNorm(weight or NULL, bias or NULL, eps),
 * 2 RMSNorm(weight, eps) as aiayn.nn.norms.RMSNorm. */
typedef struct {
    int64_t pre;
    float alpha;
    int64_t norm;
    const float* weight;
    const float* bias;
    float eps;
} aiayn_wiring;

/* What one layer is, fixed for a decode. Widths: d model, hq query heads and hkv key/value heads of dh each; the
 * fused projection gives (hq + 2 hkv) dh columns: queries, then keys, then values. gated: 0 the feed-forward
 * network's activation is w_in's own (act), 1 SwiGLU, 2 GeGLU: w_in gives the gate's columns, then the up
 * projection's, and the hidden layer is act(gate) * up. */
typedef struct {
    int64_t d, hq, hkv, dh, cross, gated;
    float self_scale, cross_scale;
    aiayn_product qkv, self_out, cross_q, cross_out, w_in, w_out;
    aiayn_wiring self_res, cross_res, ffn_res;
} aiayn_layer;

/* What changes from step to step. n rows.
 * A decoding step (kv not NULL): kv is this layer's keys at cache position 0 of buffer row 0 (the values at + kv_v),
 * strides kv_st (position), kv_sb (buffer row), kv_sh (head); length: positions cached before this step (the new
 * one is written at position length, buffer row b for batch row b); rows: (positions, n) table of buffer rows (row
 * stride r_ss), or NULL; mask: (n|1, length + 1) 0/1 over the cache, strides m_sb (0 to broadcast) and m_ss, or
 * NULL; cos, sin: RoPE's (n|1, dh) angles of this step's position (row stride rot_sb, 0 to broadcast), applied to the
 * queries and new keys as aiayn.nn.positions.apply_rotary does, or NULL.
 * An encoder's pass (kv NULL; no cache, no RoPE): the n rows are n / length sequences of length tokens, each
 * attending over its own keys; mask (n / length | 1, length).
 * Cross-attention: keys ck and values cv (n / group, hkv, c_len, dh) with strides c_sb, c_sh, c_ss; group
 * consecutive rows share one memory row; c_mask (n / group | 1, c_len) or NULL.
 * scratch: aiayn_decoder_layer_scratch floats, 64-byte aligned. */
typedef struct {
    int64_t n;
    float* kv;
    int64_t kv_st, kv_sb, kv_sh, kv_v, length;
    const int64_t* rows;
    int64_t r_ss;
    const uint8_t* mask;
    int64_t m_sb, m_ss;
    const float* ck;
    const float* cv;
    int64_t c_sb, c_sh, c_ss, c_len, group;
    const uint8_t* c_mask;
    int64_t cm_sb, cm_ss;
    const float* cos;
    const float* sin;
    int64_t rot_sb;
    float* scratch;
    int64_t threads;
} aiayn_step;

static int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

static int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

/* Scratch floats for n rows: the entered input (n d), the fused projection (n (hq + 2 hkv) dh), the attention's
 * result (n hq dh), a sublayer's output (n d), the feed-forward hidden layer (n w_in.n), the panel kernel's packed
 * input (whole register blocks of rows times the widest input); each rounded to 16 floats. */
int64_t aiayn_decoder_layer_scratch(const aiayn_layer* L, int64_t n) {
    const int64_t wq = (L->hq + 2 * L->hkv) * L->dh, kmax = max64(max64(L->d, L->hq * L->dh), L->w_in.n);
    return round_up(n * L->d, 16) + round_up(n * wq, 16) + round_up(n * L->hq * L->dh, 16) + round_up(n * L->d, 16)
           + round_up(n * L->w_in.n, 16) + round_up(round_up(n, aiayn_panel_block_rows()) * kmax, 16);
}

static void product(const aiayn_product* p, const float* x, int64_t x_sm, int64_t m, float* y, int64_t y_sm,
                    float* xpack, int64_t threads) {
    if (p->kind == 1)
        aiayn_panel_linear(x, x_sm, m, p->k, (const float*)p->w, p->n, p->bias, y, y_sm, p->act, xpack, threads);
    else if (p->kind == 3)
        aiayn_int8_rows_linear(x, x_sm, m, p->k, (const int8_t*)p->w, p->w_sk, p->scales, p->n, p->bias, y, y_sm,
                               p->act, threads);
    else
        aiayn_rows_linear(x, x_sm, m, p->k, (const float*)p->w, p->w_sk, p->n, p->bias, y, y_sm, p->act, threads);
}

/* Sum of x[0:d] in 16 lanes (vectorized by the compiler), then across them. */
static float lane_sum(const float* x, int64_t d) {
    float acc[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= d; j += 16)
        for (int l = 0; l < 16; l++) acc[l] += x[j + l];
    float s = 0.0f;
    for (; j < d; j++) s += x[j];
    for (int l = 0; l < 16; l++) s += acc[l];
    return s;
}

/* Sum of (x - mean)^2 over x[0:d], as lane_sum. */
static float lane_sq_dev(const float* x, int64_t d, float mean) {
    float acc[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= d; j += 16)
        for (int l = 0; l < 16; l++) {
            const float c = x[j + l] - mean;
            acc[l] += c * c;
        }
    float s = 0.0f;
    for (; j < d; j++) s += (x[j] - mean) * (x[j] - mean);
    for (int l = 0; l < 16; l++) s += acc[l];
    return s;
}

/* y = LayerNorm(x) of one row of d floats (y may be x): torch's formula, the mean and then the variance (biased)
 * summed in 16 float lanes. */
static void layer_norm_row(const aiayn_wiring* w, const float* x, float* y, int64_t d) {
    const float mean = lane_sum(x, d) / (float)d;
    const float rstd = 1.0f / sqrtf(lane_sq_dev(x, d, mean) / (float)d + w->eps);
    const float* g = w->weight;
    const float* b = w->bias;
    if (g && b)
        for (int64_t j = 0; j < d; j++) y[j] = (x[j] - mean) * rstd * g[j] + b[j];
    else
        for (int64_t j = 0; j < d; j++) {
            const float v = (x[j] - mean) * rstd, scaled = g ? v * g[j] : v;
            y[j] = b ? scaled + b[j] : scaled;
        }
}

/* y = RMSNorm(x) of one row (y may be x): weight * (x / sqrt(mean(x^2) + eps)). */
static void rms_norm_row(const aiayn_wiring* w, const float* x, float* y, int64_t d) {
    float acc[16] = {0};
    int64_t j = 0;
    for (; j + 16 <= d; j += 16)
        for (int l = 0; l < 16; l++) acc[l] += x[j + l] * x[j + l];
    float ss = 0.0f;
    for (; j < d; j++) ss += x[j] * x[j];
    for (int l = 0; l < 16; l++) ss += acc[l];
    const float r = 1.0f / sqrtf(ss / (float)d + w->eps);
    for (j = 0; j < d; j++) y[j] = w->weight[j] * (x[j] * r);
}

static void norm_row(const aiayn_wiring* w, const float* x, float* y, int64_t d) {
    if (w->norm == 2)
        rms_norm_row(w, x, y, d);
    else
        layer_norm_row(w, x, y, d);
}

/* Rows are shared among the threads only when there are enough of them to pay for the team. */
static int64_t row_threads(int64_t n, int64_t d, int64_t threads) { return n * d >= (1 << 15) ? threads : 1; }

/* The wiring's entry: norm(x) into h for pre-norm (returns h), x itself otherwise. */
static const float* enter(const aiayn_wiring* w, const float* x, float* h, int64_t n, int64_t d, int64_t threads) {
    if (!w->pre || !w->norm) return x;
    const int64_t T = row_threads(n, d, threads);
    #pragma omp parallel for num_threads(T) if (T > 1) schedule(static)
    for (int64_t r = 0; r < n; r++) norm_row(w, x + r * d, h + r * d, d);
    return h;
}

/* The wiring's exit, in place on x: x + y (pre-norm), norm(alpha x + y) (post-norm). */
static void leave(const aiayn_wiring* w, float* x, const float* y, int64_t n, int64_t d, int64_t threads) {
    const int64_t T = row_threads(n, d, threads);
    const int post_norm = !w->pre && w->norm;
    const float alpha = w->pre ? 1.0f : w->alpha;
    #pragma omp parallel for num_threads(T) if (T > 1) schedule(static)
    for (int64_t r = 0; r < n; r++) {
        float* xr = x + r * d;
        const float* yr = y + r * d;
        if (alpha == 1.0f)
            for (int64_t j = 0; j < d; j++) xr[j] = xr[j] + yr[j];
        else
            for (int64_t j = 0; j < d; j++) {
                const float ax = alpha * xr[j];
                xr[j] = ax + yr[j];
            }
        if (post_norm) norm_row(w, xr, xr, d);
    }
}

/* RoPE on `heads` heads of dh values at x (in place): x cos + rotate_half(x) sin, rotate_half(x) = (-x2, x1). */
static void rotate(float* x, int64_t heads, int64_t dh, const float* cos, const float* sin) {
    const int64_t half = dh / 2;
    for (int64_t h = 0; h < heads; h++, x += dh)
        for (int64_t j = 0; j < half; j++) {
            const float x1 = x[j], x2 = x[j + half];
            x[j] = x1 * cos[j] - x2 * sin[j];
            x[j + half] = x2 * cos[j + half] + x1 * sin[j + half];
        }
}

/* A gated hidden layer in place: u[r, j] = act(gate) * up for j < f, gate = u[r, j], up = u[r, f + j]; the row
 * stride stays 2 f. act: SiLU (gated 1) or GELU with the exact erf (gated 2), as torch's F.silu and F.gelu. */
static void gate_rows(float* u, int64_t n, int64_t f, int64_t gated, int64_t threads) {
    const int64_t T = n * f >= (1 << 15) ? threads : 1;
    #pragma omp parallel for num_threads(T) if (T > 1) schedule(static)
    for (int64_t r = 0; r < n; r++) {
        float* g = u + r * 2 * f;
        for (int64_t j = 0; j < f; j++) {
            const float z = g[j];
            const float a = gated == 1 ? z / (1.0f + expf(-z)) : 0.5f * z * (1.0f + erff(z * 0.70710678118654752f));
            g[j] = a * g[f + j];
        }
    }
}

/* One decoding step of one layer (or an encoder layer's pass), x (n, d) contiguous, updated in place (see aiayn_step
 * for the rest). */
void aiayn_decoder_layer_step(const aiayn_layer* L, const aiayn_step* s, float* x) {
    const int64_t n = s->n, d = L->d, dh = L->dh, hq = L->hq, hkv = L->hkv, th = s->threads;
    const int64_t wq = (hq + 2 * hkv) * dh, qw = hq * dh;
    float* h = s->scratch;
    float* qkv = h + round_up(n * d, 16);
    float* att = qkv + round_up(n * wq, 16);
    float* y = att + round_up(n * qw, 16);
    float* u = y + round_up(n * d, 16);
    float* xpack = u + round_up(n * L->w_in.n, 16);

    /* self-attention over the cache, the new position written first */
    product(&L->qkv, enter(&L->self_res, x, h, n, d, th), d, n, qkv, wq, xpack, th);
    if (s->cos)  /* the queries and the new keys rotated to this step's position */
        for (int64_t b = 0; b < n; b++) {
            const float* c = s->cos + b * s->rot_sb;
            const float* sn = s->sin + b * s->rot_sb;
            rotate(qkv + b * wq, hq + hkv, dh, c, sn);
        }
    if (s->kv) {  /* a decoding step: the new position into the cache, one query per row over it */
        for (int64_t b = 0; b < n; b++)
            memcpy(s->kv + s->length * s->kv_st + b * s->kv_sb, qkv + b * wq + qw, sizeof(float) * 2 * hkv * dh);
        aiayn_few_query_attention(qkv, wq, dh, 0, s->kv, s->kv + s->kv_v, s->kv_sb, s->kv_sh, s->kv_st, s->rows,
                                  s->r_ss, s->mask, s->m_sb, s->m_ss, att, qw, dh, 0, n, hq, hkv, 1, s->length + 1,
                                  dh, L->self_scale, th);
    } else {  /* an encoder: n / length sequences of length rows, each attending over its own keys */
        const int64_t t = s->length, bs = n / t;
        aiayn_few_query_attention(qkv, t * wq, dh, wq, qkv + qw, qkv + qw + hkv * dh, t * wq, dh, wq, NULL, 0,
                                  s->mask, s->m_sb, s->m_ss, att, t * qw, dh, qw, bs, hq, hkv, t, t, dh,
                                  L->self_scale, th);
    }
    product(&L->self_out, att, qw, n, y, d, xpack, th);
    leave(&L->self_res, x, y, n, d, th);

    if (L->cross) {  /* a memory row's group rows as one block of group queries, as fast_step.py folds them */
        const int64_t g = s->group;
        product(&L->cross_q, enter(&L->cross_res, x, h, n, d, th), d, n, qkv, qw, xpack, th);
        aiayn_few_query_attention(qkv, g * qw, dh, qw, s->ck, s->cv, s->c_sb, s->c_sh, s->c_ss, NULL, 0,
                                  s->c_mask, s->cm_sb, s->cm_ss, att, g * qw, dh, qw, n / g, hq, hkv, g, s->c_len,
                                  dh, L->cross_scale, th);
        product(&L->cross_out, att, qw, n, y, d, xpack, th);
        leave(&L->cross_res, x, y, n, d, th);
    }

    product(&L->w_in, enter(&L->ffn_res, x, h, n, d, th), d, n, u, L->w_in.n, xpack, th);
    if (L->gated) gate_rows(u, n, L->w_in.n / 2, L->gated, th);
    product(&L->w_out, u, L->w_in.n, n, y, d, xpack, th);  /* gated: the first half of each row of u */
    leave(&L->ffn_res, x, y, n, d, th);
}
