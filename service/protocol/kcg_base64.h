/* Base64 (RFC 4648 standard alphabet, padded) for the gateway's C extensions (_crecords, _cavro, _cproduce):
 * one definition of the alphabet, the encoder and the decoder table. Header-only (static): each extension
 * gets its own copy; call kcg_b64_init() once from the module's init function. Needs Python.h (Py_ssize_t). */
#ifndef KCG_BASE64_H
#define KCG_BASE64_H

#include <stdint.h>
#include <string.h>

static const char kcg_b64_alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
static char kcg_b64_pairs[2 * 4096];   /* 12 input bits -> 2 output characters */
static signed char kcg_b64_value[256]; /* a character's 6 bits, or -1 (not in the alphabet; '=' included) */
/* the decoder's tables: kcg_b64_d[k][c] is c's 6 bits shifted for position k of a quad, or KCG_B64_BAD */
#define KCG_B64_BAD 0x01000000u
static uint32_t kcg_b64_d[4][256];

static void
kcg_b64_init(void)
{
    for (int v = 0; v < 4096; v++) {
        kcg_b64_pairs[2 * v] = kcg_b64_alphabet[v >> 6];
        kcg_b64_pairs[2 * v + 1] = kcg_b64_alphabet[v & 63];
    }
    memset(kcg_b64_value, -1, sizeof kcg_b64_value);
    for (int c = 0; c < 256; c++)
        for (int k = 0; k < 4; k++)
            kcg_b64_d[k][c] = KCG_B64_BAD;
    for (int i = 0; i < 64; i++) {
        unsigned char c = (unsigned char)kcg_b64_alphabet[i];
        kcg_b64_value[c] = (signed char)i;
        for (int k = 0; k < 4; k++)
            kcg_b64_d[k][c] = (uint32_t)i << (18 - 6 * k);
    }
}

/* Decodes nquads whole quads of s (no padding) into 3 * nquads bytes at o; 0 at the first character outside
 * the alphabet ('=' included), else 1. */
static inline int
kcg_b64_decode_quads(unsigned char *o, const unsigned char *s, Py_ssize_t nquads)
{
    uint32_t bad = 0;
    for (Py_ssize_t q = 0; q < nquads; q++, s += 4, o += 3) {
        uint32_t v = kcg_b64_d[0][s[0]] | kcg_b64_d[1][s[1]] | kcg_b64_d[2][s[2]] | kcg_b64_d[3][s[3]];
        bad |= v;
        o[0] = (unsigned char)(v >> 16);
        o[1] = (unsigned char)(v >> 8);
        o[2] = (unsigned char)v;
    }
    return (bad & KCG_B64_BAD) == 0;
}

/* The encoded length of n bytes. */
static inline Py_ssize_t
kcg_b64_len(Py_ssize_t n)
{
    return ((n + 2) / 3) * 4;
}

/* Writes kcg_b64_len(n) characters of s[0:n] at o; returns the end. */
static inline char *
kcg_b64_put(char *o, const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t i = 0;
    for (; i + 3 <= n; i += 3) {
        uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8) | s[i + 2];
        memcpy(o, kcg_b64_pairs + 2 * (v >> 12), 2);
        memcpy(o + 2, kcg_b64_pairs + 2 * (v & 0xFFF), 2);
        o += 4;
    }
    if (n - i == 1) {
        uint32_t v = (uint32_t)s[i] << 16;
        o[0] = kcg_b64_alphabet[v >> 18];
        o[1] = kcg_b64_alphabet[(v >> 12) & 63];
        o[2] = '=';
        o[3] = '=';
        o += 4;
    } else if (n - i == 2) {
        uint32_t v = ((uint32_t)s[i] << 16) | ((uint32_t)s[i + 1] << 8);
        o[0] = kcg_b64_alphabet[v >> 18];
        o[1] = kcg_b64_alphabet[(v >> 12) & 63];
        o[2] = kcg_b64_alphabet[(v >> 6) & 63];
        o[3] = '=';
        o += 4;
    }
    return o;
}

#endif /* KCG_BASE64_H */
