/* aiayn's native CPU kernels for decoding (fp32), called through ctypes by aiayn/native/__init__.py.
 *
 * Each kernel has a plain-PyTorch reference next to its Python wrapper, and tests hold the two equal. They exist
 * where PyTorch's own kernels read the same memory several times or cost more in dispatch than in arithmetic:
 *   aiayn_row_top             a row's log-sum-exp and its n best entries in two passes over the row;
 *   aiayn_few_query_attention one decoding step's attention (self- or cross-), vectorized, optionally through
 *                             a table of cache rows (beam search's reordering without copying the cache).
 * Threads: OpenMP, the same runtime as torch's (the library is linked against the libgomp torch loaded).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX__)
#include <immintrin.h>
#endif

/* exp(x) for x <= 0 (0 for x < -87.3 and for -inf), to about 2 ulp, in plain arithmetic the compiler vectorizes:
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
        double s = 0.0;  /* float sums of 256 terms (vectorized), added up in double */
        if (m == INFINITY) {
            s = 1.0;
        } else if (m > -INFINITY) {
            for (int64_t c0 = 0; c0 < V; c0 += 256) {
                const int64_t c1 = c0 + 256 < V ? c0 + 256 : V;
                float part = 0.0f;
                #pragma omp simd reduction(+:part)
                for (int64_t j = c0; j < c1; j++) part += exp_nonpos(row[j] - m);
                s += part;
            }
        }
        const float l = m == INFINITY ? INFINITY : m + (float)log(s);
        lse[r] = l;
        for (int64_t i = 0; i < n; i++) bv[i] -= l;
    }
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

static inline float dot(const float* a, const float* b, int64_t D) {  /* a . b, vectors then a tree */
    vf acc = {0};
    int64_t d = 0;
    for (; d + VW <= D; d += VW) acc += *(const vf*)(a + d) * *(const vf*)(b + d);
    float s = hsum(acc);
    for (; d < D; d++) s += a[d] * b[d];
    return s;
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
                for (int64_t a = 0; a < A; a++) p[a] = exp_nonpos(p[a] - m);  /* softmax, normalized at the end */
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
