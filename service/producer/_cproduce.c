/* The producer's record encoder in C: the records section of one magic-2 batch, written from
 * the accumulator's runs of queued records in one pass, without a Python object per record.
 *
 * encode_runs(runs) -> (section: bytes, count, base_timestamp, max_timestamp)
 *   runs: a list of (records, default_timestamp); records: a list of tuples
 *   (key, value, headers, partition, timestamp) where key/value are bytes-like or None, headers a sequence
 *   of (str, bytes-like | None) pairs, timestamp an int (ms) or None (then the run's default_timestamp).
 *   Offset deltas count from 0 across all runs; timestamp deltas from the first record's timestamp.
 *
 * Byte-for-byte what service/producer/encoding.py's pure-Python encoder writes (differential unit test).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "../protocol/kcg_base64.h"

typedef struct {
    char *buf;
    Py_ssize_t len;
    Py_ssize_t cap;
} out_t;

static int out_reserve(out_t *o, Py_ssize_t extra) {
    if (o->len + extra <= o->cap)
        return 0;
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap < o->len + extra) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return -1;
        }
        cap *= 2;
    }
    char *nb = PyMem_Realloc(o->buf, (size_t)cap);
    if (nb == NULL) {
        PyErr_NoMemory();
        return -1;
    }
    o->buf = nb;
    o->cap = cap;
    return 0;
}

static inline int varint_size(int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    int n = 1;
    while (z >= 0x80) {
        z >>= 7;
        n++;
    }
    return n;
}

static inline void put_varint(out_t *o, int64_t v) {
    uint64_t z = ((uint64_t)v << 1) ^ (uint64_t)(v >> 63);
    char *p = o->buf + o->len;
    while (z >= 0x80) {
        *p++ = (char)((z & 0x7F) | 0x80);
        z >>= 7;
    }
    *p++ = (char)z;
    o->len = p - o->buf;
}

static inline void put_bytes(out_t *o, const void *data, Py_ssize_t n) {
    if (n) memcpy(o->buf + o->len, data, (size_t)n);
    o->len += n;
}

/* A bytes-like field: (pointer, length) or length -1 for None. Keeps a buffer view when needed. */
typedef struct {
    const char *p;
    Py_ssize_t n;
    Py_buffer view;
    int has_view;
} field_t;

static int field_get(PyObject *obj, field_t *f, const char *what) {
    f->has_view = 0;
    if (obj == Py_None) {
        f->p = NULL;
        f->n = -1;
        return 0;
    }
    if (PyBytes_CheckExact(obj)) {
        f->p = PyBytes_AS_STRING(obj);
        f->n = PyBytes_GET_SIZE(obj);
        return 0;
    }
    if (PyObject_GetBuffer(obj, &f->view, PyBUF_CONTIG_RO) < 0) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "a record's %s must be bytes-like or None, not %.100s", what,
                     Py_TYPE(obj)->tp_name);
        return -1;
    }
    f->has_view = 1;
    f->p = f->view.buf;
    f->n = f->view.len;
    return 0;
}

static void field_release(field_t *f) {
    if (f->has_view) {
        PyBuffer_Release(&f->view);
        f->has_view = 0;
    }
}

static inline Py_ssize_t field_wire_size(const field_t *f) {
    return f->n < 0 ? 1 : varint_size(f->n) + f->n;
}

static inline void field_put(out_t *o, const field_t *f) {
    if (f->n < 0) {
        put_varint(o, -1);
    } else {
        put_varint(o, f->n);
        put_bytes(o, f->p, f->n);
    }
}

/* Headers: returns the wire size of the headers section, or -1 on error. Writes when `o` is not NULL. */
static Py_ssize_t headers_section(PyObject *headers, out_t *o) {
    if (headers == Py_None)
        return 1; /* count 0 */
    PyObject *seq = PySequence_Fast(headers, "a record's headers must be a sequence of (key, value) pairs");
    if (seq == NULL)
        return -1;
    Py_ssize_t count = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    Py_ssize_t total = varint_size(count);
    if (o != NULL)
        put_varint(o, count);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *h = items[i];
        if (!PyTuple_Check(h) || PyTuple_GET_SIZE(h) != 2) {
            PyErr_SetString(PyExc_TypeError, "a record header must be a (key, value) pair");
            Py_DECREF(seq);
            return -1;
        }
        PyObject *hk = PyTuple_GET_ITEM(h, 0);
        if (!PyUnicode_Check(hk)) {
            PyErr_SetString(PyExc_TypeError, "a record header's key must be a str");
            Py_DECREF(seq);
            return -1;
        }
        Py_ssize_t kn;
        const char *k = PyUnicode_AsUTF8AndSize(hk, &kn);
        if (k == NULL) {
            Py_DECREF(seq);
            return -1;
        }
        field_t v;
        if (field_get(PyTuple_GET_ITEM(h, 1), &v, "header value") < 0) {
            Py_DECREF(seq);
            return -1;
        }
        total += varint_size(kn) + kn + field_wire_size(&v);
        if (o != NULL) {
            put_varint(o, kn);
            put_bytes(o, k, kn);
            field_put(o, &v);
        }
        field_release(&v);
    }
    Py_DECREF(seq);
    return total;
}

static int get_ts(PyObject *obj, int64_t dflt, int64_t *out) {
    if (obj == Py_None) {
        *out = dflt;
        return 0;
    }
    long long v = PyLong_AsLongLong(obj);
    if (v == -1 && PyErr_Occurred())
        return -1;
    *out = (int64_t)v;
    return 0;
}

static PyObject *encode_runs(PyObject *self, PyObject *arg) {
    (void)self;
    if (!PyList_Check(arg)) {
        PyErr_SetString(PyExc_TypeError, "encode_runs expects a list of (records, default_timestamp)");
        return NULL;
    }
    out_t o = {NULL, 0, 0};
    int64_t base_ts = 0, max_ts = 0;
    Py_ssize_t count = 0;
    Py_ssize_t nruns = PyList_GET_SIZE(arg);
    for (Py_ssize_t r = 0; r < nruns; r++) {
        PyObject *run = PyList_GET_ITEM(arg, r);
        if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) < 2 || !PyList_Check(PyTuple_GET_ITEM(run, 0))) {
            PyErr_SetString(PyExc_TypeError, "a run must be a (list of records, default_timestamp) tuple");
            goto fail;
        }
        PyObject *records = PyTuple_GET_ITEM(run, 0);
        long long dflt_ll = PyLong_AsLongLong(PyTuple_GET_ITEM(run, 1));
        if (dflt_ll == -1 && PyErr_Occurred())
            goto fail;
        int64_t dflt = (int64_t)dflt_ll;
        Py_ssize_t n = PyList_GET_SIZE(records);
        for (Py_ssize_t i = 0; i < n; i++) {
            PyObject *rec = PyList_GET_ITEM(records, i);
            if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) < 5) {
                PyErr_SetString(PyExc_TypeError,
                                "a record must be a (key, value, headers, partition, timestamp) tuple");
                goto fail;
            }
            int64_t ts;
            if (get_ts(PyTuple_GET_ITEM(rec, 4), dflt, &ts) < 0)
                goto fail;
            if (count == 0) {
                base_ts = max_ts = ts;
            } else if (ts > max_ts) {
                max_ts = ts;
            }
            field_t k, v;
            if (field_get(PyTuple_GET_ITEM(rec, 0), &k, "key") < 0)
                goto fail;
            if (field_get(PyTuple_GET_ITEM(rec, 1), &v, "value") < 0) {
                field_release(&k);
                goto fail;
            }
            PyObject *headers = PyTuple_GET_ITEM(rec, 2);
            int no_headers = headers == Py_None || (PyTuple_Check(headers) && PyTuple_GET_SIZE(headers) == 0) ||
                             (PyList_Check(headers) && PyList_GET_SIZE(headers) == 0);
            Py_ssize_t hsize = no_headers ? 1 : headers_section(headers, NULL);
            if (hsize < 0) {
                field_release(&k);
                field_release(&v);
                goto fail;
            }
            int64_t delta = ts - base_ts;
            Py_ssize_t body = 1 + varint_size(delta) + varint_size(count) + field_wire_size(&k) +
                              field_wire_size(&v) + hsize;
            if (out_reserve(&o, body + 10) < 0) {
                field_release(&k);
                field_release(&v);
                goto fail;
            }
            put_varint(&o, body);
            o.buf[o.len++] = 0; /* attributes */
            put_varint(&o, delta);
            put_varint(&o, count);
            field_put(&o, &k);
            field_put(&o, &v);
            field_release(&k);
            field_release(&v);
            if (no_headers) {
                o.buf[o.len++] = 0;
            } else if (headers_section(headers, &o) < 0) {
                goto fail;
            }
            count++;
        }
    }
    PyObject *section = PyBytes_FromStringAndSize(o.buf ? o.buf : "", o.len);
    PyMem_Free(o.buf);
    if (section == NULL)
        return NULL;
    return Py_BuildValue("(NnLL)", section, count, (long long)base_ts, (long long)max_ts);
fail:
    PyMem_Free(o.buf);
    return NULL;
}


/* ---- HTTP produce helpers (api/v2/produce.py): the body's records and the answer, without Python per record ---- */

/* Decodes canonical-length base64 (length a multiple of 4, only the alphabet, one or two '=' at the very end).
 * Anything else returns NULL without an exception: the caller falls back to binascii's strict mode, which
 * decides (and names the field). What this accepts, binascii.a2b_base64(strict_mode=True) decodes the same. */
static PyObject *b64_decode_raw(const unsigned char *s, Py_ssize_t n) {
    if (n % 4)
        return NULL;
    Py_ssize_t pad = 0;
    if (n && s[n - 1] == '=') {
        pad = 1;
        if (s[n - 2] == '=')
            pad = 2;
    }
    Py_ssize_t outlen = n / 4 * 3 - pad;
    PyObject *out = PyBytes_FromStringAndSize(NULL, outlen);
    if (out == NULL)
        return NULL;
    unsigned char *o = (unsigned char *)PyBytes_AS_STRING(out);
    Py_ssize_t full = pad ? n - 4 : n;
    if (!kcg_b64_decode_quads(o, s, full / 4))
        goto bad;
    o += full / 4 * 3;
    Py_ssize_t i = full;
    if (pad) {
        int a = kcg_b64_value[s[i]], b = kcg_b64_value[s[i + 1]];
        int c = pad == 1 ? kcg_b64_value[s[i + 2]] : 0;
        if ((a | b | c) < 0)
            goto bad;
        uint32_t v = ((uint32_t)a << 18) | ((uint32_t)b << 12) | ((uint32_t)c << 6);
        *o++ = (unsigned char)(v >> 16);
        if (pad == 1)
            *o++ = (unsigned char)(v >> 8);
    }
    return out;
bad:
    Py_DECREF(out);
    return NULL;
}

static PyObject *b64_decode(PyObject *str) {
    if (!PyUnicode_IS_ASCII(str))
        return NULL;
    return b64_decode_raw((const unsigned char *)PyUnicode_DATA(str), PyUnicode_GET_LENGTH(str));
}

/* (key, value, (), partition, None): a plain record for the producer; steals kb and vb (also on failure). */
static PyObject *plain_record(PyObject *kb, PyObject *vb, PyObject *empty, PyObject *partition) {
    PyObject *t = PyTuple_New(5);
    if (t == NULL) {
        Py_DECREF(kb);
        Py_DECREF(vb);
        return NULL;
    }
    Py_INCREF(empty);
    Py_INCREF(partition);
    Py_INCREF(Py_None);
    PyTuple_SET_ITEM(t, 0, kb);
    PyTuple_SET_ITEM(t, 1, vb);
    PyTuple_SET_ITEM(t, 2, empty);
    PyTuple_SET_ITEM(t, 3, partition);
    PyTuple_SET_ITEM(t, 4, Py_None);
    return t;
}

/* parse_binary(records, partition) -> (list of (key, value, (), partition, None), sizes) or None.
 * records: the body's "records" list; each must be a dict of at most "key" and "value", each a base64 string
 * or null. None as soon as one record is anything else (the Python path then checks and names the error). */
static PyObject *parse_binary(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *records, *partition;
    if (!PyArg_ParseTuple(args, "O!O", &PyList_Type, &records, &partition))
        return NULL;
    static PyObject *k_key = NULL, *k_value = NULL, *empty = NULL;
    if (k_key == NULL) {
        k_key = PyUnicode_InternFromString("key");
        k_value = PyUnicode_InternFromString("value");
        empty = PyTuple_New(0);
        if (k_key == NULL || k_value == NULL || empty == NULL)
            return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(records);
    PyObject *out = PyList_New(n);
    PyObject *sizes = PyList_New(n);
    if (out == NULL || sizes == NULL)
        goto fail;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        if (!PyDict_CheckExact(r) || PyDict_GET_SIZE(r) > 2)
            goto fallback;
        PyObject *k = PyDict_GetItemWithError(r, k_key);
        PyObject *v = PyDict_GetItemWithError(r, k_value);
        if (PyErr_Occurred())
            goto fail;
        if (PyDict_GET_SIZE(r) != (k != NULL) + (v != NULL))
            goto fallback; /* another field */
        PyObject *kb = Py_None, *vb = Py_None;
        Py_ssize_t size = 0;
        if (k != NULL && k != Py_None) {
            if (!PyUnicode_CheckExact(k) || (kb = b64_decode(k)) == NULL)
                goto fallback_err;
            size += PyBytes_GET_SIZE(kb);
        } else {
            Py_INCREF(kb);
        }
        if (v != NULL && v != Py_None) {
            if (!PyUnicode_CheckExact(v) || (vb = b64_decode(v)) == NULL) {
                Py_DECREF(kb);
                goto fallback_err;
            }
            size += PyBytes_GET_SIZE(vb);
        } else {
            Py_INCREF(vb);
        }
        PyObject *t = plain_record(kb, vb, empty, partition);
        if (t == NULL)
            goto fail;
        PyList_SET_ITEM(out, i, t);
        PyObject *sz = PyLong_FromSsize_t(size);
        if (sz == NULL)
            goto fail;
        PyList_SET_ITEM(sizes, i, sz);
    }
    return Py_BuildValue("(NN)", out, sizes);
fallback_err:
    if (PyErr_Occurred())
        goto fail;
fallback:
    Py_XDECREF(out);
    Py_XDECREF(sizes);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    Py_XDECREF(sizes);
    return NULL;
}

/* ---- parse_body_binary: the whole request body of the common binary shape, without a JSON parser ----
 * With max_records >= 0, a body with more records than that is answered max_records + 1 (an int) as soon as
 * the record after the cap begins, whatever follows (the caller refuses the request without parsing on).
 * Accepted: {"records": [R, ...]} (at least one record, no other top-level field), R = {} or an object of
 * "key" and/or "value" (each at most once), each null or a string of base64 characters (no escapes), with JSON
 * whitespace anywhere between tokens. Anything else is None: the caller parses the body with orjson and
 * parse_records, which decide (and name errors). For what this accepts, the result is parse_binary's on what
 * orjson parses. */
static inline const unsigned char *json_ws(const unsigned char *p, const unsigned char *e) {
    while (p < e && (*p == ' ' || *p == '\t' || *p == '\n' || *p == '\r'))
        p++;
    return p;
}

static inline int json_lit(const unsigned char **pp, const unsigned char *e, const char *lit, Py_ssize_t n) {
    if (e - *pp < n || memcmp(*pp, lit, (size_t)n) != 0)
        return 0;
    *pp += n;
    return 1;
}

/* JSON whitespace, then the literal. */
static inline int json_token(const unsigned char **pp, const unsigned char *e, const char *lit, Py_ssize_t n) {
    *pp = json_ws(*pp, e);
    return json_lit(pp, e, lit, n);
}

/* A member value: null (*out = Py_None, new ref) or a base64 string decoded (*out new bytes). 0: not plain. */
static int plain_b64_value(const unsigned char **pp, const unsigned char *e, PyObject **out) {
    const unsigned char *p = *pp;
    if (json_lit(&p, e, "null", 4)) {
        Py_INCREF(Py_None);
        *out = Py_None;
        *pp = p;
        return 1;
    }
    if (p >= e || *p != '"')
        return 0;
    const unsigned char *s = ++p;
    /* the closing quote; the decoder checks every character before it (an escape, a control or a non-base64
     * character, '=' other than as padding: NULL, and the full path judges the body) */
    p = memchr(p, '"', (size_t)(e - p));
    if (p == NULL)
        return 0;
    PyObject *b = b64_decode_raw(s, p - s);
    if (b == NULL)
        return 0; /* (an exception set here is checked by the caller) */
    *out = b;
    *pp = p + 1;
    return 1;
}

static PyObject *parse_body_binary(PyObject *self, PyObject *args) {
    (void)self;
    Py_buffer view;
    PyObject *partition;
    Py_ssize_t max_records = -1; /* below 0: no cap */
    if (!PyArg_ParseTuple(args, "y*O|n", &view, &partition, &max_records))
        return NULL;
    static PyObject *empty = NULL;
    if (empty == NULL && (empty = PyTuple_New(0)) == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    const unsigned char *p = (const unsigned char *)view.buf, *e = p + view.len;
    PyObject *out = PyList_New(0), *sizes = PyList_New(0);
    if (out == NULL || sizes == NULL)
        goto fail;
    if (!json_token(&p, e, "{", 1) || !json_token(&p, e, "\"records\"", 9) || !json_token(&p, e, ":", 1) ||
        !json_token(&p, e, "[", 1))
        goto fallback;
    for (;;) {
        if (max_records >= 0 && PyList_GET_SIZE(out) >= max_records) {
            /* one record more than the cap: stop here (the caller refuses the request, nothing is parsed on) */
            Py_DECREF(out);
            Py_DECREF(sizes);
            PyBuffer_Release(&view);
            return PyLong_FromSsize_t(max_records + 1);
        }
        if (!json_token(&p, e, "{", 1))
            goto fallback;
        PyObject *kb = NULL, *vb = NULL;
        if (!json_token(&p, e, "}", 1)) {
            for (;;) {
                PyObject **slot;
                if (json_lit(&p, e, "\"key\"", 5))
                    slot = &kb;
                else if (json_lit(&p, e, "\"value\"", 7))
                    slot = &vb;
                else
                    goto fallback_record;
                if (*slot != NULL || !json_token(&p, e, ":", 1))
                    goto fallback_record; /* a repeated member, or no colon */
                p = json_ws(p, e);
                if (!plain_b64_value(&p, e, slot))
                    goto fallback_record;
                if (json_token(&p, e, "}", 1))
                    break;
                if (!json_token(&p, e, ",", 1))
                    goto fallback_record;
                p = json_ws(p, e);
            }
        }
        Py_ssize_t size = 0;
        if (kb == NULL) {
            Py_INCREF(Py_None);
            kb = Py_None;
        } else if (kb != Py_None) {
            size += PyBytes_GET_SIZE(kb);
        }
        if (vb == NULL) {
            Py_INCREF(Py_None);
            vb = Py_None;
        } else if (vb != Py_None) {
            size += PyBytes_GET_SIZE(vb);
        }
        PyObject *t = plain_record(kb, vb, empty, partition);
        if (t == NULL)
            goto fail;
        int rc = PyList_Append(out, t);
        Py_DECREF(t);
        if (rc < 0)
            goto fail;
        PyObject *sz = PyLong_FromSsize_t(size);
        if (sz == NULL)
            goto fail;
        rc = PyList_Append(sizes, sz);
        Py_DECREF(sz);
        if (rc < 0)
            goto fail;
        if (json_token(&p, e, "]", 1))
            break;
        if (!json_token(&p, e, ",", 1))
            goto fallback;
        continue;
    fallback_record:
        Py_XDECREF(kb);
        Py_XDECREF(vb);
        goto fallback;
    }
    if (!json_token(&p, e, "}", 1) || json_ws(p, e) != e)
        goto fallback;
    PyBuffer_Release(&view);
    return Py_BuildValue("(NN)", out, sizes);
fallback:
    if (PyErr_Occurred())
        goto fail;
    Py_XDECREF(out);
    Py_XDECREF(sizes);
    PyBuffer_Release(&view);
    Py_RETURN_NONE;
fail:
    Py_XDECREF(out);
    Py_XDECREF(sizes);
    PyBuffer_Release(&view);
    return NULL;
}

/* The decimal digits of v (any long long) at o's end; room for 20 characters must be reserved. */
static inline void put_decimal(out_t *o, long long v) {
    char tmp[24];
    int k = 0;
    unsigned long long u = v < 0 ? 0ULL - (unsigned long long)v : (unsigned long long)v;
    do {
        tmp[k++] = (char)('0' + (int)(u % 10));
        u /= 10;
    } while (u);
    if (v < 0)
        o->buf[o->len++] = '-';
    while (k)
        o->buf[o->len++] = tmp[--k];
}

static const char OFFSETS_HEAD[] = "{\"offsets\":[";

/* One written record's entry of a ProduceResponse body: [","]{"partition":P,"offset":O,"error_code":null,...} */
static int put_offset_item(out_t *o, int comma, long long p, long long off) {
    static const char item1[] = "{\"partition\":";
    static const char item2[] = ",\"offset\":";
    static const char item3[] = ",\"error_code\":null,\"error\":null}";
    if (out_reserve(o, 128) < 0)
        return -1;
    if (comma)
        o->buf[o->len++] = ',';
    put_bytes(o, item1, (Py_ssize_t)sizeof item1 - 1);
    put_decimal(o, p);
    put_bytes(o, item2, (Py_ssize_t)sizeof item2 - 1);
    put_decimal(o, off);
    put_bytes(o, item3, (Py_ssize_t)sizeof item3 - 1);
    return 0;
}

/* render_offsets(results, RecordMetadata, key_schema_id, value_schema_id) -> the ProduceResponse body, or None
 * when a result is not exactly a RecordMetadata (a failure: the Python renderer handles those). */
static PyObject *render_offsets(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *results, *meta_type, *ksid, *vsid;
    if (!PyArg_ParseTuple(args, "O!OOO", &PyList_Type, &results, &meta_type, &ksid, &vsid))
        return NULL;
    if (!PyType_Check(meta_type) || !PyType_IsSubtype((PyTypeObject *)meta_type, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "render_offsets: RecordMetadata must be a tuple subclass");
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(results);
    out_t o = {NULL, 0, 0};
    if (out_reserve(&o, (Py_ssize_t)sizeof OFFSETS_HEAD + n * 128 + 128) < 0)
        return NULL;
    put_bytes(&o, OFFSETS_HEAD, (Py_ssize_t)sizeof OFFSETS_HEAD - 1);
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(results, i);
        if ((PyObject *)Py_TYPE(r) != meta_type || PyTuple_GET_SIZE(r) != 2)
            goto none;
        long long p = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 0));
        long long off = PyLong_AsLongLong(PyTuple_GET_ITEM(r, 1));
        if (PyErr_Occurred()) {
            PyMem_Free(o.buf);
            return NULL;
        }
        if (put_offset_item(&o, i > 0, p, off) < 0) {
            PyMem_Free(o.buf);
            return NULL;
        }
    }
    if (out_reserve(&o, 96) < 0) {
        PyMem_Free(o.buf);
        return NULL;
    }
    put_bytes(&o, "],\"key_schema_id\":", 18);
    for (int j = 0; j < 2; j++) {
        PyObject *id = j ? vsid : ksid;
        if (id == Py_None) {
            put_bytes(&o, "null", 4);
        } else {
            long long v = PyLong_AsLongLong(id);
            if (v == -1 && PyErr_Occurred()) {
                PyMem_Free(o.buf);
                return NULL;
            }
            o.len += snprintf(o.buf + o.len, 32, "%lld", v);
        }
        if (!j)
            put_bytes(&o, ",\"value_schema_id\":", 19);
    }
    o.buf[o.len++] = '}';
    PyObject *body = PyBytes_FromStringAndSize(o.buf, o.len);
    PyMem_Free(o.buf);
    return body;
none:
    PyMem_Free(o.buf);
    Py_RETURN_NONE;
}

/* render_offset_runs(runs, n) -> the ProduceResponse body of n records all written, from runs (first index,
 * partition, base offset, count) sorted by first index and covering 0..n-1 exactly (no RecordMetadata per
 * record); None if they do not (the caller then renders record by record). Schema ids are null. */
static PyObject *render_offset_runs(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *runs;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &runs, &n))
        return NULL;
    static const char tail[] = "],\"key_schema_id\":null,\"value_schema_id\":null}";
    out_t o = {NULL, 0, 0};
    if (n < 0 || n > PY_SSIZE_T_MAX / 256) {
        PyErr_Format(PyExc_ValueError, "render_offset_runs: %zd records is not a count", n);
        return NULL;
    }
    if (out_reserve(&o, (Py_ssize_t)sizeof OFFSETS_HEAD + n * 96 + (Py_ssize_t)sizeof tail) < 0)
        return NULL;
    put_bytes(&o, OFFSETS_HEAD, (Py_ssize_t)sizeof OFFSETS_HEAD - 1);
    Py_ssize_t next = 0;
    for (Py_ssize_t r = 0; r < PyList_GET_SIZE(runs); r++) {
        PyObject *run = PyList_GET_ITEM(runs, r);
        if (!PyTuple_Check(run) || PyTuple_GET_SIZE(run) != 4)
            goto none;
        long long first = PyLong_AsLongLong(PyTuple_GET_ITEM(run, 0));
        long long p = PyLong_AsLongLong(PyTuple_GET_ITEM(run, 1));
        long long off = PyLong_AsLongLong(PyTuple_GET_ITEM(run, 2));
        long long count = PyLong_AsLongLong(PyTuple_GET_ITEM(run, 3));
        if (PyErr_Occurred()) {
            PyMem_Free(o.buf);
            return NULL;
        }
        if (first != next || count < 0 || count > n - next || p < 0 || off < 0)
            goto none;
        for (long long i = 0; i < count; i++) {
            if (put_offset_item(&o, next + i > 0, p, off + i) < 0) {
                PyMem_Free(o.buf);
                return NULL;
            }
        }
        next += count;
    }
    if (next != n)
        goto none;
    if (out_reserve(&o, (Py_ssize_t)sizeof tail) < 0) {
        PyMem_Free(o.buf);
        return NULL;
    }
    put_bytes(&o, tail, (Py_ssize_t)sizeof tail - 1);
    PyObject *body = PyBytes_FromStringAndSize(o.buf, o.len);
    PyMem_Free(o.buf);
    return body;
none:
    PyMem_Free(o.buf);
    Py_RETURN_NONE;
}

#define MAX_OVERHEAD 0x7FFFFFFF /* plain_sizes: a record's fixed overhead (bytes); keeps every size in range */

/* plain_sizes(records, overhead) -> [overhead + len(value), ...] when every record is a tuple of at least five
 * fields with no key, no partition and no headers (the sticky-partition fast path of send_many), else None. */
static PyObject *plain_sizes(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *records;
    Py_ssize_t overhead;
    if (!PyArg_ParseTuple(args, "O!n", &PyList_Type, &records, &overhead))
        return NULL;
    if (overhead < 0 || overhead > MAX_OVERHEAD) {
        PyErr_Format(PyExc_ValueError, "plain_sizes: overhead %zd is outside 0..%d", overhead, MAX_OVERHEAD);
        return NULL;
    }
    Py_ssize_t n = PyList_GET_SIZE(records);
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *r = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(r) || PyTuple_GET_SIZE(r) < 5 || PyTuple_GET_ITEM(r, 0) != Py_None ||
            PyTuple_GET_ITEM(r, 3) != Py_None)
            goto none;
        PyObject *h = PyTuple_GET_ITEM(r, 2);
        if (!(h == Py_None || (PyTuple_Check(h) && PyTuple_GET_SIZE(h) == 0) ||
              (PyList_Check(h) && PyList_GET_SIZE(h) == 0)))
            goto none;
        PyObject *v = PyTuple_GET_ITEM(r, 1);
        Py_ssize_t size = overhead;
        if (v != Py_None) {
            if (PyBytes_CheckExact(v)) {
                size += PyBytes_GET_SIZE(v);
            } else {
                Py_ssize_t len = PyObject_Length(v);
                if (len < 0) {
                    Py_DECREF(out);
                    return NULL;
                }
                size += len;
            }
        }
        PyObject *sz = PyLong_FromSsize_t(size);
        if (sz == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyList_SET_ITEM(out, i, sz);
    }
    return out;
none:
    Py_DECREF(out);
    Py_RETURN_NONE;
}

/* metas(cls, partition, base_offset, n) -> [cls(partition, base_offset), ..., cls(partition, base_offset + n - 1)]
 * cls: a tuple subclass of two fields (RecordMetadata); what the accumulator answers for every record of a run. */
static PyObject *metas(PyObject *self, PyObject *args) {
    (void)self;
    PyObject *cls, *partition;
    long long base;
    Py_ssize_t n;
    if (!PyArg_ParseTuple(args, "OOLn", &cls, &partition, &base, &n))
        return NULL;
    if (!PyType_Check(cls) || !PyType_IsSubtype((PyTypeObject *)cls, &PyTuple_Type)) {
        PyErr_SetString(PyExc_TypeError, "metas: cls must be a tuple subclass");
        return NULL;
    }
    if (n < 0) {
        PyErr_SetString(PyExc_ValueError, "metas: n must be >= 0");
        return NULL;
    }
    if (n > 0 && base > LLONG_MAX - (long long)(n - 1)) {
        PyErr_SetString(PyExc_OverflowError, "metas: base_offset + n - 1 is beyond a 64-bit offset");
        return NULL;
    }
    PyTypeObject *tp = (PyTypeObject *)cls;
    PyObject *out = PyList_New(n);
    if (out == NULL)
        return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *off = PyLong_FromLongLong(base + i);
        if (off == NULL) {
            Py_DECREF(out);
            return NULL;
        }
        PyObject *m = tp->tp_alloc(tp, 2);
        if (m == NULL) {
            Py_DECREF(off);
            Py_DECREF(out);
            return NULL;
        }
        Py_INCREF(partition);
        PyTuple_SET_ITEM(m, 0, partition);
        PyTuple_SET_ITEM(m, 1, off);
        PyList_SET_ITEM(out, i, m);
    }
    return out;
}

static PyMethodDef methods[] = {
    {"encode_runs", encode_runs, METH_O,
     "encode_runs(runs) -> (records section, count, base timestamp, max timestamp)"},
    {"parse_binary", parse_binary, METH_VARARGS,
     "parse_binary(records, partition) -> (records, sizes) or None (not all plain base64 key/value records)"},
    {"parse_body_binary", parse_body_binary, METH_VARARGS,
     "parse_body_binary(body, partition[, max_records]) -> (records, sizes), None (not the plain binary shape) "
     "or max_records + 1 (an int: more records than max_records, parsing stopped there)"},
    {"metas", metas, METH_VARARGS, "metas(cls, partition, base_offset, n) -> n cls instances, offsets counting up"},
    {"plain_sizes", plain_sizes, METH_VARARGS,
     "plain_sizes(records, overhead) -> record sizes if no record has a key, partition or headers, else None"},
    {"render_offsets", render_offsets, METH_VARARGS,
     "render_offsets(results, RecordMetadata, key_schema_id, value_schema_id) -> body or None"},
    {"render_offset_runs", render_offset_runs, METH_VARARGS,
     "render_offset_runs(runs, n) -> body or None (runs: (first index, partition, base offset, count))"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_cproduce", NULL, -1, methods};

PyMODINIT_FUNC PyInit__cproduce(void) {
    kcg_b64_init();
    return PyModule_Create(&module);
}
