/* The kernels of kernels.c that decoder_layer.c chains (see each definition for what it computes). */
#ifndef AIAYN_KERNELS_H
#define AIAYN_KERNELS_H
#include <stdint.h>

void aiayn_few_query_attention(const float* q, int64_t q_sb, int64_t q_sh, int64_t q_st,
                               const float* k, const float* v, int64_t kv_sb, int64_t kv_sh, int64_t kv_ss,
                               const int64_t* rows, int64_t r_ss,
                               const uint8_t* mask, int64_t m_sb, int64_t m_ss,
                               float* out, int64_t o_sb, int64_t o_sh, int64_t o_st,
                               int64_t B, int64_t H, int64_t Hkv, int64_t T, int64_t S, int64_t D,
                               float scale, int64_t threads);
void aiayn_rows_linear(const float* x, int64_t x_sm, int64_t M, int64_t K, const float* wt, int64_t w_sk,
                       int64_t N, const float* bias, float* y, int64_t y_sm, int64_t activation, int64_t threads);
void aiayn_panel_linear(const float* x, int64_t x_sm, int64_t M, int64_t K, const float* wp, int64_t N,
                        const float* bias, float* y, int64_t y_sm, int64_t act, float* scratch, int64_t threads);
int64_t aiayn_panel_block_rows(void);
void aiayn_int8_rows_linear(const float* x, int64_t x_sm, int64_t M, int64_t K, const int8_t* q, int64_t q_sn,
                            const float* scales, int64_t N, const float* bias, float* y, int64_t y_sm,
                            int64_t activation, int64_t threads);

#endif
