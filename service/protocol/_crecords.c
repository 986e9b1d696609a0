/*
 * Optional accelerator for service/protocol/records.py: decodes the records section of a
 * (decompressed) magic-2 record batch into a list of Record tuples.
 *
 * decode_records(buf, start, end, count, base_offset, base_timestamp, append_timestamp, record_type)
 *   buf               any object exporting a contiguous byte buffer
 *   start, end        the section's bounds inside buf
 *   count             the batch header's records count
 *   base_offset       absolute offset = base_offset + offset delta
 *   base_timestamp    absolute timestamp = base_timestamp + timestamp delta ...
 *   append_timestamp  ... unless this is not None (log-append time): then every record gets it
 *   record_type       tuple or a tuple subclass without extra fields (a NamedTuple) of 5 items:
 *                     (offset, timestamp, key, value, headers); headers is a tuple of
 *                     (str, bytes | None) pairs, the shared empty tuple when there are none
 *
 * Malformed input raises ValueError; the Python caller turns it into CorruptRecordError.
 * Must behave exactly like records._decode_section_py (the tests run both against the same data).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "kcg_base64.h"

#define MIN_RECORD_SIZE 7

typedef struct {
    const unsigned char *p;
    Py_ssize_t pos;
    Py_ssize_t end; /* reads must stay below this */
} cursor;

/* Zigzag varint (up to 10 bytes). Returns 0, or -1 with a ValueError set. */
static inline int
read_varint(cursor *c, int64_t *out, Py_ssize_t index)
{
    const unsigned char *p = c->p;
    Py_ssize_t pos = c->pos;
    if (pos < c->end && p[pos] < 0x80) {
        uint64_t u = p[pos];
        c->pos = pos + 1;
        *out = (int64_t)(u >> 1) ^ -(int64_t)(u & 1);
        return 0;
    }
    uint64_t result = 0;
    int shift = 0;
    while (pos < c->end) {
        unsigned char b = p[pos++];
        result |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            c->pos = pos;
            *out = (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
            return 0;
        }
        shift += 7;
        if (shift > 63) {
            PyErr_Format(PyExc_ValueError, "record %zd: varint is too long", index);
            return -1;
        }
    }
    PyErr_Format(PyExc_ValueError, "record %zd runs past the end of the batch", index);
    return -1;
}

/* Nullable bytes field (varint length, -1 = null). New reference or NULL with an error set. */
static inline PyObject *
read_nullable_bytes(cursor *c, Py_ssize_t index, const char *what)
{
    int64_t n;
    if (read_varint(c, &n, index) < 0)
        return NULL;
    if (n >= 0) {
        if (n > c->end - c->pos) {
            PyErr_Format(PyExc_ValueError, "record %zd: %s length %lld runs past the record",
                         index, what, (long long)n);
            return NULL;
        }
        PyObject *v = PyBytes_FromStringAndSize((const char *)c->p + c->pos, (Py_ssize_t)n);
        c->pos += (Py_ssize_t)n;
        return v;
    }
    if (n == -1)
        Py_RETURN_NONE;
    PyErr_Format(PyExc_ValueError, "record %zd has a bad %s length %lld", index, what, (long long)n);
    return NULL;
}

/* Headers as a tuple of (str, bytes | None) pairs; everything immutable, so nothing is GC-tracked. */
static PyObject *
read_headers(cursor *c, int64_t n, Py_ssize_t index)
{
    if (n < 0 || n > (c->end - c->pos) / 2) {
        PyErr_Format(PyExc_ValueError, "record %zd has a bad header count %lld", index, (long long)n);
        return NULL;
    }
    PyObject *headers = PyTuple_New((Py_ssize_t)n);
    if (headers == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < (Py_ssize_t)n; i++) {
        int64_t klen;
        if (read_varint(c, &klen, index) < 0)
            goto fail;
        if (klen < 0 || klen > c->end - c->pos) {
            PyErr_Format(PyExc_ValueError, "record %zd has a bad header key length %lld",
                         index, (long long)klen);
            goto fail;
        }
        PyObject *key = PyUnicode_DecodeUTF8((const char *)c->p + c->pos, (Py_ssize_t)klen, NULL);
        if (key == NULL)
            goto fail;
        c->pos += (Py_ssize_t)klen;
        PyObject *value = read_nullable_bytes(c, index, "header value");
        if (value == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        PyObject *pair = PyTuple_New(2);
        if (pair == NULL) {
            Py_DECREF(key);
            Py_DECREF(value);
            goto fail;
        }
        PyTuple_SET_ITEM(pair, 0, key);
        PyTuple_SET_ITEM(pair, 1, value);
        PyObject_GC_UnTrack(pair);
        PyTuple_SET_ITEM(headers, i, pair);
    }
    PyObject_GC_UnTrack(headers);
    return headers;
fail:
    Py_DECREF(headers);
    return NULL;
}

/* (offset, timestamp, key, value, headers) as a record of rtype (tuple or a field-less subclass); steals all
 * five references (any may be NULL after a failed conversion: then they are released and NULL returned).
 * Only ints, bytes, str, None and untracked tuples inside: the record can never be part of a reference cycle,
 * so it is kept out of the collector's way (large fetches otherwise spend about half their decode time in GC
 * passes). */
static PyObject *
make_record(PyTypeObject *rtype, PyObject *o, PyObject *t, PyObject *key, PyObject *value, PyObject *headers)
{
    PyObject *rec = (o && t && key && value && headers)
                        ? (rtype == &PyTuple_Type ? PyTuple_New(5) : rtype->tp_alloc(rtype, 5)) : NULL;
    if (rec == NULL) {
        Py_XDECREF(o);
        Py_XDECREF(t);
        Py_XDECREF(key);
        Py_XDECREF(value);
        Py_XDECREF(headers);
        return NULL;
    }
    PyTuple_SET_ITEM(rec, 0, o);
    PyTuple_SET_ITEM(rec, 1, t);
    PyTuple_SET_ITEM(rec, 2, key);
    PyTuple_SET_ITEM(rec, 3, value);
    PyTuple_SET_ITEM(rec, 4, headers);
    PyObject_GC_UnTrack(rec);
    return rec;
}

/* The five arguments naming a batch's records section: start, end, count, base offset, base timestamp, then
 * the LogAppendTime timestamp or None. 0 on success, -1 with an exception set. */
typedef struct {
    Py_ssize_t start, end, count;
    long long base_offset, base_timestamp, append_timestamp;
    int log_append;
} section_args_t;

static int
section_args(PyObject *const *args, section_args_t *a)
{
    a->start = PyLong_AsSsize_t(args[0]);
    a->end = PyLong_AsSsize_t(args[1]);
    a->count = PyLong_AsSsize_t(args[2]);
    a->base_offset = PyLong_AsLongLong(args[3]);
    a->base_timestamp = PyLong_AsLongLong(args[4]);
    if (PyErr_Occurred())
        return -1;
    a->log_append = args[5] != Py_None;
    a->append_timestamp = 0;
    if (a->log_append) {
        a->append_timestamp = PyLong_AsLongLong(args[5]);
        if (a->append_timestamp == -1 && PyErr_Occurred())
            return -1;
    }
    return 0;
}

static PyObject *
decode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "decode_records() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    section_args_t sa;
    if (section_args(args + 1, &sa) < 0)
        return NULL;
    Py_ssize_t start = sa.start, end = sa.end, count = sa.count;
    long long base_offset = sa.base_offset, base_timestamp = sa.base_timestamp;
    int log_append = sa.log_append;
    long long append_timestamp = sa.append_timestamp;
    PyObject *rtype_obj = args[7];
    if (!PyType_Check(rtype_obj) || !PyType_IsSubtype((PyTypeObject *)rtype_obj, &PyTuple_Type)
        || ((PyTypeObject *)rtype_obj)->tp_basicsize != PyTuple_Type.tp_basicsize
        || ((PyTypeObject *)rtype_obj)->tp_itemsize != PyTuple_Type.tp_itemsize) {
        PyErr_SetString(PyExc_TypeError, "record_type must be tuple or a field-less tuple subclass");
        return NULL;
    }
    PyTypeObject *rtype = (PyTypeObject *)rtype_obj;

    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *out = NULL;
    if (start < 0 || end < start || end > view.len) {
        PyErr_SetString(PyExc_ValueError, "section bounds are outside the buffer");
        goto done;
    }
    if (count < 0) {
        PyErr_Format(PyExc_ValueError, "negative records count %zd", count);
        goto done;
    }
    if (count > (end - start) / MIN_RECORD_SIZE) {
        PyErr_Format(PyExc_ValueError, "records count %zd cannot fit in %zd bytes", count, end - start);
        goto done;
    }
    out = PyList_New(count);
    if (out == NULL)
        goto done;

    const unsigned char *p = (const unsigned char *)view.buf;
    Py_ssize_t pos = start;
    PyObject *last_ts = NULL;
    long long last_ts_value = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        cursor c = {p, pos, end};
        int64_t length, ts_delta, off_delta, hcount;
        if (read_varint(&c, &length, i) < 0)
            goto fail;
        if (length < MIN_RECORD_SIZE - 1 || length > end - c.pos) {
            PyErr_Format(PyExc_ValueError, "record %zd has a bad length %lld", i, (long long)length);
            goto fail;
        }
        Py_ssize_t rec_end = c.pos + (Py_ssize_t)length;
        c.end = rec_end;
        c.pos += 1; /* attributes: unused */
        if (read_varint(&c, &ts_delta, i) < 0 || read_varint(&c, &off_delta, i) < 0)
            goto fail;
        PyObject *key = read_nullable_bytes(&c, i, "key");
        if (key == NULL)
            goto fail;
        PyObject *value = read_nullable_bytes(&c, i, "value");
        if (value == NULL) {
            Py_DECREF(key);
            goto fail;
        }
        PyObject *headers = NULL;
        if (read_varint(&c, &hcount, i) == 0)
            headers = hcount == 0 ? PyTuple_New(0) : read_headers(&c, hcount, i);
        if (headers == NULL) {
            Py_DECREF(key);
            Py_DECREF(value);
            goto fail;
        }
        if (c.pos != rec_end) {
            PyErr_Format(PyExc_ValueError, "record %zd: fields take %zd bytes, its length says %lld",
                         i, c.pos - rec_end + (Py_ssize_t)length, (long long)length);
            Py_DECREF(key);
            Py_DECREF(value);
            Py_DECREF(headers);
            goto fail;
        }
        /* unsigned arithmetic: corrupt deltas must not be undefined behaviour */
        long long offset = (long long)((uint64_t)base_offset + (uint64_t)off_delta);
        long long timestamp = log_append ? append_timestamp
                                         : (long long)((uint64_t)base_timestamp + (uint64_t)ts_delta);
        PyObject *o = PyLong_FromLongLong(offset);
        /* records of a batch mostly share their timestamp: one int object for a run of equal ones */
        PyObject *t;
        if (last_ts != NULL && timestamp == last_ts_value) {
            t = Py_NewRef(last_ts);
        } else {
            t = PyLong_FromLongLong(timestamp);
            if (t != NULL) {
                last_ts = t; /* borrowed: the record made below (or the list) keeps it alive */
                last_ts_value = timestamp;
            }
        }
        PyObject *rec = make_record(rtype, o, t, key, value, headers);
        if (rec == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, rec);
        pos = rec_end;
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "%zd bytes left over after %zd records", end - pos, count);
        goto fail;
    }
    goto done;
fail:
    Py_CLEAR(out); /* unfilled slots are NULL, which list dealloc skips */
done:
    PyBuffer_Release(&view);
    return out;
}


/* ---- rendering: the gateway's binary-format JSON, one buffer for many records ---------------------- */

static inline char *
put_raw(char *o, const char *s, Py_ssize_t n)
{
    memcpy(o, s, (size_t)n);
    return o + n;
}

#define PUT_LIT(o, lit) put_raw((o), (lit), (Py_ssize_t)(sizeof(lit) - 1))

static inline char *
put_i64(char *o, long long v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + (u % 10));
        u /= 10;
    } while (u);
    if (v < 0)
        *o++ = '-';
    while (n)
        *o++ = tmp[--n];
    return o;
}

/* A JSON string of bytes object or None: "base64" or null. */
static inline char *
put_b64_or_null(char *o, PyObject *v)
{
    if (v == Py_None)
        return PUT_LIT(o, "null");
    *o++ = '"';
    o = kcg_b64_put(o, (const unsigned char *)PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
    *o++ = '"';
    return o;
}

static const char HEX[] = "0123456789abcdef";

/* UTF-8 text as a JSON string body (valid UTF-8 passes through; quote, backslash and controls escaped). */
static inline char *
put_json_text(char *o, const char *s, Py_ssize_t n)
{
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)s[i];
        if (ch == '"' || ch == '\\') {
            *o++ = '\\';
            *o++ = (char)ch;
        } else if (ch < 0x20) {
            *o++ = '\\';
            switch (ch) {
            case '\n': *o++ = 'n'; break;
            case '\r': *o++ = 'r'; break;
            case '\t': *o++ = 't'; break;
            case '\b': *o++ = 'b'; break;
            case '\f': *o++ = 'f'; break;
            default:
                *o++ = 'u'; *o++ = '0'; *o++ = '0';
                *o++ = HEX[ch >> 4];
                *o++ = HEX[ch & 15];
            }
        } else {
            *o++ = (char)ch;
        }
    }
    return o;
}

static int
check_bytes_or_none(PyObject *v, Py_ssize_t index, const char *what)
{
    if (v == Py_None || PyBytes_Check(v))
        return 0;
    PyErr_Format(PyExc_TypeError, "record %zd: %s must be bytes or None", index, what);
    return -1;
}


/* ---- json format: strict RFC 8259 validation, compaction, rendering -------------------------------- */

#define JSON_MAX_DEPTH 512

typedef struct {
    const unsigned char *p;
    Py_ssize_t i, n;
    int ws; /* whitespace outside strings was skipped (the text is not already compact) */
} jcur;

static inline void
j_ws(jcur *c)
{
    while (c->i < c->n) {
        unsigned char ch = c->p[c->i];
        if (ch != ' ' && ch != '\t' && ch != '\n' && ch != '\r')
            return;
        c->ws = 1;
        c->i++;
    }
}

static inline int
j_hex4(jcur *c, unsigned *out)
{
    if (c->n - c->i < 4)
        return 0;
    unsigned v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char ch = c->p[c->i++];
        v <<= 4;
        if (ch >= '0' && ch <= '9')
            v |= (unsigned)(ch - '0');
        else if (ch >= 'a' && ch <= 'f')
            v |= (unsigned)(ch - 'a' + 10);
        else if (ch >= 'A' && ch <= 'F')
            v |= (unsigned)(ch - 'A' + 10);
        else
            return 0;
    }
    *out = v;
    return 1;
}

/* One UTF-8 sequence starting at c->i (a byte >= 0x80): strict (no overlongs, surrogates, > U+10FFFF). */
static inline int
j_utf8(jcur *c)
{
    const unsigned char *p = c->p;
    Py_ssize_t i = c->i, n = c->n;
    unsigned char b0 = p[i];
    int len;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b0 >= 0xC2 && b0 <= 0xDF)
        len = 2;
    else if (b0 >= 0xE0 && b0 <= 0xEF) {
        len = 3;
        if (b0 == 0xE0)
            lo = 0xA0;
        else if (b0 == 0xED)
            hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
        len = 4;
        if (b0 == 0xF0)
            lo = 0x90;
        else if (b0 == 0xF4)
            hi = 0x8F;
    } else
        return 0;
    if (n - i < len)
        return 0;
    if (p[i + 1] < lo || p[i + 1] > hi)
        return 0;
    for (int k = 2; k < len; k++)
        if (p[i + k] < 0x80 || p[i + k] > 0xBF)
            return 0;
    c->i = i + len;
    return 1;
}

/* 1 for the bytes a JSON string holds as they are: printable ASCII but the quote and the backslash */
static unsigned char j_plain[256]; /* filled once by PyInit__crecords */

static void
init_j_plain(void)
{
    for (int ch = 0x20; ch < 0x80; ch++)
        j_plain[ch] = ch != '"' && ch != '\\';
}

static int
j_string(jcur *c)
{
    c->i++; /* opening quote */
    while (c->i < c->n) {
        /* runs of plain bytes: one table lookup each (most of a JSON document's bytes) */
        const unsigned char *p = c->p;
        Py_ssize_t i = c->i, n = c->n;
        while (i < n && j_plain[p[i]])
            i++;
        c->i = i;
        if (i >= n)
            break;
        unsigned char ch = p[i];
        if (ch == '"') {
            c->i++;
            return 1;
        }
        if (ch < 0x20)
            return 0;
        if (ch == '\\') {
            c->i++;
            if (c->i >= c->n)
                return 0;
            ch = c->p[c->i++];
            if (ch == 'u') {
                unsigned u;
                if (!j_hex4(c, &u))
                    return 0;
                if (u >= 0xDC00 && u <= 0xDFFF)
                    return 0; /* lone trailing surrogate */
                if (u >= 0xD800 && u <= 0xDBFF) {
                    unsigned u2;
                    if (c->n - c->i < 6 || c->p[c->i] != '\\' || c->p[c->i + 1] != 'u')
                        return 0;
                    c->i += 2;
                    if (!j_hex4(c, &u2) || u2 < 0xDC00 || u2 > 0xDFFF)
                        return 0;
                }
            } else if (!(ch == '"' || ch == '\\' || ch == '/' || ch == 'b' || ch == 'f' || ch == 'n'
                         || ch == 'r' || ch == 't'))
                return 0;
        } else if (ch >= 0x80) {
            if (!j_utf8(c))
                return 0;
        } else
            c->i++;
    }
    return 0;
}

static inline int
j_digits(jcur *c)
{
    Py_ssize_t start = c->i;
    while (c->i < c->n && c->p[c->i] >= '0' && c->p[c->i] <= '9')
        c->i++;
    return c->i > start;
}

/* The smallest decimal that rounds to infinity as a double (round-half-even): 2^1024 - 2^970, 309 digits.
 * A JSON number at or above it in magnitude does not fit a double: orjson (the Python twin) and strict
 * parsers refuse it, so it is not valid JSON here either. Underflow (1e-400) reads as 0 there: valid. */
static const char DBL_OVERFLOW_DIGITS[] =
    "179769313486231580793728971405303415079934132710037826936173778980444968292764750946649017"
    "977587207096330286416692887910946555547851940402630657488671505820681908902000708383676273"
    "854845817711531764475730270069855571366959622842914819860834936475292719074168444365510704"
    "342711559699508093042880177904174497792";

/* Whether the number with integer digits p[a:b], fraction digits p[f:g] and decimal exponent exp (saturated)
 * fits a double, i.e. its magnitude is below DBL_OVERFLOW_DIGITS x 10^0. */
static int
j_number_fits(const unsigned char *p, Py_ssize_t a, Py_ssize_t b, Py_ssize_t f, Py_ssize_t g, int64_t exp)
{
    Py_ssize_t first = a; /* the first significant digit, across the integer and fraction digits */
    int64_t mag;          /* the value is in [10^mag, 10^(mag+1)) */
    while (first < b && p[first] == '0')
        first++;
    if (first < b) {
        mag = (int64_t)(b - first) - 1 + exp;
    } else {
        first = f;
        while (first < g && p[first] == '0')
            first++;
        if (first >= g)
            return 1; /* zero */
        mag = -(int64_t)(first - f) - 1 + exp;
    }
    if (mag < 308)
        return 1;
    if (mag > 308)
        return 0;
    /* 309 integer digits: compare the significant digits with the threshold's */
    const Py_ssize_t tn = (Py_ssize_t)sizeof(DBL_OVERFLOW_DIGITS) - 1;
    Py_ssize_t k = 0;
    for (Py_ssize_t i = first; i < g; i++) {
        if (i == b) { /* skip the '.' between the integer and the fraction digits */
            i = f;
            if (i >= g)
                break;
        }
        unsigned char d = p[i];
        if (k < tn) {
            if (d != (unsigned char)DBL_OVERFLOW_DIGITS[k])
                return d < (unsigned char)DBL_OVERFLOW_DIGITS[k];
        } else if (d != '0') {
            return 0; /* above the threshold */
        }
        k++;
    }
    for (; k < tn; k++) /* the digits ran out first: below unless the threshold's rest is all zeros */
        if (DBL_OVERFLOW_DIGITS[k] != '0')
            return 1;
    return 0; /* equal: rounds to infinity */
}

static int
j_number(jcur *c)
{
    if (c->p[c->i] == '-')
        c->i++;
    if (c->i >= c->n)
        return 0;
    Py_ssize_t a = c->i;
    if (c->p[c->i] == '0')
        c->i++;
    else if (!j_digits(c))
        return 0;
    Py_ssize_t b = c->i, f = c->i, g = c->i;
    if (c->i < c->n && c->p[c->i] == '.') {
        c->i++;
        f = c->i;
        if (!j_digits(c))
            return 0;
        g = c->i;
    }
    int64_t exp = 0;
    if (c->i < c->n && (c->p[c->i] == 'e' || c->p[c->i] == 'E')) {
        c->i++;
        int neg = 0;
        if (c->i < c->n && (c->p[c->i] == '+' || c->p[c->i] == '-'))
            neg = c->p[c->i++] == '-';
        Py_ssize_t e0 = c->i;
        if (!j_digits(c))
            return 0;
        for (Py_ssize_t i = e0; i < c->i; i++)
            if (exp < ((int64_t)1 << 48)) /* saturates far beyond any double's range, far below overflow */
                exp = exp * 10 + (c->p[i] - '0');
        if (neg)
            exp = -exp;
    }
    return j_number_fits(c->p, a, b, f, g, exp);
}

static inline int
j_lit(jcur *c, const char *lit, Py_ssize_t len)
{
    if (c->n - c->i < len || memcmp(c->p + c->i, lit, (size_t)len) != 0)
        return 0;
    c->i += len;
    return 1;
}

static int
j_value(jcur *c, int depth)
{
    j_ws(c);
    if (c->i >= c->n)
        return 0;
    unsigned char ch = c->p[c->i];
    switch (ch) {
    case '"':
        return j_string(c);
    case 't':
        return j_lit(c, "true", 4);
    case 'f':
        return j_lit(c, "false", 5);
    case 'n':
        return j_lit(c, "null", 4);
    case '[':
    case '{': {
        if (depth >= JSON_MAX_DEPTH)
            return 0;
        unsigned char close = ch == '[' ? ']' : '}';
        c->i++;
        j_ws(c);
        if (c->i < c->n && c->p[c->i] == close) {
            c->i++;
            return 1;
        }
        for (;;) {
            if (ch == '{') {
                j_ws(c);
                if (c->i >= c->n || c->p[c->i] != '"' || !j_string(c))
                    return 0;
                j_ws(c);
                if (c->i >= c->n || c->p[c->i] != ':')
                    return 0;
                c->i++;
            }
            if (!j_value(c, depth + 1))
                return 0;
            j_ws(c);
            if (c->i >= c->n)
                return 0;
            if (c->p[c->i] == ',') {
                c->i++;
                continue;
            }
            if (c->p[c->i] == close) {
                c->i++;
                return 1;
            }
            return 0;
        }
    }
    default:
        if (ch == '-' || (ch >= '0' && ch <= '9'))
            return j_number(c);
        return 0;
    }
}

/* 1 if p[0:n] is exactly one JSON text (RFC 8259, UTF-8, surrounding whitespace allowed), else 0. */
static int
json_valid_ws(const unsigned char *p, Py_ssize_t n, int *ws)
{
    jcur c = {p, 0, n, 0};
    if (!j_value(&c, 0))
        return 0;
    j_ws(&c);
    *ws = c.ws;
    return c.i == n;
}

static int
json_valid(const unsigned char *p, Py_ssize_t n)
{
    int ws;
    return json_valid_ws(p, n, &ws);
}

/* Copy a valid JSON text without the whitespace outside its strings. */
static inline char *
put_json_compact(char *o, const unsigned char *p, Py_ssize_t n)
{
    int in_str = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char ch = p[i];
        if (in_str) {
            *o++ = (char)ch;
            if (ch == '\\') {
                *o++ = (char)p[++i];
            } else if (ch == '"')
                in_str = 0;
        } else if (ch == ' ' || ch == '\t' || ch == '\n' || ch == '\r') {
            continue;
        } else {
            *o++ = (char)ch;
            if (ch == '"')
                in_str = 1;
        }
    }
    return o;
}

/* "<name>":<compact JSON>  or  "<name>":null,"<name>_error":"not valid JSON","<name>_base64":"..." */
/* the field from raw bytes (n < 0: null), shared by record tuples and record runs */
static inline char *
put_json_field_raw(char *o, const char *name, Py_ssize_t name_len, const unsigned char *p, Py_ssize_t n)
{
    *o++ = '"';
    o = put_raw(o, name, name_len);
    o = PUT_LIT(o, "\":");
    if (n < 0)
        return PUT_LIT(o, "null");
    int ws;
    if (json_valid_ws(p, n, &ws))
        return ws ? put_json_compact(o, p, n) : put_raw(o, (const char *)p, n); /* compact already: copied */
    o = PUT_LIT(o, "null,\"");
    o = put_raw(o, name, name_len);
    o = PUT_LIT(o, "_error\":\"not valid JSON\",\"");
    o = put_raw(o, name, name_len);
    o = PUT_LIT(o, "_base64\":\"");
    o = kcg_b64_put(o, p, n);
    *o++ = '"';
    return o;
}

static inline char *
put_json_field(char *o, const char *name, Py_ssize_t name_len, PyObject *v)
{
    if (v == Py_None)
        return put_json_field_raw(o, name, name_len, NULL, -1);
    return put_json_field_raw(o, name, name_len, (const unsigned char *)PyBytes_AS_STRING(v),
                              PyBytes_GET_SIZE(v));
}

static PyObject *
py_json_valid(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_buffer view;
    if (PyObject_GetBuffer(arg, &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int ok = json_valid((const unsigned char *)view.buf, view.len);
    PyBuffer_Release(&view);
    return PyBool_FromLong(ok);
}

/* ---- record runs: a partition's records as an index into one bytes object ---------------------------
 *
 * RecordRun(data: bytes, record_type) is a read-only sequence of records that keeps the records section(s)
 * it was built from (data) and, per record, where its fields are: no Python object per record until one is
 * asked for (run[i] builds the record_type tuple then, equal to what decode_records makes). render,
 * render_framed and take_budget read the fields straight from data. Built by run.add(...) once per
 * uncompressed batch (the same checks as decode_records), before any slice is taken; run[i:j] is a view
 * sharing the index. Compares equal to a list of equal records.
 */
typedef struct {
    int64_t offset, ts;
    Py_ssize_t kpos, klen; /* klen -1: null */
    Py_ssize_t vpos, vlen;
    Py_ssize_t hpos, hcount; /* hpos: the first header's bytes (after the count varint) */
} rent;

typedef struct {
    PyObject_HEAD
    PyObject *data;  /* bytes */
    PyObject *rtype; /* the record type (tuple or a field-less tuple subclass) */
    PyObject *root;  /* NULL for a root run; else the root run, which owns ents */
    rent *ents;
    Py_ssize_t n, cap;
    Py_ssize_t views; /* root: slices made (then add() is refused: ents may not move) */
} RunObject;

static PyTypeObject RunType;

#define Run_Check(o) (Py_TYPE(o) == &RunType)
/* records: a list or a run */
#define RECORDS_LEN(o) (Run_Check(o) ? ((RunObject *)(o))->n : PyList_GET_SIZE(o))

static int
check_record_type(PyObject *rtype_obj)
{
    if (!PyType_Check(rtype_obj) || !PyType_IsSubtype((PyTypeObject *)rtype_obj, &PyTuple_Type)
        || ((PyTypeObject *)rtype_obj)->tp_basicsize != PyTuple_Type.tp_basicsize
        || ((PyTypeObject *)rtype_obj)->tp_itemsize != PyTuple_Type.tp_itemsize) {
        PyErr_SetString(PyExc_TypeError, "record_type must be tuple or a field-less tuple subclass");
        return -1;
    }
    return 0;
}

static PyObject *
run_new(PyTypeObject *type, PyObject *args, PyObject *kwds)
{
    PyObject *data, *rtype;
    if (kwds != NULL && PyDict_GET_SIZE(kwds)) {
        PyErr_SetString(PyExc_TypeError, "RecordRun() takes no keyword arguments");
        return NULL;
    }
    if (!PyArg_ParseTuple(args, "SO:RecordRun", &data, &rtype))
        return NULL;
    if (check_record_type(rtype) < 0)
        return NULL;
    RunObject *self = (RunObject *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->data = Py_NewRef(data);
    self->rtype = Py_NewRef(rtype);
    return (PyObject *)self;
}

static void
run_dealloc(RunObject *self)
{
    if (self->root == NULL)
        PyMem_Free(self->ents);
    Py_XDECREF(self->root);
    Py_XDECREF(self->data);
    Py_XDECREF(self->rtype);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* nullable bytes field: position and length (-1: null) without copying */
static inline int
skip_nullable(cursor *c, Py_ssize_t index, const char *what, Py_ssize_t *pos, Py_ssize_t *len)
{
    int64_t n;
    if (read_varint(c, &n, index) < 0)
        return -1;
    if (n >= 0) {
        if (n > c->end - c->pos) {
            PyErr_Format(PyExc_ValueError, "record %zd: %s length %lld runs past the record",
                         index, what, (long long)n);
            return -1;
        }
        *pos = c->pos;
        *len = (Py_ssize_t)n;
        c->pos += (Py_ssize_t)n;
        return 0;
    }
    if (n == -1) {
        *pos = c->pos;
        *len = -1;
        return 0;
    }
    PyErr_Format(PyExc_ValueError, "record %zd has a bad %s length %lld", index, what, (long long)n);
    return -1;
}

/* run.add(start, end, count, base_offset, base_timestamp, append_timestamp) -> (first offset, last offset)
 * One uncompressed batch's records section data[start:end], checked as decode_records checks it (header
 * keys must be UTF-8); ValueError leaves the run as it was. count must be positive. */
static PyObject *
run_add(RunObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 6) {
        PyErr_Format(PyExc_TypeError, "add() takes 6 arguments (%zd given)", nargs);
        return NULL;
    }
    if (self->root != NULL || self->views) {
        PyErr_SetString(PyExc_TypeError, "add() on a run that has been sliced");
        return NULL;
    }
    section_args_t sa;
    if (section_args(args, &sa) < 0)
        return NULL;
    Py_ssize_t start = sa.start, end = sa.end, count = sa.count;
    long long base_offset = sa.base_offset, base_timestamp = sa.base_timestamp;
    int log_append = sa.log_append;
    long long append_timestamp = sa.append_timestamp;
    Py_ssize_t len = PyBytes_GET_SIZE(self->data);
    if (start < 0 || end < start || end > len) {
        PyErr_SetString(PyExc_ValueError, "section bounds are outside the buffer");
        return NULL;
    }
    if (count <= 0) {
        PyErr_Format(PyExc_ValueError, "records count %zd: a run holds batches with records", count);
        return NULL;
    }
    if (count > (end - start) / MIN_RECORD_SIZE) {
        PyErr_Format(PyExc_ValueError, "records count %zd cannot fit in %zd bytes", count, end - start);
        return NULL;
    }
    if (self->n + count > self->cap) {
        Py_ssize_t cap = self->cap ? self->cap : 256;
        while (cap < self->n + count)
            cap *= 2;
        rent *e = PyMem_Realloc(self->ents, (size_t)cap * sizeof(rent));
        if (e == NULL)
            return PyErr_NoMemory();
        self->ents = e;
        self->cap = cap;
    }
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(self->data);
    Py_ssize_t pos = start;
    rent *out = self->ents + self->n;
    for (Py_ssize_t i = 0; i < count; i++) {
        cursor c = {p, pos, end};
        int64_t length, ts_delta, off_delta, hcount;
        rent *e = out + i;
        if (read_varint(&c, &length, i) < 0)
            return NULL;
        if (length < MIN_RECORD_SIZE - 1 || length > end - c.pos) {
            PyErr_Format(PyExc_ValueError, "record %zd has a bad length %lld", i, (long long)length);
            return NULL;
        }
        Py_ssize_t rec_end = c.pos + (Py_ssize_t)length;
        c.end = rec_end;
        c.pos += 1; /* attributes: unused */
        if (read_varint(&c, &ts_delta, i) < 0 || read_varint(&c, &off_delta, i) < 0)
            return NULL;
        if (skip_nullable(&c, i, "key", &e->kpos, &e->klen) < 0
            || skip_nullable(&c, i, "value", &e->vpos, &e->vlen) < 0)
            return NULL;
        if (read_varint(&c, &hcount, i) < 0)
            return NULL;
        e->hpos = c.pos;
        e->hcount = 0;
        if (hcount) {
            if (hcount < 0 || hcount > (c.end - c.pos) / 2) {
                PyErr_Format(PyExc_ValueError, "record %zd has a bad header count %lld", i, (long long)hcount);
                return NULL;
            }
            for (int64_t h = 0; h < hcount; h++) {
                int64_t klen;
                Py_ssize_t vpos, vlen;
                if (read_varint(&c, &klen, i) < 0)
                    return NULL;
                if (klen < 0 || klen > c.end - c.pos) {
                    PyErr_Format(PyExc_ValueError, "record %zd has a bad header key length %lld",
                                 i, (long long)klen);
                    return NULL;
                }
                PyObject *key = PyUnicode_DecodeUTF8((const char *)p + c.pos, (Py_ssize_t)klen, NULL);
                if (key == NULL)
                    return NULL;
                Py_DECREF(key);
                c.pos += (Py_ssize_t)klen;
                if (skip_nullable(&c, i, "header value", &vpos, &vlen) < 0)
                    return NULL;
            }
            e->hcount = (Py_ssize_t)hcount;
        }
        if (c.pos != rec_end) {
            PyErr_Format(PyExc_ValueError, "record %zd: fields take %zd bytes, its length says %lld",
                         i, c.pos - rec_end + (Py_ssize_t)length, (long long)length);
            return NULL;
        }
        e->offset = (int64_t)((uint64_t)base_offset + (uint64_t)off_delta);
        e->ts = log_append ? append_timestamp : (int64_t)((uint64_t)base_timestamp + (uint64_t)ts_delta);
        pos = rec_end;
    }
    if (pos != end) {
        PyErr_Format(PyExc_ValueError, "%zd bytes left over after %zd records", end - pos, count);
        return NULL;
    }
    self->n += count;
    return Py_BuildValue("(LL)", (long long)out[0].offset, (long long)out[count - 1].offset);
}

static Py_ssize_t
run_length(RunObject *self)
{
    return self->n;
}

static PyObject *
run_bytes_field(const unsigned char *p, Py_ssize_t pos, Py_ssize_t len)
{
    if (len < 0)
        Py_RETURN_NONE;
    return PyBytes_FromStringAndSize((const char *)p + pos, len);
}

/* the record tuple of entry e, as decode_records builds it */
static PyObject *
run_record(RunObject *self, const rent *e)
{
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(self->data);
    PyObject *o = PyLong_FromLongLong(e->offset);
    PyObject *t = PyLong_FromLongLong(e->ts);
    PyObject *key = run_bytes_field(p, e->kpos, e->klen);
    PyObject *value = run_bytes_field(p, e->vpos, e->vlen);
    PyObject *headers = NULL;
    if (e->hcount == 0) {
        headers = PyTuple_New(0);
    } else {
        cursor c = {p, e->hpos, PyBytes_GET_SIZE(self->data)};
        headers = read_headers(&c, e->hcount, 0);
    }
    return make_record((PyTypeObject *)self->rtype, o, t, key, value, headers);
}

static PyObject *
run_item(RunObject *self, Py_ssize_t i)
{
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "record run index out of range");
        return NULL;
    }
    return run_record(self, self->ents + i);
}

static PyObject *
run_view(RunObject *self, Py_ssize_t i, Py_ssize_t j)
{
    RunObject *root = self->root != NULL ? (RunObject *)self->root : self;
    RunObject *v = (RunObject *)RunType.tp_alloc(&RunType, 0);
    if (v == NULL)
        return NULL;
    v->data = Py_NewRef(self->data);
    v->rtype = Py_NewRef(self->rtype);
    v->root = Py_NewRef((PyObject *)root);
    v->ents = self->ents + i;
    v->n = j - i;
    v->cap = 0;
    root->views++;
    return (PyObject *)v;
}

static PyObject *
run_subscript(RunObject *self, PyObject *key)
{
    if (PyIndex_Check(key)) {
        Py_ssize_t i = PyNumber_AsSsize_t(key, PyExc_IndexError);
        if (i == -1 && PyErr_Occurred())
            return NULL;
        if (i < 0)
            i += self->n;
        return run_item(self, i);
    }
    if (PySlice_Check(key)) {
        Py_ssize_t start, stop, step;
        if (PySlice_Unpack(key, &start, &stop, &step) < 0)
            return NULL;
        Py_ssize_t len = PySlice_AdjustIndices(self->n, &start, &stop, step);
        if (step == 1)
            return run_view(self, start, start + len);
        PyObject *out = PyList_New(len);
        if (out == NULL)
            return NULL;
        for (Py_ssize_t k = 0, i = start; k < len; k++, i += step) {
            PyObject *r = run_record(self, self->ents + i);
            if (r == NULL) {
                Py_DECREF(out);
                return NULL;
            }
            PyList_SET_ITEM(out, k, r);
        }
        return out;
    }
    PyErr_Format(PyExc_TypeError, "record run indices must be integers or slices, not %.200s",
                 Py_TYPE(key)->tp_name);
    return NULL;
}

static PyObject *
run_richcompare(PyObject *a, PyObject *b, int op)
{
    if ((op != Py_EQ && op != Py_NE) || !Run_Check(a) || !(Run_Check(b) || PyList_Check(b)))
        Py_RETURN_NOTIMPLEMENTED;
    Py_ssize_t n = PyObject_Length(b);
    if (n < 0)
        return NULL;
    int eq = n == ((RunObject *)a)->n;
    for (Py_ssize_t i = 0; eq && i < n; i++) {
        PyObject *x = run_item((RunObject *)a, i);
        PyObject *y = x ? PySequence_GetItem(b, i) : NULL;
        int r = y ? PyObject_RichCompareBool(x, y, Py_EQ) : -1;
        Py_XDECREF(x);
        Py_XDECREF(y);
        if (r < 0)
            return NULL;
        eq = r;
    }
    return PyBool_FromLong(op == Py_EQ ? eq : !eq);
}

static PyObject *
run_repr(RunObject *self)
{
    if (self->n == 0)
        return PyUnicode_FromString("<RecordRun 0 records>");
    return PyUnicode_FromFormat("<RecordRun %zd records, offsets %lld..%lld>", self->n,
                                (long long)self->ents[0].offset, (long long)self->ents[self->n - 1].offset);
}

/* run.payload(i=0) -> key + value bytes of run[i:] */
static PyObject *
run_payload(RunObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    Py_ssize_t i = 0;
    if (nargs > 1) {
        PyErr_SetString(PyExc_TypeError, "payload([i])");
        return NULL;
    }
    if (nargs == 1) {
        i = PyLong_AsSsize_t(args[0]);
        if (i == -1 && PyErr_Occurred())
            return NULL;
    }
    if (i < 0 || i > self->n) {
        PyErr_Format(PyExc_IndexError, "payload(%zd): not an index of the %zd records", i, self->n);
        return NULL;
    }
    long long total = 0;
    for (; i < self->n; i++) {
        const rent *e = self->ents + i;
        total += (e->klen > 0 ? e->klen : 0) + (e->vlen > 0 ? e->vlen : 0);
    }
    return PyLong_FromLongLong(total);
}

/* run.offset(i) -> the offset of run[i] without building the record */
static PyObject *
run_offset(RunObject *self, PyObject *arg)
{
    Py_ssize_t i = PyLong_AsSsize_t(arg);
    if (i == -1 && PyErr_Occurred())
        return NULL;
    if (i < 0)
        i += self->n;
    if (i < 0 || i >= self->n) {
        PyErr_SetString(PyExc_IndexError, "record run index out of range");
        return NULL;
    }
    return PyLong_FromLongLong(self->ents[i].offset);
}

static PyMethodDef run_methods[] = {
    {"add", (PyCFunction)(void (*)(void))run_add, METH_FASTCALL,
     "add(start, end, count, base_offset, base_timestamp, append_timestamp) -> (first offset, last offset)"},
    {"payload", (PyCFunction)(void (*)(void))run_payload, METH_FASTCALL,
     "payload([i]) -> key + value bytes of run[i:]"},
    {"offset", (PyCFunction)run_offset, METH_O, "offset(i) -> run[i].offset"},
    {NULL, NULL, 0, NULL},
};

static PySequenceMethods run_as_sequence = {
    .sq_length = (lenfunc)run_length,
    .sq_item = (ssizeargfunc)run_item,
};

static PyMappingMethods run_as_mapping = {
    .mp_length = (lenfunc)run_length,
    .mp_subscript = (binaryfunc)run_subscript,
};

static PyTypeObject RunType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "service.protocol._crecords.RecordRun",
    .tp_basicsize = sizeof(RunObject),
    .tp_dealloc = (destructor)run_dealloc,
    .tp_repr = (reprfunc)run_repr,
    .tp_as_sequence = &run_as_sequence,
    .tp_as_mapping = &run_as_mapping,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "RecordRun(data: bytes, record_type): records indexed in data (see run.add)",
    .tp_richcompare = run_richcompare,
    .tp_methods = run_methods,
    .tp_new = run_new,
};

/* header bytes of a run entry: walk them (checked by add) */
static inline Py_ssize_t
run_headers_bound(const unsigned char *p, const rent *e, Py_ssize_t end)
{
    Py_ssize_t n = 0;
    cursor c = {p, e->hpos, end};
    for (Py_ssize_t h = 0; h < e->hcount; h++) {
        int64_t klen = 0;
        Py_ssize_t vpos = 0, vlen = -1;
        read_varint(&c, &klen, 0); /* add() checked these bytes: no error here */
        c.pos += (Py_ssize_t)klen;
        skip_nullable(&c, 0, "", &vpos, &vlen);
        n += 32 + 6 * (Py_ssize_t)klen + (vlen < 0 ? 0 : kcg_b64_len(vlen));
    }
    return n;
}

static Py_ssize_t
run_bound(RunObject *r, Py_ssize_t head_len, Py_ssize_t sep_len, int json, Py_ssize_t *payload)
{
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(r->data);
    Py_ssize_t end = PyBytes_GET_SIZE(r->data);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < r->n; i++) {
        const rent *e = r->ents + i;
        Py_ssize_t n = head_len + sep_len + 120;
        if (e->klen >= 0) {
            n += kcg_b64_len(e->klen) + (json ? e->klen + 80 : 0);
            *payload += e->klen;
        }
        if (e->vlen >= 0) {
            n += kcg_b64_len(e->vlen) + (json ? e->vlen + 80 : 0);
            *payload += e->vlen;
        }
        if (e->hcount)
            n += run_headers_bound(p, e, end);
        if (n > PY_SSIZE_T_MAX / 2 - total) {
            PyErr_NoMemory();
            return -1;
        }
        total += n;
    }
    return total;
}

static inline char *
put_b64_raw_or_null(char *o, const unsigned char *p, Py_ssize_t pos, Py_ssize_t len)
{
    if (len < 0)
        return PUT_LIT(o, "null");
    *o++ = '"';
    o = kcg_b64_put(o, p + pos, len);
    *o++ = '"';
    return o;
}

static char *
run_write(char *o, RunObject *r, PyObject *head, PyObject *sep, int json)
{
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(r->data);
    Py_ssize_t end = PyBytes_GET_SIZE(r->data);
    Py_ssize_t head_len = PyBytes_GET_SIZE(head), sep_len = PyBytes_GET_SIZE(sep);
    const char *hp = PyBytes_AS_STRING(head), *sp = PyBytes_AS_STRING(sep);
    for (Py_ssize_t i = 0; i < r->n; i++) {
        const rent *e = r->ents + i;
        if (i)
            o = put_raw(o, sp, sep_len);
        o = put_raw(o, hp, head_len);
        o = put_i64(o, e->offset);
        o = PUT_LIT(o, ",\"timestamp\":");
        o = put_i64(o, e->ts);
        if (json) {
            *o++ = ',';
            o = put_json_field_raw(o, "key", 3, p + e->kpos, e->klen);
            *o++ = ',';
            o = put_json_field_raw(o, "value", 5, p + e->vpos, e->vlen);
        } else {
            o = PUT_LIT(o, ",\"key\":");
            o = put_b64_raw_or_null(o, p, e->kpos, e->klen);
            o = PUT_LIT(o, ",\"value\":");
            o = put_b64_raw_or_null(o, p, e->vpos, e->vlen);
        }
        o = PUT_LIT(o, ",\"headers\":[");
        cursor c = {p, e->hpos, end};
        for (Py_ssize_t h = 0; h < e->hcount; h++) {
            int64_t klen = 0;
            Py_ssize_t vpos = 0, vlen = -1;
            read_varint(&c, &klen, 0); /* checked by add() */
            const char *k = (const char *)p + c.pos;
            c.pos += (Py_ssize_t)klen;
            skip_nullable(&c, 0, "", &vpos, &vlen);
            if (h)
                *o++ = ',';
            o = PUT_LIT(o, "{\"key\":\"");
            o = put_json_text(o, k, (Py_ssize_t)klen);
            o = PUT_LIT(o, "\",\"value\":");
            o = put_b64_raw_or_null(o, p, vpos, vlen);
            *o++ = '}';
        }
        o = PUT_LIT(o, "]}");
    }
    return o;
}

/*
 * render(records, head, sep, json) -> (bytes, payload)
 *   records  list of record tuples (offset, timestamp, key, value, headers) as decode_records makes
 *   head     bytes written before each record's offset, e.g. {"topic":"t","partition":0,"offset":
 *   sep      bytes written between two records
 * Each record becomes HEAD<offset>,"timestamp":<ts>,"key":<b64|null>,"value":<b64|null>,
 * "headers":[{"key":<json string>,"value":<b64|null>},...]}
 * With json true, key and value are embedded JSON instead of base64: a valid JSON text (RFC 8259) is
 * written without the whitespace outside its strings (so one record is one line); one that is not
 * JSON becomes null plus "<field>_error" and "<field>_base64". Header values are base64 either way.
 * payload is the sum of the key and value lengths (the bytes-delivered metric).
 */
/* pass 1 of render: validate one chunk's records and bound its rendered size (-1 with an error set) */
static Py_ssize_t
chunk_bound(PyObject *records, Py_ssize_t head_len, Py_ssize_t sep_len, int json, Py_ssize_t *payload)
{
    if (Run_Check(records))
        return run_bound((RunObject *)records, head_len, sep_len, json, payload);
    Py_ssize_t count = PyList_GET_SIZE(records);
    Py_ssize_t total = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 5) {
            PyErr_Format(PyExc_TypeError, "record %zd is not a 5-tuple", i);
            return -1;
        }
        PyObject *key = PyTuple_GET_ITEM(rec, 2), *value = PyTuple_GET_ITEM(rec, 3);
        PyObject *headers = PyTuple_GET_ITEM(rec, 4);
        if (check_bytes_or_none(key, i, "key") < 0 || check_bytes_or_none(value, i, "value") < 0)
            return -1;
        if (!PyTuple_Check(headers)) {
            PyErr_Format(PyExc_TypeError, "record %zd: headers must be a tuple", i);
            return -1;
        }
        Py_ssize_t n = head_len + sep_len + 120; /* numbers, field names, punctuation */
        if (key != Py_None) {
            n += kcg_b64_len(PyBytes_GET_SIZE(key)) + (json ? PyBytes_GET_SIZE(key) + 80 : 0);
            *payload += PyBytes_GET_SIZE(key);
        }
        if (value != Py_None) {
            n += kcg_b64_len(PyBytes_GET_SIZE(value)) + (json ? PyBytes_GET_SIZE(value) + 80 : 0);
            *payload += PyBytes_GET_SIZE(value);
        }
        for (Py_ssize_t h = 0; h < PyTuple_GET_SIZE(headers); h++) {
            PyObject *pair = PyTuple_GET_ITEM(headers, h);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))
                || check_bytes_or_none(PyTuple_GET_ITEM(pair, 1), i, "header value") < 0) {
                if (!PyErr_Occurred())
                    PyErr_Format(PyExc_TypeError, "record %zd: headers must be (str, bytes | None) pairs", i);
                return -1;
            }
            Py_ssize_t klen;
            if (PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &klen) == NULL)
                return -1;
            PyObject *hv = PyTuple_GET_ITEM(pair, 1);
            n += 32 + 6 * klen + (hv == Py_None ? 0 : kcg_b64_len(PyBytes_GET_SIZE(hv)));
        }
        if (n > PY_SSIZE_T_MAX / 2 - total) {
            PyErr_NoMemory();
            return -1;
        }
        total += n;
    }
    return total;
}

/* pass 2 of render: one chunk's records written at o (checked by chunk_bound); NULL with an error set */
static char *
chunk_write(char *o, PyObject *records, PyObject *head, PyObject *sep, int json)
{
    if (Run_Check(records))
        return run_write(o, (RunObject *)records, head, sep, json);
    Py_ssize_t count = PyList_GET_SIZE(records);
    Py_ssize_t head_len = PyBytes_GET_SIZE(head), sep_len = PyBytes_GET_SIZE(sep);
    const char *hp = PyBytes_AS_STRING(head), *sp = PyBytes_AS_STRING(sep);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        if (i)
            o = put_raw(o, sp, sep_len);
        o = put_raw(o, hp, head_len);
        long long offset = PyLong_AsLongLong(PyTuple_GET_ITEM(rec, 0));
        long long ts = PyLong_AsLongLong(PyTuple_GET_ITEM(rec, 1));
        if ((offset == -1 || ts == -1) && PyErr_Occurred())
            return NULL;
        o = put_i64(o, offset);
        o = PUT_LIT(o, ",\"timestamp\":");
        o = put_i64(o, ts);
        if (json) {
            *o++ = ',';
            o = put_json_field(o, "key", 3, PyTuple_GET_ITEM(rec, 2));
            *o++ = ',';
            o = put_json_field(o, "value", 5, PyTuple_GET_ITEM(rec, 3));
        } else {
            o = PUT_LIT(o, ",\"key\":");
            o = put_b64_or_null(o, PyTuple_GET_ITEM(rec, 2));
            o = PUT_LIT(o, ",\"value\":");
            o = put_b64_or_null(o, PyTuple_GET_ITEM(rec, 3));
        }
        o = PUT_LIT(o, ",\"headers\":[");
        PyObject *headers = PyTuple_GET_ITEM(rec, 4);
        for (Py_ssize_t h = 0; h < PyTuple_GET_SIZE(headers); h++) {
            PyObject *pair = PyTuple_GET_ITEM(headers, h);
            Py_ssize_t klen;
            const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &klen);
            if (h)
                *o++ = ',';
            o = PUT_LIT(o, "{\"key\":\"");
            o = put_json_text(o, k, klen);
            o = PUT_LIT(o, "\",\"value\":");
            o = put_b64_or_null(o, PyTuple_GET_ITEM(pair, 1));
            *o++ = '}';
        }
        o = PUT_LIT(o, "]}");
    }
    return o;
}

static PyObject *
render(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 4) {
        PyErr_Format(PyExc_TypeError, "render() takes 4 arguments (%zd given)", nargs);
        return NULL;
    }
    PyObject *records = args[0], *head = args[1], *sep = args[2];
    if (!(PyList_Check(records) || Run_Check(records)) || !PyBytes_Check(head) || !PyBytes_Check(sep)) {
        PyErr_SetString(PyExc_TypeError, "render(list | RecordRun, bytes, bytes, bool)");
        return NULL;
    }
    int json = PyObject_IsTrue(args[3]);
    if (json < 0)
        return NULL;
    Py_ssize_t payload = 0;
    Py_ssize_t total = chunk_bound(records, PyBytes_GET_SIZE(head), PyBytes_GET_SIZE(sep), json, &payload);
    if (total < 0)
        return NULL;
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    char *start = PyBytes_AS_STRING(out);
    char *o = chunk_write(start, records, head, sep, json);
    if (o == NULL) {
        Py_DECREF(out);
        return NULL;
    }
    if (_PyBytes_Resize(&out, o - start) < 0)
        return NULL;
    return Py_BuildValue("(Nn)", out, payload);
}

/*
 * render_framed(chunks, sep, json, lead, trail[, open_last]) -> (bytes, count, payload)
 *   chunks     list of (records, head) pairs, as render takes them one at a time
 *   open_last  leave the last record's closing brace out (when there is a record): trail then continues
 *              that object, e.g. with a stream's resume token
 * The records of every chunk rendered as render renders them, all joined by sep, with lead before the
 * first and trail after the last, in one buffer: the same bytes as
 * lead + sep.join(render(records, head, sep, json)[0] for each non-empty chunk) + trail,
 * without the per-chunk buffers and the join's copy (a poll's whole response body in one allocation).
 */
static PyObject *
render_framed(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 5 && nargs != 6) {
        PyErr_Format(PyExc_TypeError, "render_framed() takes 5 or 6 arguments (%zd given)", nargs);
        return NULL;
    }
    int open_last = nargs == 6 ? PyObject_IsTrue(args[5]) : 0;
    if (open_last < 0)
        return NULL;
    PyObject *chunks = args[0], *sep = args[1], *lead = args[3], *trail = args[4];
    if (!PyList_Check(chunks) || !PyBytes_Check(sep) || !PyBytes_Check(lead) || !PyBytes_Check(trail)) {
        PyErr_SetString(PyExc_TypeError, "render_framed(list, bytes, bool, bytes, bytes)");
        return NULL;
    }
    int json = PyObject_IsTrue(args[2]);
    if (json < 0)
        return NULL;
    Py_ssize_t n_chunks = PyList_GET_SIZE(chunks), sep_len = PyBytes_GET_SIZE(sep);
    Py_ssize_t payload = 0, count = 0;
    Py_ssize_t total = PyBytes_GET_SIZE(lead) + PyBytes_GET_SIZE(trail);
    for (Py_ssize_t c = 0; c < n_chunks; c++) {
        PyObject *pair = PyList_GET_ITEM(chunks, c);
        if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2
            || !(PyList_Check(PyTuple_GET_ITEM(pair, 0)) || Run_Check(PyTuple_GET_ITEM(pair, 0)))
            || !PyBytes_Check(PyTuple_GET_ITEM(pair, 1))) {
            PyErr_Format(PyExc_TypeError, "chunk %zd is not a (list | RecordRun, bytes) pair", c);
            return NULL;
        }
        PyObject *records = PyTuple_GET_ITEM(pair, 0);
        Py_ssize_t n = chunk_bound(records, PyBytes_GET_SIZE(PyTuple_GET_ITEM(pair, 1)), sep_len, json, &payload);
        if (n < 0)
            return NULL;
        if (n > PY_SSIZE_T_MAX / 2 - total - sep_len) {
            PyErr_NoMemory();
            return NULL;
        }
        total += n + sep_len;
        count += RECORDS_LEN(records);
    }
    PyObject *out = PyBytes_FromStringAndSize(NULL, total);
    if (out == NULL)
        return NULL;
    char *start = PyBytes_AS_STRING(out);
    char *o = put_raw(start, PyBytes_AS_STRING(lead), PyBytes_GET_SIZE(lead));
    int first = 1;
    for (Py_ssize_t c = 0; c < n_chunks; c++) {
        PyObject *pair = PyList_GET_ITEM(chunks, c);
        PyObject *records = PyTuple_GET_ITEM(pair, 0);
        if (RECORDS_LEN(records) == 0)
            continue;
        if (!first)
            o = put_raw(o, PyBytes_AS_STRING(sep), sep_len);
        first = 0;
        o = chunk_write(o, records, PyTuple_GET_ITEM(pair, 1), sep, json);
        if (o == NULL) {
            Py_DECREF(out);
            return NULL;
        }
    }
    if (open_last && !first)
        o--; /* the last record's closing brace (every record ends with "]}") */
    o = put_raw(o, PyBytes_AS_STRING(trail), PyBytes_GET_SIZE(trail));
    if (_PyBytes_Resize(&out, o - start) < 0)
        return NULL;
    return Py_BuildValue("(Nnn)", out, count, payload);
}

/* take_budget(records, i, j, budget, started) -> (k, budget): how far records[i:j] go within a byte budget
 * of key+value bytes (service/fetch/fetcher.py Fetcher.drain, whose pure-Python loop it replaces): a record
 * larger than what is left ends the take unless it is the first one taken at all (started false, k == i),
 * which is taken whole, leaving 0; the take also ends when the budget reaches 0. */
static Py_ssize_t
field_len(PyObject *v)
{
    if (v == Py_None)
        return 0;
    if (PyBytes_Check(v))
        return PyBytes_GET_SIZE(v);
    return PyObject_Length(v);
}

static PyObject *
take_budget(PyObject *self, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 5 || !(PyList_Check(args[0]) || Run_Check(args[0]))) {
        PyErr_SetString(PyExc_TypeError, "take_budget(records: list | RecordRun, i, j, budget, started)");
        return NULL;
    }
    PyObject *recs = args[0];
    Py_ssize_t i = PyLong_AsSsize_t(args[1]);
    Py_ssize_t j = PyLong_AsSsize_t(args[2]);
    long long budget = PyLong_AsLongLong(args[3]);
    int started = PyObject_IsTrue(args[4]);
    if (PyErr_Occurred() || started < 0)
        return NULL;
    Py_ssize_t len = RECORDS_LEN(recs);
    if (i < 0 || i > len || j < i) {
        PyErr_Format(PyExc_IndexError, "take_budget: records[%zd:%zd] is not a range of the %zd records", i, j,
                     len);
        return NULL;
    }
    if (j > len)
        j = len;
    Py_ssize_t k = i;
    if (Run_Check(recs)) {
        const rent *ents = ((RunObject *)recs)->ents;
        while (k < j) {
            long long sz = (long long)(ents[k].klen > 0 ? ents[k].klen : 0)
                           + (long long)(ents[k].vlen > 0 ? ents[k].vlen : 0);
            if (sz > budget && (started || k > i)) {
                budget = 0;
                break;
            }
            budget = sz <= budget ? budget - sz : 0;
            k++;
            if (budget == 0)
                break;
        }
        return Py_BuildValue("(nL)", k, budget);
    }
    while (k < j && k < PyList_GET_SIZE(recs)) { /* the list's length again: field_len may run Python code */
        PyObject *r = PyList_GET_ITEM(recs, k);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 4) {
            PyErr_SetString(PyExc_TypeError, "take_budget: records must be Record tuples");
            return NULL;
        }
        Py_ssize_t kl = field_len(PyTuple_GET_ITEM(r, 2));
        Py_ssize_t vl = field_len(PyTuple_GET_ITEM(r, 3));
        if (kl < 0 || vl < 0)
            return NULL;
        long long sz = (long long)kl + (long long)vl;
        if (sz > budget && (started || k > i)) {
            budget = 0;
            break;
        }
        budget = sz <= budget ? budget - sz : 0;
        k++;
        if (budget == 0)
            break;
    }
    return Py_BuildValue("(nL)", k, budget);
}

/* frame_buffer(n) -> bytearray of n bytes, not zeroed: the client's read buffer for one large response frame
 * (service/client/connection.py), which the socket fills entirely before anything reads it. */
static PyObject *
frame_buffer(PyObject *module, PyObject *arg)
{
    (void)module;
    Py_ssize_t n = PyLong_AsSsize_t(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "negative size");
        return NULL;
    }
    return PyByteArray_FromStringAndSize(NULL, n);
}

static PyMethodDef methods[] = {
    {"take_budget", (PyCFunction)(void (*)(void))take_budget, METH_FASTCALL,
     "take_budget(records, i, j, budget, started) -> (k, budget)\n\nHow far records[i:j] go within a "
     "byte budget of key+value bytes (Fetcher.drain)."},
    {"decode_records", (PyCFunction)(void (*)(void))decode_records, METH_FASTCALL,
     "decode_records(buf, start, end, count, base_offset, base_timestamp, append_timestamp, "
     "record_type) -> list\n\nDecode a magic-2 records section into record tuples."},
    {"render", (PyCFunction)(void (*)(void))render, METH_FASTCALL,
     "render(records, head, sep, json) -> (bytes, payload)\n\nThe gateway's JSON objects of records "
     "(binary or json format), joined by sep, and the records' key+value bytes."},
    {"render_framed", (PyCFunction)(void (*)(void))render_framed, METH_FASTCALL,
     "render_framed(chunks, sep, json, lead, trail[, open_last]) -> (bytes, count, payload)\n\nEvery "
     "(records, head) chunk rendered as render does, joined by sep, between lead and trail, in one buffer."},
    {"frame_buffer", (PyCFunction)frame_buffer, METH_O,
     "frame_buffer(n) -> bytearray\n\nA bytearray of n bytes whose contents are not initialised."},
    {"json_valid", (PyCFunction)py_json_valid, METH_O,
     "json_valid(buf) -> bool\n\nWhether buf is exactly one JSON text (RFC 8259, UTF-8)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_crecords", "C accelerator for service.protocol.records.", 0, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__crecords(void)
{
    kcg_b64_init();
    init_j_plain();
    if (PyType_Ready(&RunType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    if (PyModule_AddObjectRef(m, "RecordRun", (PyObject *)&RunType) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
