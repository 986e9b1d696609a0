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

static PyObject *
decode_records(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs != 8) {
        PyErr_Format(PyExc_TypeError, "decode_records() takes 8 arguments (%zd given)", nargs);
        return NULL;
    }
    Py_ssize_t start = PyLong_AsSsize_t(args[1]);
    Py_ssize_t end = PyLong_AsSsize_t(args[2]);
    Py_ssize_t count = PyLong_AsSsize_t(args[3]);
    long long base_offset = PyLong_AsLongLong(args[4]);
    long long base_timestamp = PyLong_AsLongLong(args[5]);
    if (PyErr_Occurred())
        return NULL;
    int log_append = args[6] != Py_None;
    long long append_timestamp = 0;
    if (log_append) {
        append_timestamp = PyLong_AsLongLong(args[6]);
        if (append_timestamp == -1 && PyErr_Occurred())
            return NULL;
    }
    PyObject *rtype_obj = args[7];
    if (!PyType_Check(rtype_obj) || !PyType_IsSubtype((PyTypeObject *)rtype_obj, &PyTuple_Type)
        || ((PyTypeObject *)rtype_obj)->tp_basicsize != PyTuple_Type.tp_basicsize
        || ((PyTypeObject *)rtype_obj)->tp_itemsize != PyTuple_Type.tp_itemsize) {
        PyErr_SetString(PyExc_TypeError, "record_type must be tuple or a field-less tuple subclass");
        return NULL;
    }
    PyTypeObject *rtype = (PyTypeObject *)rtype_obj;
    int plain_tuple = rtype == &PyTuple_Type;

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
        PyObject *t = PyLong_FromLongLong(timestamp);
        PyObject *rec = (o && t) ? (plain_tuple ? PyTuple_New(5) : rtype->tp_alloc(rtype, 5)) : NULL;
        if (rec == NULL) {
            Py_XDECREF(o);
            Py_XDECREF(t);
            Py_DECREF(key);
            Py_DECREF(value);
            Py_DECREF(headers);
            goto fail;
        }
        PyTuple_SET_ITEM(rec, 0, o);
        PyTuple_SET_ITEM(rec, 1, t);
        PyTuple_SET_ITEM(rec, 2, key);
        PyTuple_SET_ITEM(rec, 3, value);
        PyTuple_SET_ITEM(rec, 4, headers);
        /* Only ints, bytes, str, None and untracked tuples inside: the record can never be part of
         * a reference cycle, so keep it out of the collector's way (large fetches otherwise spend
         * about half their decode time in GC passes). */
        PyObject_GC_UnTrack(rec);
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

static PyMethodDef methods[] = {
    {"decode_records", (PyCFunction)(void (*)(void))decode_records, METH_FASTCALL,
     "decode_records(buf, start, end, count, base_offset, base_timestamp, append_timestamp, "
     "record_type) -> list\n\nDecode a magic-2 records section into record tuples."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_crecords", "C accelerator for service.protocol.records.", 0, methods,
    NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__crecords(void)
{
    return PyModule_Create(&moduledef);
}
