/*
 * utf8.c — UTF-8 validation and deterministic repair.
 *
 * Invalid input is never an error for the tokenizer: each maximal invalid
 * subpart (Unicode §3.9, "U+FFFD substitution of maximal subparts") becomes
 * one U+FFFD. That is what Python's bytes.decode("utf-8", "replace") and
 * Rust's String::from_utf8_lossy produce, so tests can reproduce it exactly,
 * and the decoder uses the same rule for byte runs that do not form text.
 */
#include "tokenizer/tokenizer.h"

#include "base/error.h"

#include <string.h>

/* The valid range of the second byte after lead byte b0 (Unicode table 3-7);
 * the remaining continuation bytes are always 0x80..0xBF. */
static int lead_info(uint8_t b0, uint8_t *lo, uint8_t *hi)
{
    *lo = 0x80, *hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF) return 2;
    if (b0 >= 0xE0 && b0 <= 0xEF) {
        if (b0 == 0xE0) *lo = 0xA0;
        if (b0 == 0xED) *hi = 0x9F; /* no surrogates */
        return 3;
    }
    if (b0 >= 0xF0 && b0 <= 0xF4) {
        if (b0 == 0xF0) *lo = 0x90;
        if (b0 == 0xF4) *hi = 0x8F; /* <= U+10FFFF */
        return 4;
    }
    return 0;
}

size_t utf8_valid_prefix(const uint8_t *s, size_t len, size_t *need)
{
    uint8_t lo, hi;
    int n = lead_info(s[0], &lo, &hi);
    *need = (size_t)n;
    if (n == 0) return 0;
    size_t k = 1;
    while (k < (size_t)n && k < len) {
        uint8_t c = s[k];
        uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
        if (c < l || c > h) break;
        k++;
    }
    return k;
}

size_t utf8_seq_len(const uint8_t *s, size_t len)
{
    if (len == 0) return 0;
    if (s[0] < 0x80) return 1;
    size_t need, k = utf8_valid_prefix(s, len, &need);
    return (need && k == need) ? need : 0;
}

size_t utf8_invalid_len(const uint8_t *s, size_t len)
{
    size_t need, k = utf8_valid_prefix(s, len, &need);
    return k ? k : 1;
}

bool utf8_valid(const uint8_t *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t n = utf8_seq_len(s + i, len - i);
        if (!n) return false;
        i += n;
    }
    return true;
}

size_t utf8_repaired_len(const uint8_t *s, size_t len)
{
    size_t i = 0, out = 0;
    while (i < len) {
        size_t n = utf8_seq_len(s + i, len - i);
        if (n) {
            i += n, out += n;
        } else {
            i += utf8_invalid_len(s + i, len - i);
            out += 3;
        }
    }
    return out;
}

size_t utf8_repair(const uint8_t *s, size_t len, char *out)
{
    static const char fffd[3] = {(char)0xEF, (char)0xBF, (char)0xBD};
    size_t i = 0, o = 0;
    while (i < len) {
        size_t n = utf8_seq_len(s + i, len - i);
        if (n) {
            memcpy(out + o, s + i, n);
            i += n, o += n;
        } else {
            i += utf8_invalid_len(s + i, len - i);
            memcpy(out + o, fffd, 3);
            o += 3;
        }
    }
    return o;
}
