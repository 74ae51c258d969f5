/* The kernels of kernels.c that decoder_layer.c chains (see each definition for what it computes). */
#ifndef AIAYN_KERNELS_H
#define AIAYN_KERNELS_H
#include <stdint.h>

void aiayn_rows_linear(const float* x, int64_t x_sm, int64_t M, int64_t K, const float* wt, int64_t w_sk,
                       int64_t N, const float* bias, float* y, int64_t y_sm, int64_t activation, int64_t threads);
void aiayn_panel_linear(const float* x, int64_t x_sm, int64_t M, int64_t K, const float* wp, int64_t N,
                        const float* bias, float* y, int64_t y_sm, int64_t act, float* scratch, int64_t threads);
int64_t aiayn_panel_block_rows(void);
void aiayn_int8_rows_linear(const float* x, int64_t x_sm, int64_t M, int64_t K, const int8_t* q, int64_t q_sn,
                            const float* scales, int64_t N, const float* bias, float* y, int64_t y_sm,
                            int64_t activation, int64_t threads);

#endif
