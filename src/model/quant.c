/*
 * quant.c — turning one stored row of any supported format into float32.
 *
 * This is the plain, obviously-correct path: the forward pass's fast kernels
 * (backend/cpu) are checked against it, and it is checked in turn against
 * the `gguf` Python package's dequantization in tests. Block layouts are
 * GGML's, little-endian:
 *   Q8_0  34 B / 32 values: f16 d, int8 q[32]               x = d*q
 *   Q4_0  18 B / 32 values: f16 d, u8 nibbles[16]           x = d*(nib-8)
 *   Q4_K 144 B / 256 values: f16 d, f16 dmin, u8 scales[12], u8 q[128]
 *        8 sub-blocks of 32 with 6-bit scale/min:           x = d*sc*q - dmin*m
 *   Q6_K 210 B / 256 values: u8 ql[128], u8 qh[64], i8 sc[16], f16 d
 *        16 sub-blocks of 16:                               x = d*sc*(q-32)
 */
#include "model/model.h"

#include "base/error.h"

#include <string.h>

static uint16_t read_u16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static void dequant_q8_0(const uint8_t *blk, float *y)
{
    float d = f16_to_f32(read_u16(blk));
    const int8_t *q = (const int8_t *)(blk + 2);
    for (int i = 0; i < 32; i++) y[i] = d * (float)q[i];
}

static void dequant_q4_0(const uint8_t *blk, float *y)
{
    float d = f16_to_f32(read_u16(blk));
    const uint8_t *q = blk + 2;
    for (int i = 0; i < 16; i++) {
        y[i] = d * (float)((q[i] & 0x0F) - 8);
        y[i + 16] = d * (float)((q[i] >> 4) - 8);
    }
}

/* The 6-bit scale and min of sub-block j (0..7) of a Q4_K block. */
static void q4_k_scale_min(const uint8_t *scales, int j, int *sc, int *mn)
{
    if (j < 4) {
        *sc = scales[j] & 63;
        *mn = scales[j + 4] & 63;
    } else {
        *sc = (scales[j + 4] & 0x0F) | ((scales[j - 4] >> 6) << 4);
        *mn = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
}

static void dequant_q4_k(const uint8_t *blk, float *y)
{
    float d = f16_to_f32(read_u16(blk));
    float dmin = f16_to_f32(read_u16(blk + 2));
    const uint8_t *scales = blk + 4;
    const uint8_t *q = blk + 16;
    for (int chunk = 0; chunk < 4; chunk++) { /* 64 values: low nibbles, then high nibbles */
        int sc_lo, m_lo, sc_hi, m_hi;
        q4_k_scale_min(scales, 2 * chunk, &sc_lo, &m_lo);
        q4_k_scale_min(scales, 2 * chunk + 1, &sc_hi, &m_hi);
        const uint8_t *qc = q + 32 * chunk;
        float *yc = y + 64 * chunk;
        for (int l = 0; l < 32; l++) {
            yc[l] = d * (float)sc_lo * (float)(qc[l] & 0x0F) - dmin * (float)m_lo;
            yc[l + 32] = d * (float)sc_hi * (float)(qc[l] >> 4) - dmin * (float)m_hi;
        }
    }
}

static void dequant_q6_k(const uint8_t *blk, float *y)
{
    const uint8_t *ql = blk;
    const uint8_t *qh = blk + 128;
    const int8_t *sc = (const int8_t *)(blk + 192);
    float d = f16_to_f32(read_u16(blk + 208));
    for (int half = 0; half < 2; half++) { /* 128 values each */
        for (int l = 0; l < 32; l++) {
            int is = l / 16;
            int q1 = ((ql[l] & 0x0F) | (((qh[l] >> 0) & 3) << 4)) - 32;
            int q2 = ((ql[l + 32] & 0x0F) | (((qh[l] >> 2) & 3) << 4)) - 32;
            int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
            int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
            y[l] = d * (float)sc[is + 0] * (float)q1;
            y[l + 32] = d * (float)sc[is + 2] * (float)q2;
            y[l + 64] = d * (float)sc[is + 4] * (float)q3;
            y[l + 96] = d * (float)sc[is + 6] * (float)q4;
        }
        ql += 64;
        qh += 32;
        sc += 8;
        y += 128;
    }
}

void weight_row_to_f32(const weight_ref *w, int64_t row, float *out)
{
    const uint8_t *src = (const uint8_t *)w->data + (uint64_t)row * dtype_row_bytes(w->dtype, (uint64_t)w->cols);
    int64_t n = w->cols;
    switch (w->dtype) {
    case SPARK_DTYPE_F32:
        memcpy(out, src, (size_t)n * sizeof(float));
        return;
    case SPARK_DTYPE_F16:
        for (int64_t i = 0; i < n; i++) out[i] = f16_to_f32(read_u16(src + 2 * i));
        return;
    case SPARK_DTYPE_BF16:
        for (int64_t i = 0; i < n; i++) out[i] = bf16_to_f32(read_u16(src + 2 * i));
        return;
    default:
        break;
    }
    int per_block = dtype_block_elems(w->dtype);
    int block_bytes = dtype_block_bytes(w->dtype);
    for (int64_t b = 0; b < n / per_block; b++) {
        const uint8_t *blk = src + b * block_bytes;
        float *y = out + b * per_block;
        switch (w->dtype) {
        case SPARK_DTYPE_Q8_0: dequant_q8_0(blk, y); break;
        case SPARK_DTYPE_Q4_0: dequant_q4_0(blk, y); break;
        case SPARK_DTYPE_Q4_K: dequant_q4_k(blk, y); break;
        case SPARK_DTYPE_Q6_K: dequant_q6_k(blk, y); break;
        default: ASSERT(!"weight_row_to_f32: unhandled dtype");
        }
    }
}
