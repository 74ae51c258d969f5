/* aiayn's native CPU kernels for decoding (fp32), called through ctypes by aiayn/accel/cpu/native/__init__.py.
 *
 * Each kernel has a plain-PyTorch reference next to its Python wrapper, and tests hold the two equal. They exist
 * where PyTorch's own kernels read the same memory several times or cost more in dispatch than in arithmetic:
 *   aiayn_row_top             a row's log-sum-exp and its n best entries in two passes over the row;
 *   aiayn_softmax_lse         rows' softmax in place and their log-sum-exp (training's fused loss);
 *   aiayn_few_query_attention one decoding step's attention (self- or cross-), vectorized, optionally through
 *                             a table of cache rows (beam search's reordering without copying the cache);
 *   aiayn_rows_linear         a linear layer for a few rows (a decoding step's), streaming the weight once;
 *   aiayn_panel_linear        a linear layer for many rows (batched beam search's), from a weight packed in panels;
 *   aiayn_int8_screen         a few rows times an int8 copy of an output layer with row scales (greedy's screen);
 *   aiayn_int8_rows_linear    a linear layer with an int8 weight (a scale per output) for a few fp32 rows;
 * Threads: OpenMP, the same runtime as torch's (the library is linked against the libgomp torch loaded).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#if defined(__AVX__)
#include <immintrin.h>
#endif
#if defined(_OPENMP)
#include <omp.h>
#define THREAD_INDEX() omp_get_thread_num()  /* inside a parallel region: this thread's index, the team's size */
#define THREAD_COUNT() omp_get_num_threads()
#else
#define THREAD_INDEX() 0
#define THREAD_COUNT() 1
#endif

/* exp(x) for x <= 0 (0 for x < -87.3 and for -inf), to about 2 ulp, in plain arithmetic (exp_nonpos_v below is the
 * same in vector lanes, since GCC leaves loops over this scalar with AVX2):
 * exp(x) = 2^k exp(r), k = round(x / ln 2), r = x - k ln 2 in [-ln2/2, ln2/2], exp(r) by a degree-6 polynomial. */
static inline float exp_nonpos(float x) {
    x = x < -87.3f ? -87.3f : x;
    float kf = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f;  /* round to nearest: 1.5 * 2^23 trick */
    float r = x - kf * 0.693145751953125f;  /* ln 2 in two parts, so that r is exact */
    r = r - kf * 1.42860682030941723212e-6f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t bits = ((int32_t)kf + 127) << 23;  /* 2^k, k in [-126, 0] */
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    float y = p * scale;
    return x <= -87.3f ? 0.0f : y;
}

/* Vectors of VW floats in the compiler's vector extension (one AVX-512 register, or one AVX2 register elsewhere);
 * unaligned loads and stores through vf pointers. */
#if defined(__AVX512F__)
#define VW 16
#else
#define VW 8
#endif
typedef float vf __attribute__((vector_size(VW * 4), aligned(4), may_alias));

#if defined(__AVX512F__)
static inline float hsum(vf a) { return _mm512_reduce_add_ps((__m512)a); }  /* the lanes' sum, as a tree */
#elif defined(__AVX__)
static inline float hsum(vf a) {
    const __m256 x = (__m256)a;
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}
#else
static inline float hsum(vf a) {
    float s = 0.0f;
    for (int i = 0; i < VW; i++) s += a[i];
    return s;
}
#endif

typedef int32_t vi __attribute__((vector_size(VW * 4), aligned(4), may_alias));

/* v in every lane (a plain `(vf){0} + v` costs an addition per broadcast: adding +0 is not a no-op for -0) */
static inline vf splat(float v) {
#if defined(__AVX512F__)
    return (vf)_mm512_set1_ps(v);
#elif defined(__AVX__)
    return (vf)_mm256_set1_ps(v);
#else
    vf r;
    for (int i = 0; i < VW; i++) r[i] = v;
    return r;
#endif
}

/* exp_nonpos on each lane, the same arithmetic in vector registers (GCC does not vectorize the scalar function's
 * loops with AVX2: "control flow in loop"): 0 at or below -87.3 and for -inf, NaN for NaN. */
static inline vf exp_nonpos_v(vf x) {
    const vf lo = splat(-87.3f);
    const vi dead = x <= lo, under = x < lo;
    x = (vf)(((vi)x & ~under) | ((vi)lo & under));
    const vf kf = (x * splat(1.44269504088896341f) + splat(12582912.0f)) - splat(12582912.0f);
    vf r = x - kf * splat(0.693145751953125f);
    r = r - kf * splat(1.42860682030941723212e-6f);
    vf p = splat(1.0f / 720.0f);
    p = p * r + splat(1.0f / 120.0f);
    p = p * r + splat(1.0f / 24.0f);
    p = p * r + splat(1.0f / 6.0f);
    p = p * r + splat(0.5f);
    p = p * r + splat(1.0f);
    p = p * r + splat(1.0f);
    const vi bits = (__builtin_convertvector(kf, vi) + 127) << 23;  /* 2^k, k in [-126, 0] */
    return (vf)((vi)(p * (vf)bits) & ~dead);
}

/* sum_j exp_nonpos(x[j] - m) over j < n: vectors of VW lanes, then the last few */
static inline float exp_sum(const float* x, int64_t n, float m) {
    vf acc = {0};
    const vf mv = splat(m);
    int64_t j = 0;
    for (; j + VW <= n; j += VW) acc += exp_nonpos_v(*(const vf*)(x + j) - mv);
    float s = hsum(acc);
    for (; j < n; j++) s += exp_nonpos(x[j] - m);
    return s;
}

/* log(sum_j exp(x[j])) over j < n given the row's max m: float sums of 256 terms (vector lanes), added up in
 * double; -inf for an all -inf row, +inf where m is, NaN where a NaN is */
static inline float log_sum_exp(const float* x, int64_t n, float m) {
    if (m == INFINITY) return INFINITY;
    double s = 0.0;
    if (m > -INFINITY) {
        for (int64_t c0 = 0; c0 < n; c0 += 256) {
            const int64_t c1 = c0 + 256 < n ? c0 + 256 : n;
            s += exp_sum(x + c0, c1 - c0, m);
        }
    }
    return m + (float)log(s);
}

static inline float dot(const float* a, const float* b, int64_t D) {  /* a . b, vectors then a tree */
    vf acc = {0};
    int64_t d = 0;
    for (; d + VW <= D; d += VW) acc += *(const vf*)(a + d) * *(const vf*)(b + d);
    float s = hsum(acc);
    for (; d < D; d++) s += a[d] * b[d];
    return s;
}

/* For each row r of x (N, V), row stride xs (columns contiguous):
 *   lse[r] = log(sum_j exp(x[r, j])) over all columns;
 *   the n largest entries among the columns that are not banned (banned: (V,) 0/1 or NULL), best first, as
 *   val[r, i] = x[r, j] - lse[r] and idx[r, i] = j; among equal values the smaller column comes first.
 * A row with fewer than n allowed columns fills the rest with -inf and the first banned columns. */
void aiayn_row_top(const float* x, int64_t N, int64_t V, int64_t xs, const uint8_t* banned, int64_t n,
                   float* val, int64_t* idx, float* lse, int64_t threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * V >= (1 << 16))
    for (int64_t r = 0; r < N; r++) {
        const float* row = x + r * xs;
        float* bv = val + r * n;
        int64_t* bi = idx + r * n;
        int64_t have = 0;
        float worst = -INFINITY;  /* bv[n - 1] once have == n */
        float m = -INFINITY;
        const int64_t C = 64;
        for (int64_t c0 = 0; c0 < V; c0 += C) {
            int64_t c1 = c0 + C < V ? c0 + C : V;
            float cm = -INFINITY;
            #pragma omp simd reduction(max:cm)
            for (int64_t j = c0; j < c1; j++) cm = row[j] > cm ? row[j] : cm;
            m = cm > m ? cm : m;
            if (have == n && !(cm > worst)) continue;
            for (int64_t j = c0; j < c1; j++) {  /* insertion into the sorted best list */
                if (banned && banned[j]) continue;
                float v = row[j];
                if (have == n && !(v > worst)) continue;
                int64_t p = have < n ? have++ : n - 1;
                while (p > 0 && bv[p - 1] < v) { bv[p] = bv[p - 1]; bi[p] = bi[p - 1]; p--; }
                bv[p] = v; bi[p] = j;
                if (have == n) worst = bv[n - 1];
            }
        }
        if (have < n) {  /* fewer allowed columns than n: the first banned ones, at -inf */
            for (int64_t j = 0; j < V && have < n; j++)
                if (banned && banned[j]) { bv[have] = -INFINITY; bi[have] = j; have++; }
        }
        const float l = log_sum_exp(row, V, m);
        lse[r] = l;
        for (int64_t i = 0; i < n; i++) bv[i] -= l;
    }
}

/* For each row r of x (N, V), row stride xs (columns contiguous), in place:
 *   lse[r] = log(sum_j exp(x[r, j])), then x[r, j] = exp(x[r, j] - lse[r]) (the row's softmax).
 * Three passes over each row (its max, the exp-sum, the softmax written back): the row stays in the caches after
 * the first, where log_softmax then exp_ write and read a second (N, V) tensor and take two exps per entry (the
 * training loss's gradient, aiayn/train/fused_loss.py). A NaN anywhere in a row makes its lse and softmax NaN. */
void aiayn_softmax_lse(float* x, int64_t N, int64_t V, int64_t xs, float* lse, int64_t threads) {
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * V >= (1 << 16))
    for (int64_t r = 0; r < N; r++) {
        float* row = x + r * xs;
        float m = -INFINITY;
        #pragma omp simd reduction(max:m)
        for (int64_t j = 0; j < V; j++) m = row[j] > m ? row[j] : m;
        const float l = log_sum_exp(row, V, m);
        lse[r] = l;
        const vf lv = splat(l);
        int64_t j = 0;
        for (; j + VW <= V; j += VW) *(vf*)(row + j) = exp_nonpos_v(*(vf*)(row + j) - lv);
        for (; j < V; j++) row[j] = exp_nonpos(row[j] - l);
    }
}

/* One decoding step's attention: for each block b, query head h and query t,
 *   out[b, h, t, :] = softmax_s(scale * q[b, h, t, :] . k[b', h / g, s, :], masked) @ v[b', h / g, s, :],
 * g = H / Hkv, over s < S, where b' = b, or rows[s * r_ss + b] when a row table is given (the cache row that
 * holds block b's position s). Keys and values share their strides (kv_sb, kv_sh, kv_ss; last dim contiguous);
 * q and out have their own (last dim contiguous). mask: (B, S) 0/1 with strides (m_sb, m_ss), 1 = may attend,
 * or NULL. A query with no allowed key gets zeros.
 * Per block, the allowed keys' offsets are listed once; per (h, t) the scores are vector dot products, the softmax
 * is exp_nonpos, and the output is four interleaved partial sums of weighted value vectors, scaled once. */
void aiayn_few_query_attention(const float* q, int64_t q_sb, int64_t q_sh, int64_t q_st,
                               const float* k, const float* v, int64_t kv_sb, int64_t kv_sh, int64_t kv_ss,
                               const int64_t* rows, int64_t r_ss,
                               const uint8_t* mask, int64_t m_sb, int64_t m_ss,
                               float* out, int64_t o_sb, int64_t o_sh, int64_t o_st,
                               int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t S, int64_t D,
                               float scale, int64_t threads) {
    const int64_t g = H / Hkv;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && B * H * T * S * D >= (1 << 16))
    for (int64_t b = 0; b < B; b++) {
        float pstack[512];
        int64_t kstack[512];
        float* p = S <= 512 ? pstack : (float*)malloc(sizeof(float) * S);  /* one query's weights over the keys */
        int64_t* ko = S <= 512 ? kstack : (int64_t*)malloc(sizeof(int64_t) * S);  /* allowed key a's offset */
        const uint8_t* mb = mask ? mask + b * m_sb : NULL;
        int64_t A = 0;  /* the allowed keys, in order */
        for (int64_t s = 0; s < S; s++)
            if (!mb || mb[s * m_ss]) ko[A++] = (rows ? rows[s * r_ss + b] : b) * kv_sb + s * kv_ss;
        for (int64_t h = 0; h < H; h++) {
            const float* kh = k + (h / g) * kv_sh;
            const float* vh = v + (h / g) * kv_sh;
            for (int64_t t = 0; t < T; t++) {
                const float* qt = q + b * q_sb + h * q_sh + t * q_st;
                float* o = out + b * o_sb + h * o_sh + t * o_st;
                if (A == 0) { memset(o, 0, sizeof(float) * D); continue; }
                float m = -INFINITY, sum = 0.0f;
                for (int64_t a = 0; a < A; a++) {  /* scores */
                    p[a] = scale * dot(qt, kh + ko[a], D);
                    m = p[a] > m ? p[a] : m;
                }
                int64_t a0 = 0;  /* softmax, normalized at the end */
                for (; a0 + VW <= A; a0 += VW) *(vf*)(p + a0) = exp_nonpos_v(*(const vf*)(p + a0) - splat(m));
                for (; a0 < A; a0++) p[a0] = exp_nonpos(p[a0] - m);
                #pragma omp simd reduction(+:sum)
                for (int64_t a = 0; a < A; a++) sum += p[a];
                const float inv = 1.0f / sum;
                int64_t d = 0;
                for (; d + VW <= D; d += VW) {  /* weighted values: four partial sums per output vector */
                    vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
                    int64_t a = 0;
                    for (; a + 4 <= A; a += 4) {
                        a0 += p[a] * *(const vf*)(vh + ko[a] + d);
                        a1 += p[a + 1] * *(const vf*)(vh + ko[a + 1] + d);
                        a2 += p[a + 2] * *(const vf*)(vh + ko[a + 2] + d);
                        a3 += p[a + 3] * *(const vf*)(vh + ko[a + 3] + d);
                    }
                    for (; a < A; a++) a0 += p[a] * *(const vf*)(vh + ko[a] + d);
                    *(vf*)(o + d) = ((a0 + a1) + (a2 + a3)) * inv;
                }
                for (; d < D; d++) {  /* a head width that is not a multiple of the vector width */
                    float acc = 0.0f;
                    for (int64_t a = 0; a < A; a++) acc += p[a] * vh[ko[a] + d];
                    o[d] = acc * inv;
                }
            }
        }
        if (p != pstack) free(p);
        if (ko != kstack) free(ko);
    }
}

/* GELU, x Phi(x) with the exact (erf) Phi, as torch's F.gelu: erf(z) = 1 - t P(t) exp(-z^2), t = 1 / (1 + p z) for
 * z >= 0 (Abramowitz & Stegun 7.1.26, absolute error below 1.5e-7; the approximation torch's vectorized CPU erf
 * uses), odd in z. */
static inline float gelu(float x) {
    const float z = fabsf(x) * 0.70710678118654752f, t = 1.0f / (1.0f + 0.3275911f * z);
    const float poly = t * (0.254829592f + t * (-0.284496736f + t * (1.421413741f + t * (-1.453152027f
                                                                                          + t * 1.061405429f))));
    const float erf_z = 1.0f - poly * exp_nonpos(-z * z);
    return 0.5f * x * (1.0f + (x < 0.0f ? -erf_z : erf_z));
}

/* A linear layer for a few rows: y[m, n] = act(bias[n] + sum_k x[m, k] * wt[k, n]), m < M, n < N, where
 * wt (K, N) is the transposed weight, rows of stride w_sk and contiguous columns (an nn.Linear weight stored
 * column-major, as aiayn.accel.cpu.layout leaves it). At a few rows this is bound by reading the weight, so each thread
 * streams its own contiguous band of weight rows (a slice of k) once: rows of 4 outputs' vectors accumulate over
 * ROWS_KB weight rows at a time in registers (4 rows of x by ROWS_NV vectors of outputs), and the threads' partial
 * sums are added at the end. x: (M, K), row stride x_sm; y: (M, N), row stride y_sm; bias: (N,) or NULL;
 * act: none (activation 0), ReLU (1) or GELU (2). */
#ifndef ROWS_KB
#define ROWS_KB 8
#endif
#ifndef ROWS_NV
#define ROWS_NV 4
#endif
#define DEFINE_ROWS_BLOCK(MR)                                                                                      \
static void rows_block_##MR(const float* x, int64_t x_sm, int64_t k0, int64_t k1, const float* wt, int64_t w_sk,  \
                            const float* bias, float* y, int64_t y_sm, int64_t n0, int64_t n1) {                  \
    const int64_t CW = ROWS_NV * VW;                                                                               \
    for (int64_t kb0 = k0; kb0 < k1; kb0 += ROWS_KB) {                                                             \
        const int64_t kb1 = kb0 + ROWS_KB < k1 ? kb0 + ROWS_KB : k1;                                               \
        for (int64_t n = n0; n + CW <= n1; n += CW) {                                                              \
            vf acc[MR][ROWS_NV];                                                                                   \
            for (int m = 0; m < MR; m++)                                                                           \
                for (int j = 0; j < ROWS_NV; j++)                                                                  \
                    acc[m][j] = kb0 > k0 ? *(const vf*)(y + m * y_sm + n + j * VW)                                 \
                                         : bias ? *(const vf*)(bias + n + j * VW) : (vf){0};                      \
            for (int64_t k = kb0; k < kb1; k++) {                                                                  \
                vf w[ROWS_NV];                                                                                     \
                for (int j = 0; j < ROWS_NV; j++) w[j] = *(const vf*)(wt + k * w_sk + n + j * VW);                 \
                for (int m = 0; m < MR; m++) {                                                                     \
                    const vf xb = splat(x[m * x_sm + k]);                                                          \
                    for (int j = 0; j < ROWS_NV; j++) acc[m][j] += xb * w[j];                                      \
                }                                                                                                  \
            }                                                                                                      \
            for (int m = 0; m < MR; m++)                                                                           \
                for (int j = 0; j < ROWS_NV; j++) *(vf*)(y + m * y_sm + n + j * VW) = acc[m][j];                   \
        }                                                                                                          \
    }                                                                                                              \
}
DEFINE_ROWS_BLOCK(1)
DEFINE_ROWS_BLOCK(2)
DEFINE_ROWS_BLOCK(3)
DEFINE_ROWS_BLOCK(4)

/* y[:, :N] over weight rows k0 <= k < k1 (bias added unless NULL), every row of x, four at a time. */
static void rows_band(const float* x, int64_t x_sm, int64_t M, int64_t k0, int64_t k1, const float* wt,
                      int64_t w_sk, int64_t N, const float* bias, float* y, int64_t y_sm) {
    const int64_t CW = ROWS_NV * VW, nt = N / CW * CW;  /* vector blocks of outputs, then the last few */
    for (int64_t m = 0; m < M; m += 4) {
        const float* xm = x + m * x_sm;
        float* ym = y + m * y_sm;
        switch (M - m < 4 ? M - m : 4) {
            case 1: rows_block_1(xm, x_sm, k0, k1, wt, w_sk, bias, ym, y_sm, 0, N); break;
            case 2: rows_block_2(xm, x_sm, k0, k1, wt, w_sk, bias, ym, y_sm, 0, N); break;
            case 3: rows_block_3(xm, x_sm, k0, k1, wt, w_sk, bias, ym, y_sm, 0, N); break;
            default: rows_block_4(xm, x_sm, k0, k1, wt, w_sk, bias, ym, y_sm, 0, N); break;
        }
    }
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = nt; n < N; n++) {
            float a = bias ? bias[n] : 0.0f;
            for (int64_t k = k0; k < k1; k++) a += x[m * x_sm + k] * wt[k * w_sk + n];
            y[m * y_sm + n] = a;
        }
}

void aiayn_rows_linear(const float* x, int64_t x_sm, int64_t M, int64_t K, const float* wt, int64_t w_sk,
                       int64_t N, const float* bias, float* y, int64_t y_sm, int64_t activation, int64_t threads) {
    int64_t T = threads < 1 ? 1 : threads;
    if (M * N * K < (1 << 16) || K < 2 * ROWS_KB) T = 1;  /* too small to share */
    float* part = T > 1 ? (float*)malloc(sizeof(float) * M * N * (T - 1)) : NULL;  /* threads 1.. write here */
    if (!part) T = 1;
    #pragma omp parallel num_threads(T) if (T > 1)
    {
        const int64_t t = THREAD_INDEX(), nt = THREAD_COUNT();
        const int64_t k0 = K * t / nt / ROWS_KB * ROWS_KB, k1 = t == nt - 1 ? K : K * (t + 1) / nt / ROWS_KB * ROWS_KB;
        float* out = t == 0 ? y : part + (t - 1) * M * N;
        const int64_t o_sm = t == 0 ? y_sm : N;
        rows_band(x, x_sm, M, k0, k1, wt, w_sk, N, t == 0 ? bias : NULL, out, o_sm);
        if (nt > 1) {
            #pragma omp barrier
            #pragma omp for schedule(static)
            for (int64_t n0 = 0; n0 < N; n0 += 256) {  /* y += the other threads' partial sums */
                const int64_t n1 = n0 + 256 < N ? n0 + 256 : N;
                for (int64_t m = 0; m < M; m++)
                    for (int64_t p = 0; p < nt - 1; p++) {
                        const float* src = part + p * M * N + m * N;
                        float* dst = y + m * y_sm;
                        for (int64_t n = n0; n < n1; n++) dst[n] += src[n];
                    }
            }
        }
    }
    if (activation == 1)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) y[m * y_sm + n] = y[m * y_sm + n] > 0.0f ? y[m * y_sm + n] : 0.0f;
    else if (activation == 2)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) y[m * y_sm + n] = gelu(y[m * y_sm + n]);
    free(part);
}

/* ------------------------------------------------------------------------------------------------ panel linear */

/* y = act(x W^T + bias) for many rows (a batched beam search's batch x beams, an encoder's tokens) from a weight
 * packed once into panels of PANEL_NR output columns: panel p holds W[p NR : (p + 1) NR, :] as K rows of NR floats
 * (zeros past N), so the inner loop reads it contiguously. The product is blocked like BLIS's: each thread takes
 * its contiguous band of panels, PANEL_NC of them at a time; for each slice of PANEL_KC inputs, each panel times
 * every PANEL_MR-row block of x (packed per call, k-major) accumulates into y in registers (PANEL_MR x PANEL_NR sums,
 * twelve vector registers); the panel's slice stays in L1 and x's in L2. Each weight byte is read once per call. */
#define PANEL_MR 6
#define PANEL_NR (2 * VW)
#ifndef PANEL_KC
#define PANEL_KC 512
#endif
#ifndef PANEL_NC
#define PANEL_NC 4
#endif

int64_t aiayn_panel_width(void) { return PANEL_NR; }

/* W (N, K), strides w_sn and w_sk, into panels (see above): out holds ceil(N / PANEL_NR) * PANEL_NR * K floats. */
void aiayn_pack_panels(const float* w, int64_t w_sn, int64_t w_sk, int64_t N, int64_t K, float* out,
                       int64_t threads) {
    const int64_t P = (N + PANEL_NR - 1) / PANEL_NR;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * K >= (1 << 16))
    for (int64_t p = 0; p < P; p++) {
        float* dst = out + p * PANEL_NR * K;
        for (int64_t k = 0; k < K; k++)
            for (int64_t j = 0; j < PANEL_NR; j++) {
                const int64_t n = p * PANEL_NR + j;
                dst[k * PANEL_NR + j] = n < N ? w[n * w_sn + k * w_sk] : 0.0f;
            }
    }
}

/* panel_block for R <= PANEL_MR rows of x (full panels only), R a constant at each call: the last few rows of x,
 * and every block where the AVX2 form below does not apply */
static inline __attribute__((always_inline)) void panel_rows(const int R, const float* a, const float* b, int64_t kc,
                                                             float* c, int64_t ldc, int first, const float* bias,
                                                             int64_t act, int finish) {
    vf acc[PANEL_MR][2];
    for (int m = 0; m < R; m++)
        for (int j = 0; j < 2; j++)
            acc[m][j] = !first ? *(const vf*)(c + m * ldc + j * VW) : bias ? *(const vf*)(bias + j * VW) : (vf){0};
    for (int64_t k = 0; k < kc; k++) {
        const vf b0 = *(const vf*)(b + k * PANEL_NR), b1 = *(const vf*)(b + k * PANEL_NR + VW);
        for (int m = 0; m < R; m++) {
            const vf xb = splat(a[k * PANEL_MR + m]);
            acc[m][0] += xb * b0;
            acc[m][1] += xb * b1;
        }
    }
    for (int m = 0; m < R; m++)
        for (int j = 0; j < 2; j++) *(vf*)(c + m * ldc + j * VW) = acc[m][j];
    if (finish && act)
        for (int m = 0; m < R; m++)
            for (int j = 0; j < PANEL_NR; j++) {
                const float v = c[m * ldc + j];
                c[m * ldc + j] = act == 1 ? (v > 0.0f ? v : 0.0f) : gelu(v);
            }
}

/* c (PANEL_MR x PANEL_NR, row stride ldc) = (first ? bias, or 0 where NULL : c) + a (kc x PANEL_MR, packed) times
 * b (kc x PANEL_NR, one panel's slice); then ReLU or GELU (act 1, 2) if `finish`. */
static inline void panel_block(const float* a, const float* b, int64_t kc, float* c, int64_t ldc, int first,
                               const float* bias, int64_t act, int finish) {
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
    /* twelve named accumulators: GCC keeps a generic loop's array in registers too, but with a register copy per
     * step */
    __m256 c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (first) {
        const __m256 z = _mm256_setzero_ps();
        const __m256 b0 = bias ? _mm256_loadu_ps(bias) : z, b1 = bias ? _mm256_loadu_ps(bias + 8) : z;
        c00 = c10 = c20 = c30 = c40 = c50 = b0;
        c01 = c11 = c21 = c31 = c41 = c51 = b1;
    } else {
        c00 = _mm256_loadu_ps(c); c01 = _mm256_loadu_ps(c + 8);
        c10 = _mm256_loadu_ps(c + ldc); c11 = _mm256_loadu_ps(c + ldc + 8);
        c20 = _mm256_loadu_ps(c + 2 * ldc); c21 = _mm256_loadu_ps(c + 2 * ldc + 8);
        c30 = _mm256_loadu_ps(c + 3 * ldc); c31 = _mm256_loadu_ps(c + 3 * ldc + 8);
        c40 = _mm256_loadu_ps(c + 4 * ldc); c41 = _mm256_loadu_ps(c + 4 * ldc + 8);
        c50 = _mm256_loadu_ps(c + 5 * ldc); c51 = _mm256_loadu_ps(c + 5 * ldc + 8);
    }
    for (int64_t k = 0; k < kc; k++, a += PANEL_MR, b += PANEL_NR) {
        const __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
        __m256 x = _mm256_broadcast_ss(a);
        c00 = _mm256_fmadd_ps(x, b0, c00); c01 = _mm256_fmadd_ps(x, b1, c01);
        x = _mm256_broadcast_ss(a + 1);
        c10 = _mm256_fmadd_ps(x, b0, c10); c11 = _mm256_fmadd_ps(x, b1, c11);
        x = _mm256_broadcast_ss(a + 2);
        c20 = _mm256_fmadd_ps(x, b0, c20); c21 = _mm256_fmadd_ps(x, b1, c21);
        x = _mm256_broadcast_ss(a + 3);
        c30 = _mm256_fmadd_ps(x, b0, c30); c31 = _mm256_fmadd_ps(x, b1, c31);
        x = _mm256_broadcast_ss(a + 4);
        c40 = _mm256_fmadd_ps(x, b0, c40); c41 = _mm256_fmadd_ps(x, b1, c41);
        x = _mm256_broadcast_ss(a + 5);
        c50 = _mm256_fmadd_ps(x, b0, c50); c51 = _mm256_fmadd_ps(x, b1, c51);
    }
    if (finish && act == 1) {
        const __m256 z = _mm256_setzero_ps();
        c00 = _mm256_max_ps(c00, z); c01 = _mm256_max_ps(c01, z); c10 = _mm256_max_ps(c10, z);
        c11 = _mm256_max_ps(c11, z); c20 = _mm256_max_ps(c20, z); c21 = _mm256_max_ps(c21, z);
        c30 = _mm256_max_ps(c30, z); c31 = _mm256_max_ps(c31, z); c40 = _mm256_max_ps(c40, z);
        c41 = _mm256_max_ps(c41, z); c50 = _mm256_max_ps(c50, z); c51 = _mm256_max_ps(c51, z);
    }
    _mm256_storeu_ps(c, c00); _mm256_storeu_ps(c + 8, c01);
    _mm256_storeu_ps(c + ldc, c10); _mm256_storeu_ps(c + ldc + 8, c11);
    _mm256_storeu_ps(c + 2 * ldc, c20); _mm256_storeu_ps(c + 2 * ldc + 8, c21);
    _mm256_storeu_ps(c + 3 * ldc, c30); _mm256_storeu_ps(c + 3 * ldc + 8, c31);
    _mm256_storeu_ps(c + 4 * ldc, c40); _mm256_storeu_ps(c + 4 * ldc + 8, c41);
    _mm256_storeu_ps(c + 5 * ldc, c50); _mm256_storeu_ps(c + 5 * ldc + 8, c51);
    if (finish && act == 2)
        for (int m = 0; m < PANEL_MR; m++)
            for (int j = 0; j < PANEL_NR; j++) c[m * ldc + j] = gelu(c[m * ldc + j]);
#else
    panel_rows(PANEL_MR, a, b, kc, c, ldc, first, bias, act, finish);
#endif
}

static void panel_few_rows(int64_t R, const float* a, const float* b, int64_t kc, float* c, int64_t ldc, int first,
                           const float* bias, int64_t act, int finish) {
    switch (R) {
        case 1: panel_rows(1, a, b, kc, c, ldc, first, bias, act, finish); break;
        case 2: panel_rows(2, a, b, kc, c, ldc, first, bias, act, finish); break;
        case 3: panel_rows(3, a, b, kc, c, ldc, first, bias, act, finish); break;
        case 4: panel_rows(4, a, b, kc, c, ldc, first, bias, act, finish); break;
        default: panel_rows(5, a, b, kc, c, ldc, first, bias, act, finish); break;
    }
}

/* x (M, K), row stride x_sm; wp: W packed by aiayn_pack_panels; bias (N,) or NULL; y (M, N), row stride y_sm;
 * scratch: room for x packed, M rounded up to aiayn_panel_block_rows() times K floats (the caller keeps it across
 * calls: no page faults). */
void aiayn_panel_linear(const float* x, int64_t x_sm, int64_t M, int64_t K, const float* wp, int64_t N,
                        const float* bias, float* y, int64_t y_sm, int64_t act, float* scratch, int64_t threads) {
    const int64_t MB = (M + PANEL_MR - 1) / PANEL_MR, P = (N + PANEL_NR - 1) / PANEL_NR;
    float* const ap = scratch;
    int64_t T = threads < 1 ? 1 : threads;
    if (T > P) T = P;
    if (M * N * K < (1 << 18)) T = 1;  /* too small to share */
    #pragma omp parallel num_threads(T) if (T > 1)
    {
        const int64_t t = THREAD_INDEX(), nt = THREAD_COUNT();
        #pragma omp for schedule(static)
        for (int64_t i = 0; i < MB; i++) {  /* x's row blocks, k-major, zeros past M */
            float* dst = ap + i * PANEL_MR * K;
            for (int64_t r = 0; r < PANEL_MR; r++) {
                const int64_t m = i * PANEL_MR + r;
                const float* src = x + m * x_sm;
                if (m < M)
                    for (int64_t k = 0; k < K; k++) dst[k * PANEL_MR + r] = src[k];
                else
                    for (int64_t k = 0; k < K; k++) dst[k * PANEL_MR + r] = 0.0f;
            }
        }  /* the loop's barrier: x packed before any thread reads it */
        const int64_t p0 = P * t / nt, p1 = P * (t + 1) / nt;
        float tile[PANEL_MR * PANEL_NR], tb[PANEL_NR];
        for (int64_t pc = p0; pc < p1; pc += PANEL_NC) {
            const int64_t pc1 = pc + PANEL_NC < p1 ? pc + PANEL_NC : p1;
            for (int64_t k0 = 0; k0 < K; k0 += PANEL_KC) {
                const int64_t kc = k0 + PANEL_KC < K ? PANEL_KC : K - k0;
                const int first = k0 == 0, finish = k0 + kc == K;
                for (int64_t p = pc; p < pc1; p++) {
                    const float* b = wp + p * PANEL_NR * K + k0 * PANEL_NR;
                    const int64_t n0 = p * PANEL_NR, nv = N - n0 < PANEL_NR ? N - n0 : PANEL_NR;
                    const float* pb = bias ? bias + n0 : NULL;
                    if (nv < PANEL_NR && bias) {  /* the last, partial panel's bias, zero padded */
                        for (int64_t j = 0; j < PANEL_NR; j++) tb[j] = j < nv ? bias[n0 + j] : 0.0f;
                        pb = tb;
                    }
                    for (int64_t i = 0; i < MB; i++) {
                        const float* a = ap + i * PANEL_MR * K + k0 * PANEL_MR;
                        const int64_t m0 = i * PANEL_MR, mv = M - m0 < PANEL_MR ? M - m0 : PANEL_MR;
                        float* c = y + m0 * y_sm + n0;
                        if (mv == PANEL_MR && nv == PANEL_NR) {
                            panel_block(a, b, kc, c, y_sm, first, pb, act, finish);
                            continue;
                        }
                        if (nv == PANEL_NR) {  /* the last few rows: only theirs computed */
                            panel_few_rows(mv, a, b, kc, c, y_sm, first, pb, act, finish);
                            continue;
                        }
                        if (!first)  /* a partial block goes through a full-size tile */
                            for (int64_t r = 0; r < mv; r++)
                                for (int64_t j = 0; j < nv; j++) tile[r * PANEL_NR + j] = c[r * y_sm + j];
                        panel_block(a, b, kc, tile, PANEL_NR, first, pb, act, finish);
                        for (int64_t r = 0; r < mv; r++)
                            for (int64_t j = 0; j < nv; j++) c[r * y_sm + j] = tile[r * PANEL_NR + j];
                    }
                }
            }
        }
    }
}

/* Rows of x per register block: aiayn_panel_linear's scratch holds M rounded up to a multiple of this, times K. */
int64_t aiayn_panel_block_rows(void) { return PANEL_MR; }

/* ----------------------------------------------------------------------------------------------- int8 screen */

/* out[m, v] = scales[v] * sum_j q[v, j] x[m, j] for the M <= 4 rows of x (fp32, row stride x_sm) and the V int8 rows
 * of q (contiguous, D columns): greedy search's int8 screen of an output layer (aiayn.accel.cpu.screened_argmax), where
 * the int8 copy is a quarter of the fp32 weight's bytes. Each weight value is widened to fp32 (exact) and the sums are
 * fp32. Weight rows go four at a time, so that a single input row still keeps four independent sums in flight;
 * threads take contiguous bands of weight rows. */
#if defined(__AVX512F__)  /* VW int8 values widened to fp32 (exactly): sign-extend, then convert, in registers */
static inline vf widen(const int8_t* p) {
    return (vf)_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
}
#elif defined(__AVX2__)
static inline vf widen(const int8_t* p) {
    return (vf)_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i*)p)));
}
#else
typedef int8_t vq __attribute__((vector_size(VW), aligned(1), may_alias));
static inline vf widen(const int8_t* p) { return __builtin_convertvector(*(const vq*)p, vf); }
#endif

void aiayn_int8_screen(const float* x, int64_t x_sm, int64_t M, int64_t D, const int8_t* q, const float* scales,
                       int64_t V, float* out, int64_t out_sm, int64_t threads) {
    const int64_t Dv = D / VW * VW;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && V * D >= (1 << 16))
    for (int64_t v0 = 0; v0 < V; v0 += 4) {
        const int64_t nv = V - v0 < 4 ? V - v0 : 4;
        const int8_t* w[4];
        for (int i = 0; i < 4; i++) w[i] = q + (v0 + (i < nv ? i : 0)) * D;  /* a short last group repeats a row */
        for (int64_t m = 0; m < M; m++) {
            const float* xm = x + m * x_sm;
            vf a0 = {0}, a1 = {0}, a2 = {0}, a3 = {0};
            for (int64_t j = 0; j < Dv; j += VW) {
                const vf xv = *(const vf*)(xm + j);
                a0 += widen(w[0] + j) * xv;
                a1 += widen(w[1] + j) * xv;
                a2 += widen(w[2] + j) * xv;
                a3 += widen(w[3] + j) * xv;
            }
            float s[4] = {hsum(a0), hsum(a1), hsum(a2), hsum(a3)};
            for (int i = 0; i < nv; i++) {
                for (int64_t j = Dv; j < D; j++) s[i] += (float)w[i][j] * xm[j];
                out[m * out_sm + v0 + i] = s[i] * scales[v0 + i];
            }
        }
    }
}

/* --------------------------------------------------------------------------------------------- int8 rows linear */

/* y[m, n] = act(scales[n] sum_j q[n, j] x[m, j] + bias[n]) for a few rows of x (a decoding step's): a linear layer
 * whose weight is int8 with one scale per output (weight-only quantization: x stays fp32, so no activation is
 * rounded), read once per call, a quarter of an fp32 weight's bytes. Each thread takes a band of output pairs; each
 * chunk of a pair's weight rows is widened to fp32 once and multiplied into every one of up to 4 rows of x, so two
 * weight rows x four input rows keep eight independent sums in registers. */
static inline __attribute__((always_inline)) void int8_pair(const float* x, int64_t x_sm, const int MR, int64_t K,
                                                            const int8_t* w0, const int8_t* w1, float s[2][4]) {
    const int64_t Kv = K / VW * VW;
    vf a[2][4];
    for (int m = 0; m < 4; m++) a[0][m] = a[1][m] = (vf){0};
    for (int64_t j = 0; j < Kv; j += VW) {
        const vf u = widen(w0 + j), v = widen(w1 + j);
        for (int m = 0; m < MR; m++) {
            const vf xv = *(const vf*)(x + m * x_sm + j);
            a[0][m] += u * xv;
            a[1][m] += v * xv;
        }
    }
    for (int m = 0; m < MR; m++) {
        s[0][m] = hsum(a[0][m]);
        s[1][m] = hsum(a[1][m]);
        for (int64_t j = Kv; j < K; j++) {
            s[0][m] += (float)w0[j] * x[m * x_sm + j];
            s[1][m] += (float)w1[j] * x[m * x_sm + j];
        }
    }
}

void aiayn_int8_rows_linear(const float* x, int64_t x_sm, int64_t M, int64_t K, const int8_t* q, int64_t q_sn,
                            const float* scales, int64_t N, const float* bias, float* y, int64_t y_sm,
                            int64_t activation, int64_t threads) {
    const int64_t pairs = (N + 1) / 2;
    #pragma omp parallel for schedule(static) num_threads(threads) if (threads > 1 && N * K >= (1 << 16))
    for (int64_t p = 0; p < pairs; p++) {
        const int64_t n = 2 * p, two = N - n < 2 ? 1 : 2;
        const int8_t* w0 = q + n * q_sn;
        const int8_t* w1 = two == 2 ? w0 + q_sn : w0;  /* an odd last output repeats its row */
        for (int64_t m0 = 0; m0 < M; m0 += 4) {
            const int64_t mr = M - m0 < 4 ? M - m0 : 4;
            const float* xm = x + m0 * x_sm;
            float s[2][4];
            switch (mr) {  /* a constant row count each, so that the sums stay in registers */
                case 1: int8_pair(xm, x_sm, 1, K, w0, w1, s); break;
                case 2: int8_pair(xm, x_sm, 2, K, w0, w1, s); break;
                case 3: int8_pair(xm, x_sm, 3, K, w0, w1, s); break;
                default: int8_pair(xm, x_sm, 4, K, w0, w1, s); break;
            }
            for (int64_t i = 0; i < two; i++)
                for (int64_t m = 0; m < mr; m++) {
                    float r = s[i][m] * scales[n + i] + (bias ? bias[n + i] : 0.0f);
                    if (activation == 1) r = r > 0.0f ? r : 0.0f;
                    else if (activation == 2) r = gelu(r);
                    y[(m0 + m) * y_sm + n + i] = r;
                }
        }
    }
}
