/* Compiled kernels of the KVSP codec q8 (kvcs/kv/codecs.py holds the contract).
 *
 * Bit-exact to the numpy reference in codecs.py (_q8_encode_reference and
 * _q8_decode_reference): every step is IEEE float32 arithmetic in round-to-nearest-even
 * (no fast-math, no reciprocal), so the same operations give the same bits.
 *
 *   encode row:  amax = max|x| (as float32), scale = amax / 127, stored as float16 (RNE);
 *                q = clamp(rint(x / scale), -127, 127), or 0 when scale == 0.
 *   decode row:  x = (float)q * (float)scale16, clamped to the output type's largest finite
 *                value (float16, bfloat16), rounded to the output type (RNE).
 *
 * Element kinds: 0 float32, 1 float16, 2 bfloat16 (little-endian, C-contiguous, aligned
 * to the element size: the caller copies or falls back otherwise).
 * With GCC on x86-64 Linux each block function is compiled three times (x86-64-v4, v3 and
 * baseline) and the loader picks the best the CPU supports; the bit tricks below need no
 * particular instruction set, and float16 output uses F16C where the CPU has it. Elsewhere
 * the same code is compiled once for the compiler's default target.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

enum { KIND_F32 = 0, KIND_F16 = 1, KIND_BF16 = 2 };
enum { ENC_OK = 0, ENC_NONFINITE = 1, ENC_SCALE_OVERFLOW = 2 };

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__linux__)
#define KERNEL __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#define HAVE_F16C_PATH 1
#include <immintrin.h>
#else
#define KERNEL
#define HAVE_F16C_PATH 0
#endif

static inline float f32_from_bits(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

/* float16 -> float32 for finite values: place the exponent and significand in a float32
 * and rescale by 2^112 (exact; float16 subnormals become float32 normals). */
static inline float f16_finite_to_f32(uint16_t h) {
    float mag = f32_from_bits((uint32_t)(h & 0x7fff) << 13) * 0x1p112f;
    return f32_from_bits(f32_bits(mag) | ((uint32_t)(h & 0x8000) << 16));
}

/* float16 -> float32 for any value; inf and NaN keep their payload (as numpy does). */
static inline float f16_to_f32(uint16_t h) {
    if ((h & 0x7c00) == 0x7c00)
        return f32_from_bits(((uint32_t)(h & 0x8000) << 16) | 0x7f800000u
                             | ((uint32_t)(h & 0x03ff) << 13));
    return f16_finite_to_f32(h);
}

/* float32 -> float16, round to nearest even; overflow gives inf, NaN keeps its payload's
 * top bits and stays NaN (numpy's rules). The rounding is done by two float additions
 * that leave exactly the float16 precision at the value's exponent (subnormals included). */
static inline uint16_t f32_to_f16(float f) {
    uint32_t w = f32_bits(f);
    uint32_t shl1 = w + w;
    uint32_t sign = (w & 0x80000000u) >> 16;
    float base = (f32_from_bits(w & 0x7fffffffu) * 0x1p112f) * 0x1p-110f;
    uint32_t bias = shl1 & 0xff000000u;
    bias = bias < 0x71000000u ? 0x71000000u : bias;
    base = f32_from_bits((bias >> 1) + 0x07800000u) + base;
    uint32_t bits = f32_bits(base);
    uint32_t nonsign = ((bits >> 13) & 0x7c00u) + (bits & 0x0fffu);
    if (shl1 > 0xff000000u) { /* NaN */
        uint32_t nan = 0x7c00u | ((w & 0x007fffffu) >> 13);
        nonsign = nan == 0x7c00u ? 0x7c01u : nan;
    }
    return (uint16_t)(sign | nonsign);
}

/* float32 -> bfloat16, round to nearest even, saturating: inf becomes bfloat16's largest
 * finite value of its sign (the reference clamps to it first) and NaN the quiet NaN of its
 * sign (ml_dtypes' rule). Integer operations only, so that GCC vectorises it for AVX2 too. */
static inline uint16_t f32_to_bf16_saturating(float f) {
    uint32_t w = f32_bits(f);
    uint32_t sign = w & 0x80000000u, mag = w & 0x7fffffffu;
    mag = mag == 0x7f800000u ? 0x7f7f0000u : mag;
    uint32_t rounded = (mag + 0x7fffu + ((mag >> 16) & 1u)) >> 16;
    return (uint16_t)((sign >> 16) | (mag > 0x7f800000u ? 0x7fc0u : rounded));
}

/* clamp(rint(v), -127, 127) as an int8. Adding 1.5 * 2^23 rounds v to an integer (ties to
 * even) held in the low bits of the sum, for |v| < 2^22; here |v| <= 191 (x / scale with
 * |x| <= max|x|, the bound reached when the scale is a rounded float32 subnormal). The
 * clamp is done on the integer: GCC does not vectorise the float compares for AVX2
 * (x86-64-v3 build, float16 encode: 1.0 GiB/s with float compares, 5.2 with integer). */
static inline int8_t quantize(float v) {
    int32_t i = (int32_t)(f32_bits(v + 0x1.8p23f) - 0x4b400000u);
    i = i < -127 ? -127 : i;
    i = i > 127 ? 127 : i;
    return (int8_t)i;
}

/* One row per (token, head): find the row maximum from the magnitude bits (integer max,
 * which also spots inf/NaN), then quantise. Returns the ENC_* status of the block; when
 * it is not ENC_OK the output is incomplete and must be discarded. */
KERNEL static int encode_block(const void *restrict src, int kind, Py_ssize_t rows,
                               Py_ssize_t dim, uint16_t *restrict scales, int8_t *restrict q) {
    int nonfinite = 0, overflow = 0;
    for (Py_ssize_t r = 0; r < rows; r++) {
        int8_t *qr = q + r * dim;
        float amax;
        if (kind == KIND_F32) {
            const uint32_t *x = (const uint32_t *)src + r * dim;
            uint32_t m = 0;
            for (Py_ssize_t j = 0; j < dim; j++) {
                uint32_t a = x[j] & 0x7fffffffu;
                m = a > m ? a : m;
            }
            if (m >= 0x7f800000u) { nonfinite = 1; continue; }
            amax = f32_from_bits(m);
        } else {
            const uint16_t *x = (const uint16_t *)src + r * dim;
            uint16_t m = 0;
            for (Py_ssize_t j = 0; j < dim; j++) {
                uint16_t a = x[j] & 0x7fffu;
                m = a > m ? a : m;
            }
            if (m >= (kind == KIND_F16 ? 0x7c00u : 0x7f80u)) { nonfinite = 1; continue; }
            amax = kind == KIND_F16 ? f16_finite_to_f32(m) : f32_from_bits((uint32_t)m << 16);
        }
        float scale = amax / 127.0f;
        uint16_t s16 = f32_to_f16(scale);
        if (s16 == 0x7c00u) { overflow = 1; continue; }
        scales[r] = s16;
        if (scale == 0.0f) { memset(qr, 0, (size_t)dim); continue; }
        if (kind == KIND_F32) {
            const float *x = (const float *)src + r * dim;
            for (Py_ssize_t j = 0; j < dim; j++) qr[j] = quantize(x[j] / scale);
        } else if (kind == KIND_F16) {
            const uint16_t *x = (const uint16_t *)src + r * dim;
            for (Py_ssize_t j = 0; j < dim; j++) qr[j] = quantize(f16_finite_to_f32(x[j]) / scale);
        } else {
            const uint16_t *x = (const uint16_t *)src + r * dim;
            for (Py_ssize_t j = 0; j < dim; j++)
                qr[j] = quantize(f32_from_bits((uint32_t)x[j] << 16) / scale);
        }
    }
    return nonfinite ? ENC_NONFINITE : overflow ? ENC_SCALE_OVERFLOW : ENC_OK;
}

#if HAVE_F16C_PATH
/* float16 output with the F16C conversion instruction, 8 values at a time: the bit trick
 * in f32_to_f16 made the decode the slowest step (float16 layer of 128 blocks: 3.4 GiB/s,
 * 16 GiB/s with F16C). Same rounding (to nearest even); a NaN here is always quiet (it
 * comes out of a multiplication) and F16C keeps its top payload bits, as numpy does.
 * max/min with the value second keep a NaN, as the C comparisons do. */
__attribute__((target("avx2,f16c")))
static Py_ssize_t decode_row_f16c(const int8_t *q, float s, uint16_t *o, Py_ssize_t dim) {
    const __m256 vs = _mm256_set1_ps(s);
    const __m256 lo = _mm256_set1_ps(-65504.0f), hi = _mm256_set1_ps(65504.0f);
    Py_ssize_t j = 0;
    for (; j + 8 <= dim; j += 8) {
        __m128i q8;
        memcpy(&q8, q + j, 8);
        __m256 v = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q8)), vs);
        v = _mm256_min_ps(hi, _mm256_max_ps(lo, v));
        _mm_storeu_si128((__m128i *)(o + j), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
    }
    return j;
}

static int have_f16c;
/* bfloat16 output with AVX2, 16 values at a time, for a row whose scale is finite: every
 * product (float)q * s is then finite and at most 127 * 65504 in magnitude, so the rounding
 * to nearest even of f32_to_bf16_saturating is one integer addition on the float's bits
 * (the sign rides along: no carry reaches it) and its saturation and NaN cases cannot
 * occur. GCC's vectorisation of the scalar loop below ran at 0.7 ns a value (a bfloat16
 * block of 16 x 8 x 128 values: 12.1 us, 3.6x float32's), this at 0.2 (3.4 us). */
__attribute__((target("avx2")))
static Py_ssize_t decode_row_bf16_avx2(const int8_t *q, float s, uint16_t *o, Py_ssize_t dim) {
    const __m256 vs = _mm256_set1_ps(s);
    const __m256i half = _mm256_set1_epi32(0x7fff), one = _mm256_set1_epi32(1);
    Py_ssize_t j = 0;
    for (; j + 16 <= dim; j += 16) {
        __m256i r[2];
        for (int h = 0; h < 2; h++) {
            __m256i w = _mm256_castps_si256(_mm256_mul_ps(_mm256_cvtepi32_ps(
                _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(q + j + 8 * h)))), vs));
            __m256i odd = _mm256_and_si256(_mm256_srli_epi32(w, 16), one);
            r[h] = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(w, half), odd), 16);
        }
        /* packus packs within each 128-bit lane: put the four 64-bit quarters in order */
        __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r[0], r[1]), 0xd8);
        _mm256_storeu_si256((__m256i *)(o + j), packed);
    }
    return j;
}

static int have_avx2;
#endif

/* The caller has checked that q holds no -128. The section may sit at any address (e.g. a
 * slice of a received payload), so the scales are read with memcpy. */
KERNEL static void decode_block(const char *restrict scales, const int8_t *restrict q,
                                int kind, Py_ssize_t rows, Py_ssize_t dim, void *restrict out) {
    for (Py_ssize_t r = 0; r < rows; r++) {
        const int8_t *qr = q + r * dim;
        uint16_t s16;
        memcpy(&s16, scales + 2 * r, 2);
        float s = f16_to_f32(s16);
        if (kind == KIND_F32) {
            float *o = (float *)out + r * dim;
            for (Py_ssize_t j = 0; j < dim; j++) o[j] = (float)qr[j] * s;
        } else if (kind == KIND_F16) {
            uint16_t *o = (uint16_t *)out + r * dim;
            Py_ssize_t j = 0;
#if HAVE_F16C_PATH
            if (have_f16c) j = decode_row_f16c(qr, s, o, dim);
#endif
            for (; j < dim; j++) {
                float v = (float)qr[j] * s;
                v = v < -65504.0f ? -65504.0f : v;
                v = v > 65504.0f ? 65504.0f : v;
                o[j] = f32_to_f16(v);
            }
        } else {
            /* |q * s| <= 127 * 65504 for a finite s: only +-inf reach the clamp */
            uint16_t *o = (uint16_t *)out + r * dim;
            Py_ssize_t j = 0;
#if HAVE_F16C_PATH
            if (have_avx2 && (s16 & 0x7c00u) != 0x7c00u) j = decode_row_bf16_avx2(qr, s, o, dim);
#endif
            for (; j < dim; j++) o[j] = f32_to_bf16_saturating((float)qr[j] * s);
        }
    }
}

static int check_kind(int kind, Py_ssize_t rows, Py_ssize_t dim) {
    if (kind < KIND_F32 || kind > KIND_BF16 || rows < 1 || dim < 1) {
        PyErr_SetString(PyExc_ValueError, "q8 kernel: bad kind or shape");
        return -1;
    }
    return 0;
}

PyDoc_STRVAR(encode_doc,
"encode(src, kind, blocks, rows, dim) -> list[bytes] | int\n\n"
"Encode `blocks` consecutive q8 sections from the C-contiguous buffer `src` (blocks*rows\n"
"rows of dim elements of `kind`: 0 float32, 1 float16, 2 bfloat16). Returns one bytes\n"
"object per block, or on the first block that cannot be encoded its status:\n"
"1 non-finite value, 2 scale beyond the float16 range.");

static PyObject *q8_encode(PyObject *self, PyObject *args) {
    Py_buffer src;
    int kind;
    Py_ssize_t blocks, rows, dim;
    (void)self;
    if (!PyArg_ParseTuple(args, "y*innn:encode", &src, &kind, &blocks, &rows, &dim))
        return NULL;
    PyObject *result = NULL, *list = NULL;
    if (check_kind(kind, rows, dim) < 0 || blocks < 0) {
        if (!PyErr_Occurred()) PyErr_SetString(PyExc_ValueError, "q8 kernel: bad block count");
        goto done;
    }
    Py_ssize_t itemsize = kind == KIND_F32 ? 4 : 2;
    if (src.len != blocks * rows * dim * itemsize) {
        PyErr_SetString(PyExc_ValueError, "q8 kernel: source size does not match the shape");
        goto done;
    }
    Py_ssize_t section = rows * 2 + rows * dim;
    list = PyList_New(blocks);
    if (list == NULL) goto done;
    for (Py_ssize_t b = 0; b < blocks; b++) {
        PyObject *data = PyBytes_FromStringAndSize(NULL, section);
        if (data == NULL) goto done;
        PyList_SET_ITEM(list, b, data);
    }
    int status = ENC_OK;
    Py_ssize_t block_bytes = rows * dim * itemsize;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < blocks && status == ENC_OK; b++) {
        char *data = PyBytes_AS_STRING(PyList_GET_ITEM(list, b));
        status = encode_block((const char *)src.buf + b * block_bytes, kind, rows, dim,
                              (uint16_t *)data, (int8_t *)(data + rows * 2));
    }
    Py_END_ALLOW_THREADS
    if (status != ENC_OK) {
        result = PyLong_FromLong(status);
    } else {
        result = list;
        list = NULL;
    }
done:
    Py_XDECREF(list);
    PyBuffer_Release(&src);
    return result;
}

PyDoc_STRVAR(decode_doc,
"decode(sections, kind, rows, dim, out) -> int\n\n"
"Decode the q8 sections (a sequence of bytes-like objects, each rows*2 + rows*dim octets)\n"
"into the writable C-contiguous buffer `out` (len(sections)*rows*dim elements of `kind`),\n"
"one after the other. Returns -1 on success, or the index of the first section that has\n"
"the wrong length or holds the invalid value -128 (the sections before it are decoded).");

static PyObject *q8_decode(PyObject *self, PyObject *args) {
    PyObject *seq_obj;
    int kind;
    Py_ssize_t rows, dim;
    Py_buffer out;
    (void)self;
    if (!PyArg_ParseTuple(args, "Oinnw*:decode", &seq_obj, &kind, &rows, &dim, &out))
        return NULL;
    PyObject *result = NULL, *seq = NULL;
    Py_buffer *views = NULL;
    Py_ssize_t n = 0, held = 0;
    if (check_kind(kind, rows, dim) < 0) goto done;
    seq = PySequence_Fast(seq_obj, "q8 kernel: sections must be a sequence");
    if (seq == NULL) goto done;
    n = PySequence_Fast_GET_SIZE(seq);
    Py_ssize_t itemsize = kind == KIND_F32 ? 4 : 2;
    Py_ssize_t out_block = rows * dim * itemsize;
    if (out.len != n * out_block) {
        PyErr_SetString(PyExc_ValueError, "q8 kernel: output size does not match the shape");
        goto done;
    }
    views = PyMem_Calloc(n > 0 ? (size_t)n : 1, sizeof(Py_buffer));
    if (views == NULL) { PyErr_NoMemory(); goto done; }
    Py_ssize_t section = rows * 2 + rows * dim;
    for (; held < n; held++) {
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, held), &views[held],
                               PyBUF_SIMPLE) < 0)
            goto done;
    }
    Py_ssize_t bad = -1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < n; b++) {
        const char *data = views[b].buf;
        /* -128 (0x80) is invalid: memchr finds it at memory speed before the block is
         * written */
        if (views[b].len != section
            || memchr(data + rows * 2, 0x80, (size_t)(rows * dim)) != NULL) {
            bad = b;
            break;
        }
        decode_block(data, (const int8_t *)(data + rows * 2), kind, rows, dim,
                     (char *)out.buf + b * out_block);
    }
    Py_END_ALLOW_THREADS
    result = PyLong_FromSsize_t(bad);
done:
    for (Py_ssize_t i = 0; i < held; i++) PyBuffer_Release(&views[i]);
    PyMem_Free(views);
    Py_XDECREF(seq);
    PyBuffer_Release(&out);
    return result;
}

static PyMethodDef methods[] = {
    {"encode", q8_encode, METH_VARARGS, encode_doc},
    {"decode", q8_decode, METH_VARARGS, decode_doc},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "kvcs.kv._q8",
    "Compiled q8 kernels (optional; kvcs.kv.codecs falls back to numpy without them).",
    -1, methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__q8(void) {
#if HAVE_F16C_PATH
    __builtin_cpu_init();
    have_f16c = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    have_avx2 = __builtin_cpu_supports("avx2");
#endif
    return PyModule_Create(&module);
}
