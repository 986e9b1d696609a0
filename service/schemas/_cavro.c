/*
 * Optional accelerator for the avro consume path: Avro binary payloads rendered straight to the
 * JSON bytes the pure-Python path produces (AvroCodec.decode + orjson.dumps(..., OPT_NON_STR_KEYS)), with no
 * Python object per value.
 *
 * A schema is compiled once, by service/schemas/avro_fast.py, into a flat list of nodes (index 0 is the
 * root; named types refer to each other by index, so recursive schemas are plain cycles):
 *     (kind, size, child, kids, frags)
 *   kind   one of the K_* codes below (the Python side mirrors them)
 *   size   fixed: the byte count; array: 1 if its items may take zero bytes
 *   child  array: items node, map: values node
 *   kids   record: field type per field; union: node per branch
 *   frags  enum: the JSON string of each symbol; record: '"name":' per field (',' in front from the
 *          second field on); union: per branch the bytes written before the value ('{"tag":' when the
 *          rendering tags unions, else b"") -- a non-empty prefix is closed with '}' after the value
 * compile(nodes) -> Program.
 *
 * Anything this module is not sure about -- a payload that ends early, a varint longer than 10 bytes, invalid
 * UTF-8, a bad union or enum index, a negative or oversized length, a map with a repeated key, JSON nesting
 * deeper than MAX_DEPTH -- is a "bail": the value is not rendered here and the caller's Python fallback renders
 * it (that fallback is the reference implementation, so a bail can never change the output). Only the
 * successful path must match the reference byte for byte; the tests check it differentially.
 *
 * A hostile value is a "refusal", never a bail: one nested deeper than the depth limit (records, arrays and
 * maps inside each other), one decoding to more items (the value, every record field, every array or map
 * item) than its payload allows, one
 * rendering to more bytes than its payload allows, or a block count no payload of that size can hold. Limits
 * (a tuple, see avro_limits.py): (max_depth, items_per_byte, items_base, expansion, floor, cap): a value of n
 * payload bytes may nest max_depth levels, hold items_base + items_per_byte * n items and render to
 * min(cap, max(floor, expansion * n)) bytes. render_chunk hands a refused value to refuse(field, raw, code)
 * (its per-record error); scan() is the same check without rendering, for the Python decoders (it never
 * renders, so its byte bound is a lower bound of the rendering: the lengths of the fixed JSON pieces).
 * Refusal codes: R_DEPTH, R_ITEMS, R_BYTES, R_MALFORMED (scan only: the payload is not Avro of the schema).
 *
 * Functions:
 *   compile(nodes) -> Program
 *   render_value(program, payload[, limits]) -> bytes | None | int   (None: bail; int: refusal code)
 *   scan(program, payload[, limits]) -> int                (0: within the limits, else a refusal code)
 *   scan_many(program, payloads[, limits]) -> {index: code} (the refused payloads of a list)
 *   schema_ids(records) -> set[int]                        (ids of framed keys and values)
 *   render_chunk(records, head, sep, programs, fallback[, refuse[, limits]]) -> (bytes, payload)
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include "../protocol/kcg_base64.h"

enum {
    K_NULL = 0,
    K_BOOLEAN = 1,
    K_LONG = 2, /* int and long: both read as a 64-bit zigzag varint */
    K_FLOAT = 3,
    K_DOUBLE = 4,
    K_STRING = 5,
    K_BYTES_LATIN1 = 6, /* bytes as a JSON string of code points 0-255 */
    K_BYTES_B64 = 7,
    K_FIXED_LATIN1 = 8,
    K_FIXED_B64 = 9,
    K_ENUM = 10,
    K_ARRAY = 11,
    K_MAP = 12,
    K_RECORD = 13,
    K_UNION = 14,
    K_COUNT = 15,
};

/* JSON nesting ('{' or '[') beyond which a value bails (orjson refuses nesting beyond 255) */
#define MAX_DEPTH 128
/* the depth limit is clamped to this (the C stack of render_node/scan_node; the Python decoders recurse too) */
#define HARD_MAX_DEPTH 1000

#define OK 0
#define BAIL (-1)
#define ERR (-2)    /* a Python exception is set */
#define REFUSE (-3) /* over a limit: rd.why says which */

enum { R_NONE = 0, R_DEPTH = 1, R_ITEMS = 2, R_BYTES = 3, R_MALFORMED = 4 };

typedef struct {
    int max_depth;
    int64_t items_per_byte, items_base, expansion, floor, cap;
} limits;

static const limits DEFAULT_LIMITS = {64, 8, 4096, 64, 65536, 16 << 20};

/* limits from None (the defaults) or a 6-tuple of non-negative ints; -1 with an exception set */
static int
parse_limits(PyObject *obj, limits *out)
{
    *out = DEFAULT_LIMITS;
    if (obj == NULL || obj == Py_None)
        return 0;
    if (!PyTuple_Check(obj) || PyTuple_GET_SIZE(obj) != 6) {
        PyErr_SetString(PyExc_TypeError, "limits must be (max_depth, items_per_byte, items_base, expansion, "
                                         "floor, cap)");
        return -1;
    }
    int64_t v[6];
    for (int i = 0; i < 6; i++) {
        long long x = PyLong_AsLongLong(PyTuple_GET_ITEM(obj, i));
        if (x == -1 && PyErr_Occurred())
            return -1;
        if (x < 0 || x > ((int64_t)1 << 40)) {
            PyErr_SetString(PyExc_ValueError, "limits must be integers in 0..2**40");
            return -1;
        }
        v[i] = x;
    }
    out->max_depth = (int)(v[0] > HARD_MAX_DEPTH ? HARD_MAX_DEPTH : v[0]);
    out->items_per_byte = v[1];
    out->items_base = v[2];
    out->expansion = v[3];
    out->floor = v[4];
    out->cap = v[5];
    return 0;
}

/* ---- program ----------------------------------------------------------------------------------------- */

typedef struct {
    const char *s;
    Py_ssize_t n;
} frag;

typedef struct {
    int kind;
    Py_ssize_t size;
    Py_ssize_t child;
    Py_ssize_t n; /* kids / frags count */
    Py_ssize_t *kids;
    frag *frags;
} node;

typedef struct {
    PyObject_HEAD
    Py_ssize_t nnodes;
    node *nodes;
    PyObject *keep; /* the nodes list: owns the fragment bytes */
} Program;

static void
program_dealloc(Program *self)
{
    if (self->nodes != NULL) {
        for (Py_ssize_t i = 0; i < self->nnodes; i++) {
            PyMem_Free(self->nodes[i].kids);
            PyMem_Free(self->nodes[i].frags);
        }
        PyMem_Free(self->nodes);
    }
    Py_XDECREF(self->keep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyTypeObject ProgramType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "service.schemas._cavro.Program",
    .tp_basicsize = sizeof(Program),
    .tp_dealloc = (destructor)program_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A compiled Avro schema (see compile()).",
};

static PyObject *
py_compile(PyObject *module, PyObject *nodes)
{
    (void)module;
    if (!PyList_Check(nodes) || PyList_GET_SIZE(nodes) == 0) {
        PyErr_SetString(PyExc_TypeError, "compile() takes a non-empty list of node tuples");
        return NULL;
    }
    Py_ssize_t count = PyList_GET_SIZE(nodes);
    Program *prog = PyObject_New(Program, &ProgramType);
    if (prog == NULL)
        return NULL;
    prog->nnodes = count;
    prog->keep = Py_NewRef(nodes);
    prog->nodes = PyMem_Calloc((size_t)count, sizeof(node));
    if (prog->nodes == NULL) {
        Py_DECREF(prog);
        return PyErr_NoMemory();
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *t = PyList_GET_ITEM(nodes, i);
        node *nd = &prog->nodes[i];
        if (!PyTuple_Check(t) || PyTuple_GET_SIZE(t) != 5 || !PyTuple_Check(PyTuple_GET_ITEM(t, 3))
            || !PyTuple_Check(PyTuple_GET_ITEM(t, 4))) {
            PyErr_Format(PyExc_TypeError, "node %zd is not (kind, size, child, kids, frags)", i);
            goto fail;
        }
        long kind = PyLong_AsLong(PyTuple_GET_ITEM(t, 0));
        Py_ssize_t size = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 1));
        Py_ssize_t child = PyLong_AsSsize_t(PyTuple_GET_ITEM(t, 2));
        if (PyErr_Occurred())
            goto fail;
        if (kind < 0 || kind >= K_COUNT || size < 0 || child < -1 || child >= count) {
            PyErr_Format(PyExc_ValueError, "node %zd: bad kind, size or child", i);
            goto fail;
        }
        nd->kind = (int)kind;
        nd->size = size;
        nd->child = child;
        PyObject *kids = PyTuple_GET_ITEM(t, 3), *frags = PyTuple_GET_ITEM(t, 4);
        Py_ssize_t nk = PyTuple_GET_SIZE(kids), nf = PyTuple_GET_SIZE(frags);
        if ((kind == K_ARRAY || kind == K_MAP) && child < 0) {
            PyErr_Format(PyExc_ValueError, "node %zd: array/map without child", i);
            goto fail;
        }
        if ((kind == K_RECORD || kind == K_UNION) && nk != nf) {
            PyErr_Format(PyExc_ValueError, "node %zd: kids and frags differ in length", i);
            goto fail;
        }
        if (kind == K_UNION && nk == 0) {
            PyErr_Format(PyExc_ValueError, "node %zd: empty union", i);
            goto fail;
        }
        nd->n = kind == K_ENUM ? nf : nk;
        if (nk) {
            nd->kids = PyMem_Calloc((size_t)nk, sizeof(Py_ssize_t));
            if (nd->kids == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            for (Py_ssize_t k = 0; k < nk; k++) {
                Py_ssize_t v = PyLong_AsSsize_t(PyTuple_GET_ITEM(kids, k));
                if (v == -1 && PyErr_Occurred())
                    goto fail;
                if (v < 0 || v >= count) {
                    PyErr_Format(PyExc_ValueError, "node %zd: kid %zd out of range", i, k);
                    goto fail;
                }
                nd->kids[k] = v;
            }
        }
        if (nf) {
            nd->frags = PyMem_Calloc((size_t)nf, sizeof(frag));
            if (nd->frags == NULL) {
                PyErr_NoMemory();
                goto fail;
            }
            for (Py_ssize_t k = 0; k < nf; k++) {
                PyObject *b = PyTuple_GET_ITEM(frags, k);
                if (!PyBytes_Check(b)) {
                    PyErr_Format(PyExc_TypeError, "node %zd: frags must be bytes", i);
                    goto fail;
                }
                nd->frags[k].s = PyBytes_AS_STRING(b);
                nd->frags[k].n = PyBytes_GET_SIZE(b);
            }
        }
    }
    return (PyObject *)prog;
fail:
    Py_DECREF(prog);
    return NULL;
}

/* ---- output buffer ----------------------------------------------------------------------------------- */

typedef struct {
    char *buf;
    Py_ssize_t len, cap;
} obuf;

static int
grow(obuf *o, Py_ssize_t need)
{
    Py_ssize_t cap = o->cap ? o->cap : 4096;
    while (cap - o->len < need) {
        if (cap > PY_SSIZE_T_MAX / 2) {
            PyErr_NoMemory();
            return ERR;
        }
        cap *= 2;
    }
    char *nb = PyMem_Realloc(o->buf, (size_t)cap);
    if (nb == NULL) {
        PyErr_NoMemory();
        return ERR;
    }
    o->buf = nb;
    o->cap = cap;
    return OK;
}

#define RESERVE(o, k)                                                                                 \
    do {                                                                                              \
        if ((o)->cap - (o)->len < (Py_ssize_t)(k) && grow((o), (Py_ssize_t)(k)) < 0)                  \
            return ERR;                                                                               \
    } while (0)

static inline void
put(obuf *o, const char *s, Py_ssize_t n)
{
    memcpy(o->buf + o->len, s, (size_t)n);
    o->len += n;
}

#define PUTLIT(o, lit) put((o), (lit), (Py_ssize_t)(sizeof(lit) - 1))

static const char HEX[] = "0123456789abcdef";

static inline void
put_i64(obuf *o, int64_t v)
{
    char tmp[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v;
    do {
        tmp[n++] = (char)('0' + (u % 10));
        u /= 10;
    } while (u);
    char *p = o->buf + o->len;
    if (v < 0)
        *p++ = '-';
    while (n)
        *p++ = tmp[--n];
    o->len = p - o->buf;
}

/* One JSON-escaped byte below 0x20, '"' or '\\' (orjson's forms). Returns bytes written. */
static inline int
esc(char *p, unsigned char ch)
{
    p[0] = '\\';
    switch (ch) {
    case '"': p[1] = '"'; return 2;
    case '\\': p[1] = '\\'; return 2;
    case '\n': p[1] = 'n'; return 2;
    case '\r': p[1] = 'r'; return 2;
    case '\t': p[1] = 't'; return 2;
    case '\b': p[1] = 'b'; return 2;
    case '\f': p[1] = 'f'; return 2;
    default:
        p[1] = 'u'; p[2] = '0'; p[3] = '0'; p[4] = HEX[ch >> 4]; p[5] = HEX[ch & 15];
        return 6;
    }
}

/* '"' + s (valid UTF-8, checked as strictly as Python's decoder) escaped + '"'. BAIL on invalid UTF-8. */
static int
put_utf8_string(obuf *o, const unsigned char *s, Py_ssize_t n)
{
    RESERVE(o, 6 * n + 2);
    char *p = o->buf + o->len;
    *p++ = '"';
    Py_ssize_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) {
            if (c < 0x20 || c == '"' || c == '\\')
                p += esc(p, c);
            else
                *p++ = (char)c;
            i++;
            continue;
        }
        Py_ssize_t len;
        if (c >= 0xC2 && c <= 0xDF) {
            if (i + 1 >= n || (s[i + 1] & 0xC0) != 0x80)
                return BAIL;
            len = 2;
        } else if (c >= 0xE0 && c <= 0xEF) {
            if (i + 2 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80)
                return BAIL;
            if (c == 0xE0 && s[i + 1] < 0xA0)
                return BAIL; /* overlong */
            if (c == 0xED && s[i + 1] >= 0xA0)
                return BAIL; /* surrogate */
            len = 3;
        } else if (c >= 0xF0 && c <= 0xF4) {
            if (i + 3 >= n || (s[i + 1] & 0xC0) != 0x80 || (s[i + 2] & 0xC0) != 0x80
                || (s[i + 3] & 0xC0) != 0x80)
                return BAIL;
            if (c == 0xF0 && s[i + 1] < 0x90)
                return BAIL; /* overlong */
            if (c == 0xF4 && s[i + 1] >= 0x90)
                return BAIL; /* above U+10FFFF */
            len = 4;
        } else {
            return BAIL;
        }
        memcpy(p, s + i, (size_t)len);
        p += len;
        i += len;
    }
    *p++ = '"';
    o->len = p - o->buf;
    return OK;
}

/* bytes as a JSON string of code points 0-255 (ISO-8859-1 decoded, then UTF-8 encoded) */
static int
put_latin1_string(obuf *o, const unsigned char *s, Py_ssize_t n)
{
    RESERVE(o, 6 * n + 2);
    char *p = o->buf + o->len;
    *p++ = '"';
    for (Py_ssize_t i = 0; i < n; i++) {
        unsigned char c = s[i];
        if (c >= 0x80) {
            *p++ = (char)(0xC0 | (c >> 6));
            *p++ = (char)(0x80 | (c & 0x3F));
        } else if (c < 0x20 || c == '"' || c == '\\') {
            p += esc(p, c);
        } else {
            *p++ = (char)c;
        }
    }
    *p++ = '"';
    o->len = p - o->buf;
    return OK;
}

static int
put_b64_string(obuf *o, const unsigned char *s, Py_ssize_t n)
{
    Py_ssize_t m = kcg_b64_len(n);
    RESERVE(o, m + 2);
    char *p = o->buf + o->len;
    *p++ = '"';
    kcg_b64_put(p, s, n);
    p[m] = '"';
    o->len += m + 2;
    return OK;
}

/*
 * A double as orjson writes it: NaN and infinities as null; otherwise the shortest round-trip digits
 * (Python's repr), in positional notation for decimal exponents -5..15 and scientific otherwise
 * ("1e-7", "1.5e+16"): repr's form, except that orjson writes exponent -5 positionally and never pads
 * the exponent with a zero.
 */
static const double POW10[] = {1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7};

/*
 * Fast path for the common short decimals (prices, ratios, whole numbers): 1e-4 <= |x| < 1e14 equal to
 * m / 10^k for an integer m < 2^49 and k <= 7. The smallest such k gives repr's shortest digits: m / 10^k is
 * correctly rounded (m and 10^k are exact), and below 2^49 two decimals of k places are 8 ulps apart or more,
 * so no other string of that length round-trips. Positional in both repr and orjson in this range.
 * Returns 1 when written, 0 when the general path must do it.
 */
static inline int
put_short_decimal(obuf *o, double x)
{
    double a = x < 0 ? -x : x;
    if (!(a >= 1e-4 && a < 1e14))
        return 0;
    for (int k = 0; k <= 7; k++) {
        double scaled = a * POW10[k];
        if (scaled >= 562949953421312.0) /* 2^49 */
            return 0;
        double m = nearbyint(scaled);
        if (m / POW10[k] != a)
            continue;
        uint64_t u = (uint64_t)m;
        char tmp[32];
        int n = 0;
        for (int d = 0; d < k; d++) {
            tmp[n++] = (char)('0' + u % 10);
            u /= 10;
        }
        if (k == 0)
            tmp[n++] = '0';
        tmp[n++] = '.';
        do {
            tmp[n++] = (char)('0' + u % 10);
            u /= 10;
        } while (u);
        char *p = o->buf + o->len;
        if (x < 0)
            *p++ = '-';
        while (n)
            *p++ = tmp[--n];
        o->len = p - o->buf;
        return 1;
    }
    return 0;
}

static int
put_double(obuf *o, double x)
{
    RESERVE(o, 40);
    if (isnan(x) || isinf(x)) {
        PUTLIT(o, "null");
        return OK;
    }
    if (put_short_decimal(o, x))
        return OK;
    char *r = PyOS_double_to_string(x, 'r', 0, Py_DTSF_ADD_DOT_0, NULL);
    if (r == NULL)
        return ERR;
    size_t n = strlen(r);
    char *e = memchr(r, 'e', n);
    if (e == NULL) {
        if (n > 32) { /* cannot happen for repr of a finite double; be safe */
            PyMem_Free(r);
            return BAIL;
        }
        put(o, r, (Py_ssize_t)n);
        PyMem_Free(r);
        return OK;
    }
    int exp = atoi(e + 1);
    char *p = o->buf + o->len;
    const char *m = r;
    if (*m == '-') {
        *p++ = '-';
        m++;
    }
    if (exp == -5) { /* d.ddde-05 -> 0.0000dddd */
        memcpy(p, "0.0000", 6);
        p += 6;
        for (; m < e; m++)
            if (*m != '.')
                *p++ = *m;
    } else {
        memcpy(p, m, (size_t)(e - m));
        p += e - m;
        *p++ = 'e';
        *p++ = exp < 0 ? '-' : '+';
        int a = exp < 0 ? -exp : exp;
        char tmp[8];
        int k = 0;
        do {
            tmp[k++] = (char)('0' + a % 10);
            a /= 10;
        } while (a);
        while (k)
            *p++ = tmp[--k];
    }
    o->len = p - o->buf;
    PyMem_Free(r);
    return OK;
}

/* ---- decoding ---------------------------------------------------------------------------------------- */

typedef struct {
    const unsigned char *p;
    Py_ssize_t pos, end;
    /* the limits of this one value */
    int cdepth, max_depth; /* scan: records, arrays and maps we are inside; the most allowed */
    int why;               /* the refusal code of REFUSE */
    int64_t items, max_items;
    Py_ssize_t mark, max_out; /* rendering: the output length where the value began; its most bytes */
    int64_t est;              /* scan: the fixed JSON pieces counted so far (a lower bound of the output) */
} rd;

/* a reader of payload[pos:end] with the limits of a value of end - pos bytes */
static inline void
rd_init(rd *r, const unsigned char *p, Py_ssize_t pos, Py_ssize_t end, const limits *lim, Py_ssize_t mark)
{
    int64_t n = end - pos;
    r->p = p;
    r->pos = pos;
    r->end = end;
    r->cdepth = 0;
    r->max_depth = lim->max_depth;
    r->why = R_NONE;
    r->items = 1; /* the value itself; then every record field and every array / map item */
    r->max_items = lim->items_base + lim->items_per_byte * n;
    int64_t out = lim->expansion * n;
    if (out < lim->floor)
        out = lim->floor;
    if (out > lim->cap)
        out = lim->cap;
    r->mark = mark;
    r->max_out = (Py_ssize_t)out;
    r->est = 0;
}

#define REFUSED(r, code)                                                                              \
    do {                                                                                              \
        (r)->why = (code);                                                                            \
        return REFUSE;                                                                                \
    } while (0)

/* zigzag varint of at most 10 bytes whose value fits 64 bits; BAIL otherwise */
static inline int
read_long(rd *r, int64_t *out)
{
    uint64_t result = 0;
    int shift = 0;
    Py_ssize_t pos = r->pos;
    for (int i = 0; i < 10; i++) {
        if (pos >= r->end)
            return BAIL;
        unsigned char b = r->p[pos++];
        if (i == 9 && b > 1)
            return BAIL;
        result |= (uint64_t)(b & 0x7F) << shift;
        if (b < 0x80) {
            r->pos = pos;
            *out = (int64_t)(result >> 1) ^ -(int64_t)(result & 1);
            return OK;
        }
        shift += 7;
    }
    return BAIL;
}

typedef struct {
    const unsigned char *s;
    Py_ssize_t n;
} keyref;

static int
keycmp(const void *a, const void *b)
{
    const keyref *x = a, *y = b;
    if (x->n != y->n)
        return x->n < y->n ? -1 : 1;
    return memcmp(x->s, y->s, (size_t)x->n);
}

/* 1 if a key repeats (Python's dict would keep one), 0 if not, ERR */
static int
has_duplicates(keyref *keys, Py_ssize_t n)
{
    if (n < 2)
        return 0;
    if (n <= 32) {
        for (Py_ssize_t i = 1; i < n; i++)
            for (Py_ssize_t j = 0; j < i; j++)
                if (keys[i].n == keys[j].n && memcmp(keys[i].s, keys[j].s, (size_t)keys[i].n) == 0)
                    return 1;
        return 0;
    }
    qsort(keys, (size_t)n, sizeof(keyref), keycmp);
    for (Py_ssize_t i = 1; i < n; i++)
        if (keycmp(&keys[i - 1], &keys[i]) == 0)
            return 1;
    return 0;
}

/* scan entering a record, array or map: the depth, items and bytes so far (the fixed pieces' estimate) */
#define ENTER(r, out)                                                                                 \
    do {                                                                                              \
        if (++(r)->cdepth > (r)->max_depth)                                                           \
            REFUSED((r), R_DEPTH);                                                                    \
        if ((r)->items > (r)->max_items)                                                              \
            REFUSED((r), R_ITEMS);                                                                    \
        if ((out) > (r)->max_out)                                                                     \
            REFUSED((r), R_BYTES);                                                                    \
    } while (0)

/*
 * render_node's depth holds two counts: the JSON nesting (low 16 bits: '{' or '[', tagged unions included;
 * MAX_DEPTH bails) and the records, arrays and maps we are inside (above: the depth limit refuses).
 */
#define CONTAINER 0x10001
#define JDEPTH(d) ((d) & 0xFFFF)
/* the container count starts at DEPTH_TOP - max_depth, so the limit is a compare with a constant */
#define DEPTH_TOP 0x4000
#define DEPTH_START(max_depth) ((DEPTH_TOP - (max_depth)) << 16)
#define TOO_DEEP(d) ((d) >= (DEPTH_TOP << 16))

static int render_node(const Program *prog, Py_ssize_t idx, rd *r, obuf *o, int depth);

/* array or map blocks; for maps, keys are collected to reject repeats */
static int
render_blocks(const Program *prog, const node *nd, rd *r, obuf *o, int depth, int is_map)
{
    RESERVE(o, 1);
    put(o, is_map ? "{" : "[", 1);
    Py_ssize_t items = 0;
    keyref *keys = NULL;
    Py_ssize_t nkeys = 0, capkeys = 0;
    int rc = OK;
    for (;;) {
        int64_t count;
        if ((rc = read_long(r, &count)) < 0)
            goto done;
        if (count == 0)
            break;
        if (count < 0) {
            if (count == INT64_MIN) {
                rc = BAIL;
                goto done;
            }
            count = -count;
            int64_t size;
            if ((rc = read_long(r, &size)) < 0)
                goto done;
            if (size < 0) {
                rc = BAIL;
                goto done;
            }
        }
        /* each item is an item at least: refused at once, never looped over */
        if (count > r->max_items - r->items) {
            r->why = R_ITEMS;
            rc = REFUSE;
            goto done;
        }
        r->items += count;
        /* every item takes a byte at least, unless the items may be empty (node size 1) */
        if (!nd->size && count > r->end - r->pos) {
            r->why = R_MALFORMED;
            rc = REFUSE;
            goto done;
        }
        if (is_map && nkeys + count > capkeys) {
            Py_ssize_t nc = capkeys ? capkeys : 16;
            while (nc < nkeys + count)
                nc *= 2;
            keyref *nk = PyMem_Realloc(keys, (size_t)nc * sizeof(keyref));
            if (nk == NULL) {
                PyErr_NoMemory();
                rc = ERR;
                goto done;
            }
            keys = nk;
            capkeys = nc;
        }
        for (int64_t i = 0; i < count; i++) {
            if (items++) {
                if (o->cap - o->len < 1 && grow(o, 1) < 0) {
                    rc = ERR;
                    goto done;
                }
                put(o, ",", 1);
            }
            if (is_map) {
                int64_t klen;
                if ((rc = read_long(r, &klen)) < 0)
                    goto done;
                if (klen < 0 || klen > r->end - r->pos) {
                    rc = BAIL;
                    goto done;
                }
                const unsigned char *ks = r->p + r->pos;
                r->pos += (Py_ssize_t)klen;
                keys[nkeys].s = ks;
                keys[nkeys].n = (Py_ssize_t)klen;
                nkeys++;
                if ((rc = put_utf8_string(o, ks, (Py_ssize_t)klen)) < 0)
                    goto done;
                if (o->cap - o->len < 1 && grow(o, 1) < 0) {
                    rc = ERR;
                    goto done;
                }
                put(o, ":", 1);
            }
            if ((rc = render_node(prog, nd->child, r, o, depth)) < 0)
                goto done;
            if (o->len - r->mark > r->max_out) {
                r->why = R_BYTES;
                rc = REFUSE;
                goto done;
            }
        }
    }
    if (is_map) {
        rc = has_duplicates(keys, nkeys);
        if (rc == 1) {
            rc = BAIL;
            goto done;
        }
    }
    if (o->cap - o->len < 1 && grow(o, 1) < 0) {
        rc = ERR;
        goto done;
    }
    put(o, is_map ? "}" : "]", 1);
    rc = OK;
done:
    PyMem_Free(keys);
    return rc;
}

static int
render_node(const Program *prog, Py_ssize_t idx, rd *r, obuf *o, int depth)
{
    const node *nd = &prog->nodes[idx];
    int64_t v;
    int rc;
    switch (nd->kind) {
    case K_NULL:
        RESERVE(o, 4);
        PUTLIT(o, "null");
        return OK;
    case K_BOOLEAN:
        if (r->pos >= r->end)
            return BAIL;
        RESERVE(o, 5);
        if (r->p[r->pos++])
            PUTLIT(o, "true");
        else
            PUTLIT(o, "false");
        return OK;
    case K_LONG:
        if ((rc = read_long(r, &v)) < 0)
            return rc;
        RESERVE(o, 24);
        put_i64(o, v);
        return OK;
    case K_FLOAT: {
        if (r->end - r->pos < 4)
            return BAIL;
        const unsigned char *b = r->p + r->pos;
        uint32_t u = (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
        float f;
        memcpy(&f, &u, 4);
        r->pos += 4;
        return put_double(o, (double)f);
    }
    case K_DOUBLE: {
        if (r->end - r->pos < 8)
            return BAIL;
        const unsigned char *b = r->p + r->pos;
        uint64_t u = 0;
        for (int i = 7; i >= 0; i--)
            u = (u << 8) | b[i];
        double d;
        memcpy(&d, &u, 8);
        r->pos += 8;
        return put_double(o, d);
    }
    case K_STRING:
    case K_BYTES_LATIN1:
    case K_BYTES_B64: {
        if ((rc = read_long(r, &v)) < 0)
            return rc;
        if (v < 0 || v > r->end - r->pos)
            return BAIL;
        const unsigned char *s = r->p + r->pos;
        r->pos += (Py_ssize_t)v;
        if (nd->kind == K_STRING)
            return put_utf8_string(o, s, (Py_ssize_t)v);
        if (nd->kind == K_BYTES_LATIN1)
            return put_latin1_string(o, s, (Py_ssize_t)v);
        return put_b64_string(o, s, (Py_ssize_t)v);
    }
    case K_FIXED_LATIN1:
    case K_FIXED_B64: {
        if (nd->size > r->end - r->pos)
            return BAIL;
        const unsigned char *s = r->p + r->pos;
        r->pos += nd->size;
        if (nd->kind == K_FIXED_LATIN1)
            return put_latin1_string(o, s, nd->size);
        return put_b64_string(o, s, nd->size);
    }
    case K_ENUM:
        if ((rc = read_long(r, &v)) < 0)
            return rc;
        if (v < 0 || v >= nd->n)
            return BAIL;
        RESERVE(o, nd->frags[v].n);
        put(o, nd->frags[v].s, nd->frags[v].n);
        return OK;
    /* items are checked where they are added (blocks, records): never over the limit at an entry */
    case K_ARRAY:
    case K_MAP:
        if (TOO_DEEP(depth))
            REFUSED(r, R_DEPTH);
        if (JDEPTH(depth) >= MAX_DEPTH)
            return BAIL;
        return render_blocks(prog, nd, r, o, depth + CONTAINER, nd->kind == K_MAP);
    case K_RECORD:
        if (TOO_DEEP(depth))
            REFUSED(r, R_DEPTH);
        if (JDEPTH(depth) >= MAX_DEPTH)
            return BAIL;
        if ((r->items += nd->n) > r->max_items)
            REFUSED(r, R_ITEMS);
        RESERVE(o, 1);
        put(o, "{", 1);
        for (Py_ssize_t i = 0; i < nd->n; i++) {
            RESERVE(o, nd->frags[i].n);
            put(o, nd->frags[i].s, nd->frags[i].n);
            if ((rc = render_node(prog, nd->kids[i], r, o, depth + CONTAINER)) < 0)
                return rc;
        }
        RESERVE(o, 1);
        put(o, "}", 1);
        return OK;
    case K_UNION: {
        if ((rc = read_long(r, &v)) < 0)
            return rc;
        if (v < 0 || v >= nd->n)
            return BAIL;
        Py_ssize_t branch = nd->kids[v];
        const frag *pre = &nd->frags[v];
        if (prog->nodes[branch].kind == K_NULL || pre->n == 0)
            return render_node(prog, branch, r, o, depth);
        if (JDEPTH(depth) >= MAX_DEPTH)
            return BAIL;
        RESERVE(o, pre->n);
        put(o, pre->s, pre->n);
        if ((rc = render_node(prog, branch, r, o, depth + 1)) < 0)
            return rc;
        RESERVE(o, 1);
        put(o, "}", 1);
        return OK;
    }
    }
    return BAIL;
}

/* ---- scan: the limits checked without rendering (the Python decoders' guard) -------------------------- */

/*
 * The walk render_node does, without output: the same refusals at the same places, and R_MALFORMED where
 * rendering would bail on the structure (UTF-8 and repeated map keys are not checked: the decoder behind the
 * scan reports them). r->est counts the fixed JSON pieces of the value (every rendering writes them at
 * least): null, true/false (4), a number (1), quotes (2), enum symbols, record braces and field names,
 * array / map brackets, map key quotes and colons. Recursion is bounded by the depth limit.
 */
static int
scan_node(const Program *prog, Py_ssize_t idx, rd *r)
{
    const node *nd = &prog->nodes[idx];
    int64_t v;
    int rc;
    switch (nd->kind) {
    case K_NULL:
        r->est += 4;
        return OK;
    case K_BOOLEAN:
        if (r->pos >= r->end)
            REFUSED(r, R_MALFORMED);
        r->pos++;
        r->est += 4;
        return OK;
    case K_LONG:
        if (read_long(r, &v) < 0)
            REFUSED(r, R_MALFORMED);
        r->est += 1;
        return OK;
    case K_FLOAT:
    case K_DOUBLE: {
        Py_ssize_t w = nd->kind == K_FLOAT ? 4 : 8;
        if (r->end - r->pos < w)
            REFUSED(r, R_MALFORMED);
        r->pos += w;
        r->est += 1;
        return OK;
    }
    case K_STRING:
    case K_BYTES_LATIN1:
    case K_BYTES_B64:
        if (read_long(r, &v) < 0 || v < 0 || v > r->end - r->pos)
            REFUSED(r, R_MALFORMED);
        r->pos += (Py_ssize_t)v;
        r->est += 2;
        return OK;
    case K_FIXED_LATIN1:
    case K_FIXED_B64:
        if (nd->size > r->end - r->pos)
            REFUSED(r, R_MALFORMED);
        r->pos += nd->size;
        r->est += 2;
        return OK;
    case K_ENUM:
        if (read_long(r, &v) < 0 || v < 0 || v >= nd->n)
            REFUSED(r, R_MALFORMED);
        r->est += nd->frags[v].n;
        return OK;
    case K_ARRAY:
    case K_MAP: {
        int is_map = nd->kind == K_MAP;
        ENTER(r, r->est);
        r->est += 2;
        for (;;) {
            int64_t count;
            if (read_long(r, &count) < 0)
                REFUSED(r, R_MALFORMED);
            if (count == 0)
                break;
            if (count < 0) {
                int64_t size;
                if (count == INT64_MIN || read_long(r, &size) < 0 || size < 0)
                    REFUSED(r, R_MALFORMED);
                count = -count;
            }
            if (count > r->max_items - r->items)
                REFUSED(r, R_ITEMS);
            r->items += count;
            if (!nd->size && count > r->end - r->pos)
                REFUSED(r, R_MALFORMED);
            for (int64_t i = 0; i < count; i++) {
                if (is_map) {
                    int64_t klen;
                    if (read_long(r, &klen) < 0 || klen < 0 || klen > r->end - r->pos)
                        REFUSED(r, R_MALFORMED);
                    r->pos += (Py_ssize_t)klen;
                    r->est += 3;
                }
                if ((rc = scan_node(prog, nd->child, r)) < 0)
                    return rc;
                if (r->est > r->max_out)
                    REFUSED(r, R_BYTES);
            }
        }
        r->cdepth--;
        return OK;
    }
    case K_RECORD:
        ENTER(r, r->est);
        r->items += nd->n;
        r->est += 2;
        for (Py_ssize_t i = 0; i < nd->n; i++) {
            r->est += nd->frags[i].n;
            if ((rc = scan_node(prog, nd->kids[i], r)) < 0)
                return rc;
        }
        r->cdepth--;
        return OK;
    case K_UNION:
        if (read_long(r, &v) < 0 || v < 0 || v >= nd->n)
            REFUSED(r, R_MALFORMED);
        return scan_node(prog, nd->kids[v], r);
    }
    REFUSED(r, R_MALFORMED);
}

/* the refusal code of one value (R_NONE: within the limits) */
static int
scan_value(const Program *prog, const unsigned char *p, Py_ssize_t n, const limits *lim)
{
    rd r;
    rd_init(&r, p, 0, n, lim, 0);
    if (scan_node(prog, 0, &r) == REFUSE)
        return r.why;
    if (r.items > r.max_items)
        return R_ITEMS;
    if (r.est > r.max_out)
        return R_BYTES;
    return R_NONE;
}

static PyObject *
py_scan(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 2 || nargs > 3 || !PyObject_TypeCheck(args[0], &ProgramType)) {
        PyErr_SetString(PyExc_TypeError, "scan(program, payload[, limits])");
        return NULL;
    }
    limits lim;
    if (parse_limits(nargs == 3 ? args[2] : NULL, &lim) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    int code = scan_value((Program *)args[0], (const unsigned char *)view.buf, view.len, &lim);
    PyBuffer_Release(&view);
    return PyLong_FromLong(code);
}

static PyObject *
py_scan_many(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 2 || nargs > 3 || !PyObject_TypeCheck(args[0], &ProgramType) || !PyList_Check(args[1])) {
        PyErr_SetString(PyExc_TypeError, "scan_many(program, payloads: list[bytes-like][, limits])");
        return NULL;
    }
    limits lim;
    if (parse_limits(nargs == 3 ? args[2] : NULL, &lim) < 0)
        return NULL;
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    PyObject *list = args[1];
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(list); i++) {
        PyObject *item = PyList_GET_ITEM(list, i);
        int code;
        if (PyBytes_Check(item)) {
            code = scan_value((Program *)args[0], (const unsigned char *)PyBytes_AS_STRING(item),
                              PyBytes_GET_SIZE(item), &lim);
        } else {
            Py_buffer view;
            if (PyObject_GetBuffer(item, &view, PyBUF_SIMPLE) < 0) {
                Py_DECREF(out);
                return NULL;
            }
            code = scan_value((Program *)args[0], (const unsigned char *)view.buf, view.len, &lim);
            PyBuffer_Release(&view);
        }
        if (code == R_NONE)
            continue;
        PyObject *k = PyLong_FromSsize_t(i), *v = PyLong_FromLong(code);
        if (k == NULL || v == NULL || PyDict_SetItem(out, k, v) < 0) {
            Py_XDECREF(k);
            Py_XDECREF(v);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(k);
        Py_DECREF(v);
    }
    return out;
}

/* after a value rendered without refusal: the totals (checked at the end, as scan_value does) */
static inline int
final_check(rd *r, const obuf *o)
{
    if (r->items > r->max_items) /* the value itself against a limit of 0; the rest is checked when added */
        REFUSED(r, R_ITEMS);
    if (o->len - r->mark > r->max_out)
        REFUSED(r, R_BYTES);
    return OK;
}

/* ---- module functions -------------------------------------------------------------------------------- */

static PyObject *
py_render_value(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 2 || nargs > 3 || !PyObject_TypeCheck(args[0], &ProgramType)) {
        PyErr_SetString(PyExc_TypeError, "render_value(program, payload[, limits])");
        return NULL;
    }
    limits lim;
    if (parse_limits(nargs == 3 ? args[2] : NULL, &lim) < 0)
        return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[1], &view, PyBUF_SIMPLE) < 0)
        return NULL;
    obuf o = {NULL, 0, 0};
    rd r;
    rd_init(&r, (const unsigned char *)view.buf, 0, view.len, &lim, 0);
    int rc = render_node((Program *)args[0], 0, &r, &o, DEPTH_START(lim.max_depth));
    if (rc == OK)
        rc = final_check(&r, &o);
    PyBuffer_Release(&view);
    PyObject *res;
    if (rc == OK)
        res = PyBytes_FromStringAndSize(o.buf ? o.buf : "", o.len);
    else if (rc == BAIL)
        res = Py_NewRef(Py_None);
    else if (rc == REFUSE)
        res = PyLong_FromLong(r.why);
    else
        res = NULL;
    PyMem_Free(o.buf);
    return res;
}

static inline int
framed_id(PyObject *v, uint32_t *id)
{
    if (!PyBytes_Check(v) || PyBytes_GET_SIZE(v) < 5)
        return 0;
    const unsigned char *p = (const unsigned char *)PyBytes_AS_STRING(v);
    if (p[0] != 0)
        return 0;
    *id = ((uint32_t)p[1] << 24) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 8) | p[4];
    return 1;
}

static PyObject *
py_schema_ids(PyObject *module, PyObject *records)
{
    (void)module;
    if (!PyList_Check(records)) {
        PyErr_SetString(PyExc_TypeError, "schema_ids(list of record tuples)");
        return NULL;
    }
    PyObject *ids = PySet_New(NULL);
    if (ids == NULL)
        return NULL;
    int64_t last = -1;
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(records); i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) < 4) {
            Py_DECREF(ids);
            PyErr_Format(PyExc_TypeError, "record %zd is not a record tuple", i);
            return NULL;
        }
        for (int f = 2; f <= 3; f++) {
            uint32_t id;
            if (!framed_id(PyTuple_GET_ITEM(rec, f), &id) || (int64_t)id == last)
                continue;
            last = id;
            PyObject *k = PyLong_FromUnsignedLong(id);
            if (k == NULL || PySet_Add(ids, k) < 0) {
                Py_XDECREF(k);
                Py_DECREF(ids);
                return NULL;
            }
            Py_DECREF(k);
        }
    }
    return ids;
}

typedef struct {
    PyObject *programs; /* dict id -> Program */
    PyObject *fallback;
    PyObject *refuse; /* refuse(field, raw, code) -> the field's bytes; NULL: the fallback renders it */
    limits lim;
    int64_t last_id;
    Program *last_prog; /* borrowed from programs; NULL: the id has none */
} field_ctx;

static int put_field_result(obuf *o, PyObject *res);

/* '"<name>":' + the value, or the fallback's bytes */
static int
render_field(field_ctx *fc, obuf *o, PyObject *v, const char *name, Py_ssize_t name_len, PyObject *pyname)
{
    RESERVE(o, name_len + 8);
    if (v == Py_None) {
        put(o, "\"", 1);
        put(o, name, name_len);
        PUTLIT(o, "\":null");
        return OK;
    }
    uint32_t id;
    if (framed_id(v, &id)) {
        Program *prog;
        if ((int64_t)id == fc->last_id) {
            prog = fc->last_prog;
        } else {
            PyObject *k = PyLong_FromUnsignedLong(id);
            if (k == NULL)
                return ERR;
            PyObject *p = PyDict_GetItemWithError(fc->programs, k);
            Py_DECREF(k);
            if (p == NULL && PyErr_Occurred())
                return ERR;
            prog = (p != NULL && PyObject_TypeCheck(p, &ProgramType)) ? (Program *)p : NULL;
            fc->last_id = id;
            fc->last_prog = prog;
        }
        if (prog != NULL) {
            Py_ssize_t mark = o->len;
            put(o, "\"", 1);
            put(o, name, name_len);
            PUTLIT(o, "\":");
            rd r;
            rd_init(&r, (const unsigned char *)PyBytes_AS_STRING(v), 5, PyBytes_GET_SIZE(v), &fc->lim, o->len);
            int rc = render_node(prog, 0, &r, o, DEPTH_START(fc->lim.max_depth));
            if (rc == OK)
                rc = final_check(&r, o);
            if (rc == OK)
                return OK;
            if (rc == ERR)
                return ERR;
            o->len = mark;
            if (rc == REFUSE && fc->refuse != NULL) { /* that record's error: never a decoder that may not */
                PyObject *code = PyLong_FromLong(r.why);
                if (code == NULL)
                    return ERR;
                PyObject *res = PyObject_CallFunctionObjArgs(fc->refuse, pyname, v, code, NULL);
                Py_DECREF(code);
                return put_field_result(o, res);
            }
        }
    }
    return put_field_result(o, PyObject_CallFunctionObjArgs(fc->fallback, pyname, v, NULL));
}

/* a fallback's or refuse's result (a new reference or NULL) appended */
static int
put_field_result(obuf *o, PyObject *res)
{
    if (res == NULL)
        return ERR;
    if (!PyBytes_Check(res)) {
        Py_DECREF(res);
        PyErr_SetString(PyExc_TypeError, "the fallback must return bytes");
        return ERR;
    }
    Py_ssize_t n = PyBytes_GET_SIZE(res);
    if (o->cap - o->len < n && grow(o, n) < 0) {
        Py_DECREF(res);
        return ERR;
    }
    put(o, PyBytes_AS_STRING(res), n);
    Py_DECREF(res);
    return OK;
}

static inline int
put_b64_or_null(obuf *o, PyObject *v)
{
    if (v == Py_None) {
        RESERVE(o, 4);
        PUTLIT(o, "null");
        return OK;
    }
    return put_b64_string(o, (const unsigned char *)PyBytes_AS_STRING(v), PyBytes_GET_SIZE(v));
}

static obuf shared_buf = {NULL, 0, 0};
static int shared_busy = 0;
#define SHARED_KEEP_MAX (8 << 20) /* a bigger buffer is freed after the call */

static void
release_buf(obuf *o, int shared)
{
    if (shared && o->cap <= SHARED_KEEP_MAX) {
        shared_buf = *o;
    } else {
        PyMem_Free(o->buf);
        if (shared)
            shared_buf = (obuf){NULL, 0, 0};
    }
    if (shared)
        shared_busy = 0;
}

/* an int as a 64-bit integer; -1 with OverflowError / TypeError set. PyLong_AsLongLong takes a slow generic
   path for an int of more than one 30-bit digit (every timestamp); this one loops over the digits. */
static inline int
as_i64(PyObject *v, long long *out)
{
    int overflow;
    long long x = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow) {
        PyErr_SetString(PyExc_OverflowError, "offset or timestamp out of the 64-bit range");
        return -1;
    }
    if (x == -1 && PyErr_Occurred())
        return -1;
    *out = x;
    return 0;
}

static PyObject *
py_render_chunk(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    (void)module;
    if (nargs < 5 || nargs > 7 || !PyList_Check(args[0]) || !PyBytes_Check(args[1]) || !PyBytes_Check(args[2])
        || !PyDict_Check(args[3]) || !PyCallable_Check(args[4])
        || (nargs >= 6 && args[5] != Py_None && !PyCallable_Check(args[5]))) {
        PyErr_SetString(PyExc_TypeError, "render_chunk(records: list, head: bytes, sep: bytes, programs: dict, "
                                         "fallback: callable[, refuse: callable | None[, limits]])");
        return NULL;
    }
    PyObject *records = args[0], *head = args[1], *sep = args[2];
    static PyObject *key_name = NULL, *value_name = NULL;
    if (key_name == NULL) {
        key_name = PyBytes_FromString("key");
        value_name = PyBytes_FromString("value");
        if (key_name == NULL || value_name == NULL)
            return NULL;
    }
    field_ctx fc = {args[3], args[4], (nargs >= 6 && args[5] != Py_None) ? args[5] : NULL, DEFAULT_LIMITS, -1,
                    NULL};
    if (parse_limits(nargs == 7 ? args[6] : NULL, &fc.lim) < 0)
        return NULL;
    /* one buffer kept between calls (no page faults and regrowth per chunk); a nested call gets its own */
    obuf o = {NULL, 0, 0};
    int shared = !shared_busy;
    if (shared) {
        o = shared_buf;
        o.len = 0;
        shared_busy = 1;
    }
    Py_ssize_t payload = 0;
    Py_ssize_t count = PyList_GET_SIZE(records);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *rec = PyList_GET_ITEM(records, i);
        if (!PyTuple_Check(rec) || PyTuple_GET_SIZE(rec) != 5) {
            PyErr_Format(PyExc_TypeError, "record %zd is not a 5-tuple", i);
            goto fail;
        }
        PyObject *key = PyTuple_GET_ITEM(rec, 2), *value = PyTuple_GET_ITEM(rec, 3);
        PyObject *headers = PyTuple_GET_ITEM(rec, 4);
        if ((key != Py_None && !PyBytes_Check(key)) || (value != Py_None && !PyBytes_Check(value))
            || !PyTuple_Check(headers)) {
            PyErr_Format(PyExc_TypeError, "record %zd: key/value must be bytes or None, headers a tuple", i);
            goto fail;
        }
        long long offset, ts;
        if (as_i64(PyTuple_GET_ITEM(rec, 0), &offset) < 0 || as_i64(PyTuple_GET_ITEM(rec, 1), &ts) < 0)
            goto fail;
        if (o.cap - o.len < PyBytes_GET_SIZE(sep) + PyBytes_GET_SIZE(head) + 64
            && grow(&o, PyBytes_GET_SIZE(sep) + PyBytes_GET_SIZE(head) + 64) < 0)
            goto fail;
        if (i)
            put(&o, PyBytes_AS_STRING(sep), PyBytes_GET_SIZE(sep));
        put(&o, PyBytes_AS_STRING(head), PyBytes_GET_SIZE(head));
        put_i64(&o, offset);
        PUTLIT(&o, ",\"timestamp\":");
        put_i64(&o, ts);
        PUTLIT(&o, ",");
        if (render_field(&fc, &o, key, "key", 3, key_name) < 0)
            goto fail;
        if (o.cap - o.len < 1 && grow(&o, 1) < 0)
            goto fail;
        put(&o, ",", 1);
        if (render_field(&fc, &o, value, "value", 5, value_name) < 0)
            goto fail;
        if (key != Py_None)
            payload += PyBytes_GET_SIZE(key);
        if (value != Py_None)
            payload += PyBytes_GET_SIZE(value);
        if (o.cap - o.len < 16 && grow(&o, 16) < 0)
            goto fail;
        PUTLIT(&o, ",\"headers\":[");
        for (Py_ssize_t h = 0; h < PyTuple_GET_SIZE(headers); h++) {
            PyObject *pair = PyTuple_GET_ITEM(headers, h);
            if (!PyTuple_Check(pair) || PyTuple_GET_SIZE(pair) != 2 || !PyUnicode_Check(PyTuple_GET_ITEM(pair, 0))
                || (PyTuple_GET_ITEM(pair, 1) != Py_None && !PyBytes_Check(PyTuple_GET_ITEM(pair, 1)))) {
                PyErr_Format(PyExc_TypeError, "record %zd: headers must be (str, bytes | None) pairs", i);
                goto fail;
            }
            Py_ssize_t klen;
            const char *k = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(pair, 0), &klen);
            if (k == NULL)
                goto fail;
            if (o.cap - o.len < 24 && grow(&o, 24) < 0)
                goto fail;
            if (h)
                put(&o, ",", 1);
            PUTLIT(&o, "{\"key\":");
            int rc = put_utf8_string(&o, (const unsigned char *)k, klen);
            if (rc == ERR)
                goto fail;
            if (rc == BAIL) { /* cannot happen: a str's UTF-8 is valid */
                PyErr_SetString(PyExc_ValueError, "header key is not valid UTF-8");
                goto fail;
            }
            if (o.cap - o.len < 16 && grow(&o, 16) < 0)
                goto fail;
            PUTLIT(&o, ",\"value\":");
            if (put_b64_or_null(&o, PyTuple_GET_ITEM(pair, 1)) < 0)
                goto fail;
            if (o.cap - o.len < 1 && grow(&o, 1) < 0)
                goto fail;
            put(&o, "}", 1);
        }
        if (o.cap - o.len < 2 && grow(&o, 2) < 0)
            goto fail;
        PUTLIT(&o, "]}");
    }
    PyObject *out = PyBytes_FromStringAndSize(o.buf ? o.buf : "", o.len);
    release_buf(&o, shared);
    if (out == NULL)
        return NULL;
    return Py_BuildValue("(Nn)", out, payload);
fail:
    release_buf(&o, shared);
    return NULL;
}

static PyMethodDef methods[] = {
    {"compile", (PyCFunction)py_compile, METH_O,
     "compile(nodes) -> Program\n\nA flat node list (see avro_fast.py) compiled for rendering."},
    {"render_value", (PyCFunction)(void (*)(void))py_render_value, METH_FASTCALL,
     "render_value(program, payload[, limits]) -> bytes | None | int\n\nOne unframed Avro payload as JSON; "
     "None when it does not decode here (the Python path decides); an int: refused (the code, see scan)."},
    {"scan", (PyCFunction)(void (*)(void))py_scan, METH_FASTCALL,
     "scan(program, payload[, limits]) -> int\n\n0 when the unframed payload is within the limits (depth, items, "
     "fixed JSON bytes), else the refusal code (1 depth, 2 items, 3 bytes, 4 not Avro of the schema)."},
    {"scan_many", (PyCFunction)(void (*)(void))py_scan_many, METH_FASTCALL,
     "scan_many(program, payloads[, limits]) -> dict[int, int]\n\nscan() of every payload of a list: the index "
     "and refusal code of each refused one (empty: all within the limits)."},
    {"schema_ids", (PyCFunction)py_schema_ids, METH_O,
     "schema_ids(records) -> set[int]\n\nThe schema ids of the framed keys and values of record tuples."},
    {"render_chunk", (PyCFunction)(void (*)(void))py_render_chunk, METH_FASTCALL,
     "render_chunk(records, head, sep, programs, fallback[, refuse[, limits]]) -> (bytes, payload)\n\nThe "
     "gateway's JSON objects of records with avro keys and values rendered by programs (schema id -> Program); "
     "a value over the limits is refuse(b'key' | b'value', raw, code) -> the field's bytes (its per-record "
     "error); every other key or value is fallback(b'key' | b'value', raw) -> the field's bytes."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef moduledef = {
    PyModuleDef_HEAD_INIT, "_cavro", "C renderer of Avro payloads to JSON (service.schemas.avro_fast).", 0,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC
PyInit__cavro(void)
{
    kcg_b64_init();
    if (PyType_Ready(&ProgramType) < 0)
        return NULL;
    PyObject *m = PyModule_Create(&moduledef);
    if (m == NULL)
        return NULL;
    if (PyModule_AddIntConstant(m, "VERSION", 1) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
