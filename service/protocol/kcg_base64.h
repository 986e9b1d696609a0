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

static void
kcg_b64_init(void)
{
    for (int v = 0; v < 4096; v++) {
        kcg_b64_pairs[2 * v] = kcg_b64_alphabet[v >> 6];
        kcg_b64_pairs[2 * v + 1] = kcg_b64_alphabet[v & 63];
    }
    memset(kcg_b64_value, -1, sizeof kcg_b64_value);
    for (int i = 0; i < 64; i++)
        kcg_b64_value[(unsigned char)kcg_b64_alphabet[i]] = (signed char)i;
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
