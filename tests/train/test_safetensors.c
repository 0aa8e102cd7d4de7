/*
 * The safetensors reader and writer.
 *
 *   test_safetensors unit
 *       round trips, and every malformed file refused with its message
 *   test_safetensors read-torch FILE EXPECTED
 *       reads a file PyTorch wrote (test_safetensors_torch.py) and compares
 *       every tensor, bit for bit, with the fp32 values torch gave it
 *   test_safetensors write OUT
 *       writes the file test_safetensors_torch.py checks with torch
 */
#include <dirent.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h" /* tests/check.h */
#include "core/half.h"
#include "train/weights/safetensors.h"

static char dir[256];

static const char *path_in(const char *name)
{
    static char buf[512];
    snprintf(buf, sizeof buf, "%s/%s", dir, name);
    return buf;
}

/* A file of 8-byte length, header text and data_len bytes of data. */
static const char *raw_file(const char *name, uint64_t hlen, const char *header,
                            size_t data_len)
{
    const char *p = path_in(name);
    FILE *f = fopen(p, "wb");
    fwrite(&hlen, 8, 1, f);
    fwrite(header, 1, strlen(header), f);
    for (size_t i = 0; i < data_len; i++) fputc((int)(i & 0xff), f);
    fclose(f);
    return p;
}

static const char *hdr_file(const char *name, const char *header, size_t data_len)
{
    return raw_file(name, strlen(header), header, data_len);
}

static int open_err(const char *path, char *err, size_t errlen)
{
    dt_st_file f;
    int rc = dt_st_open(path, &f, err, errlen);
    if (rc == 0) dt_st_close(&f);
    return rc;
}

static void test_malformed(void)
{
    char err[1024];
    const char *p;

    p = path_in("empty");
    fclose(fopen(p, "wb"));
    CHECK_ERR(open_err(p, err, sizeof err), err, p, "0 bytes, shorter than the 8-byte header");
    p = path_in("five");
    FILE *f = fopen(p, "wb");
    fputs("abcde", f);
    fclose(f);
    CHECK_ERR(open_err(p, err, sizeof err), err, "five", "5 bytes");
    CHECK_ERR(open_err(path_in("missing"), err, sizeof err), err, "missing", "cannot open");

    p = raw_file("beyond", 1000, "{}", 0);
    CHECK_ERR(open_err(p, err, sizeof err), err, "beyond", "header length 1000 goes beyond",
              "(10 bytes)");
    p = raw_file("huge", UINT64_MAX, "{}", 0);
    CHECK_ERR(open_err(p, err, sizeof err), err, "huge", "goes beyond");

    p = hdr_file("badjson", "{\"a\": {\"dtype\": \"F32\",, }}", 0);
    CHECK_ERR(open_err(p, err, sizeof err), err, "badjson", "not valid JSON");
    p = hdr_file("array", "[1, 2]", 0);
    CHECK_ERR(open_err(p, err, sizeof err), err, "array", "not a JSON object");
    p = hdr_file("zero", "", 0);
    CHECK_ERR(open_err(p, err, sizeof err), err, "zero", "not a JSON object");
    p = hdr_file("trailing", "{} x", 0);
    CHECK_ERR(open_err(p, err, sizeof err), err, "trailing", "data after its JSON object");
    p = hdr_file("cut", "{\"a\": {\"dtype\": \"F32\"", 0);
    CHECK_ERR(open_err(p, err, sizeof err), err, "cut", "not valid JSON");

    p = hdr_file("range",
                 "{\"w\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]}}", 12);
    CHECK_ERR(open_err(p, err, sizeof err), err, "range", "tensor 'w'",
              "data_offsets [0, 16] out of range", "holds 12 bytes");
    p = hdr_file("reversed",
                 "{\"w\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [8, 4]}}", 12);
    CHECK_ERR(open_err(p, err, sizeof err), err, "reversed", "out of range");
    p = hdr_file("length",
                 "{\"w\": {\"dtype\": \"BF16\", \"shape\": [2, 3], \"data_offsets\": [0, 24]}}",
                 24);
    CHECK_ERR(open_err(p, err, sizeof err), err, "length", "tensor 'w'", "hold 24 bytes",
              "dtype BF16 and shape [2, 3] need 12");
    p = hdr_file("overlap",
                 "{\"a\": {\"dtype\": \"F32\", \"shape\": [4], \"data_offsets\": [0, 16]},"
                 " \"b\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [12, 20]}}",
                 20);
    CHECK_ERR(open_err(p, err, sizeof err), err, "overlap", "tensors 'a' and 'b' overlap");
    /* The tensors tile the data section exactly: no byte belongs to none. */
    p = hdr_file("gap",
                 "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                 " \"b\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
                 12);
    CHECK_ERR(open_err(p, err, sizeof err), err, "gap", "4 bytes between tensors 'a' and 'b'");
    p = hdr_file("lead", "{\"a\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [3, 5]}}",
                 5);
    CHECK_ERR(open_err(p, err, sizeof err), err, "lead", "3 bytes before tensor 'a'");
    p = hdr_file("tail", "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}",
                 20);
    CHECK_ERR(open_err(p, err, sizeof err), err, "tail", "16 bytes after the last tensor");
    p = hdr_file("none", "{}", 5);
    CHECK_ERR(open_err(p, err, sizeof err), err, "none", "5 bytes of data, but no tensor");
    p = hdr_file("inside",
                 "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
                 " \"z\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [4, 4]}}",
                 8);
    CHECK_ERR(open_err(p, err, sizeof err), err, "inside", "tensors 'a' and 'z' overlap");
    p = hdr_file("dup",
                 "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
                 " \"a\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
                 8);
    CHECK_ERR(open_err(p, err, sizeof err), err, "dup", "tensor 'a' appears twice");
    p = hdr_file("dtype", "{\"a\": {\"dtype\": \"Q3\", \"shape\": [1], \"data_offsets\": [0, 1]}}",
                 1);
    CHECK_ERR(open_err(p, err, sizeof err), err, "dtype", "unknown dtype 'Q3'");
    p = hdr_file("nodtype", "{\"a\": {\"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    CHECK_ERR(open_err(p, err, sizeof err), err, "nodtype", "\"dtype\" is missing");
    p = hdr_file("dims",
                 "{\"a\": {\"dtype\": \"U8\", \"shape\": [1,1,1,1,1,1,1,1,1], "
                 "\"data_offsets\": [0, 1]}}",
                 1);
    CHECK_ERR(open_err(p, err, sizeof err), err, "dims", "9 dimensions, at most 8");
    p = hdr_file("negdim",
                 "{\"a\": {\"dtype\": \"U8\", \"shape\": [-1], \"data_offsets\": [0, 1]}}", 1);
    CHECK_ERR(open_err(p, err, sizeof err), err, "negdim", "shape entry 0");
    p = hdr_file("fracdim",
                 "{\"a\": {\"dtype\": \"U8\", \"shape\": [1.5], \"data_offsets\": [0, 1]}}", 1);
    CHECK_ERR(open_err(p, err, sizeof err), err, "fracdim", "shape entry 0");
    p = hdr_file("offs", "{\"a\": {\"dtype\": \"U8\", \"shape\": [1], \"data_offsets\": [0]}}", 1);
    CHECK_ERR(open_err(p, err, sizeof err), err, "offs", "\"data_offsets\" must be two");
    p = hdr_file("notobj", "{\"a\": 3}", 0);
    CHECK_ERR(open_err(p, err, sizeof err), err, "notobj", "tensor 'a': entry is not");
    p = hdr_file("badmeta", "{\"__metadata__\": [1]}", 0);
    CHECK_ERR(open_err(p, err, sizeof err), err, "badmeta", "__metadata__ is not an object");
}

/* Things the format allows that a strict reader might refuse. */
static void test_lenient(void)
{
    char err[1024];
    dt_st_file f;
    const char *p = hdr_file(
        "lenient",
        "{\"__metadata__\": {\"format\": \"pt\", \"n\": 3, \"step\": \"7\"},"
        " \"late\": {\"dtype\": \"U8\", \"shape\": [2], \"data_offsets\": [6, 8]},"
        " \"s\": {\"dtype\": \"F32\", \"shape\": [], \"data_offsets\": [0, 4]},"
        " \"none\": {\"dtype\": \"F32\", \"shape\": [0, 3], \"data_offsets\": [4, 4]},"
        " \"i\": {\"dtype\": \"I16\", \"shape\": [1], \"data_offsets\": [4, 6]}}   \n",
        8);
    CHECK(dt_st_open(p, &f, err, sizeof err) == 0, "lenient file: %s", err);
    if (failures) return;
    CHECK(f.ntensors == 4, "%d tensors", f.ntensors);
    /* data order, whatever the JSON order */
    CHECK(strcmp(f.tensors[0].name, "s") == 0 && strcmp(f.tensors[3].name, "late") == 0,
          "order %s .. %s", f.tensors[0].name, f.tensors[3].name);
    const dt_st_tensor *s = dt_st_find(&f, "s");
    CHECK(s && s->ndim == 0 && s->numel == 1 && s->nbytes == 4, "scalar");
    const dt_st_tensor *none = dt_st_find(&f, "none");
    CHECK(none && none->numel == 0 && none->ndim == 2 && none->shape[1] == 3, "empty tensor");
    CHECK(dt_st_find(&f, "absent") == NULL, "absent tensor found");
    CHECK(dt_st_meta_get(&f, "step") && strcmp(dt_st_meta_get(&f, "step"), "7") == 0, "meta");
    CHECK(dt_st_meta_get(&f, "n") == NULL, "a non-string metadata value is skipped");
    const dt_st_tensor *late = dt_st_find(&f, "late");
    CHECK(late && ((const unsigned char *)late->data)[0] == 6, "data of 'late'");
    float x[2];
    const dt_st_tensor *i = dt_st_find(&f, "i");
    CHECK_ERR(dt_st_read_f32(&f, i, x, err, sizeof err), err, "lenient", "tensor 'i'",
              "dtype I16", "only F32, F16 and BF16");
    dt_st_close(&f);
}

static void fill(float *x, int n, float scale)
{
    for (int i = 0; i < n; i++) x[i] = (float)(i - n / 2) * scale;
}

static int count_files(void)
{
    int n = 0;
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
}

static void test_round_trip(void)
{
    char err[1024];
    float a[12], b[30], s = 3.25f;
    fill(a, 12, 0.25f);
    fill(b, 30, -1.5f);
    uint16_t h[3] = {dt_f32_to_f16(1.5f), dt_f32_to_f16(-65504.f), dt_f32_to_f16(6e-8f)};
    uint16_t bf[2] = {dt_f32_to_bf16(3.140625f), dt_f32_to_bf16(-1e30f)};
    dt_st_entry e[] = {
        {.name = "a", .data = a, .ndim = 2, .shape = {3, 4}},
        {.name = "b", .data = b, .ndim = 3, .shape = {2, 3, 5}},
        {.name = "s", .data = &s, .ndim = 0},
        {.name = "z", .data = NULL, .ndim = 2, .shape = {0, 7}},
        {.name = "h", .data = h, .ndim = 1, .shape = {3}, .dtype = DT_ST_F16},
        {.name = "q\"\\\n", .data = bf, .ndim = 1, .shape = {2}, .dtype = DT_ST_BF16},
    };
    int before = count_files();
    const char *p = path_in("rt.safetensors");
    CHECK(dt_st_write_f32(p, e, 6, err, sizeof err) == 0, "write: %s", err);
    CHECK(count_files() == before + 1, "temporary file left behind");
    dt_st_file f;
    CHECK(dt_st_open(p, &f, err, sizeof err) == 0, "reopen: %s", err);
    if (failures) return;
    CHECK(f.ntensors == 6, "%d tensors", f.ntensors);
    CHECK(dt_st_meta_get(&f, "format") && !strcmp(dt_st_meta_get(&f, "format"), "pt"), "format");
    for (int k = 0; k < 6; k++) {
        const dt_st_tensor *t = dt_st_find(&f, e[k].name);
        CHECK(t && t->dtype == e[k].dtype && t->ndim == e[k].ndim, "tensor %d", k);
        if (!t) continue;
        CHECK((uintptr_t)t->data % dt_st_dtype_size(t->dtype) == 0, "tensor %s misaligned",
              t->name);
        for (int d = 0; d < t->ndim; d++) CHECK(t->shape[d] == e[k].shape[d], "shape %d", k);
        float got[30];
        CHECK(dt_st_read_f32(&f, t, got, err, sizeof err) == 0, "read %d: %s", k, err);
        for (uint64_t i = 0; i < t->numel; i++) {
            float want = e[k].dtype == DT_ST_F16    ? dt_f16_to_f32(h[i])
                         : e[k].dtype == DT_ST_BF16 ? dt_bf16_to_f32(bf[i])
                                                    : ((const float *)e[k].data)[i];
            CHECK(got[i] == want, "tensor %d [%d]: %g != %g", k, (int)i, got[i], want);
        }
    }
    dt_st_close(&f);

    dt_st_meta meta[] = {{"step", "12"}, {"format", "dtrain"}};
    CHECK(dt_st_write(p, e, 1, meta, 2, err, sizeof err) == 0, "overwrite: %s", err);
    CHECK(dt_st_open(p, &f, err, sizeof err) == 0, "reopen: %s", err);
    CHECK(f.ntensors == 1 && !strcmp(dt_st_meta_get(&f, "step"), "12") &&
              !strcmp(dt_st_meta_get(&f, "format"), "dtrain"),
          "metadata");
    dt_st_close(&f);
}

static void test_write_errors(void)
{
    char err[1024];
    float a[2] = {1, 2};
    dt_st_entry dup[] = {{.name = "x", .data = a, .ndim = 1, .shape = {1}},
                         {.name = "x", .data = a + 1, .ndim = 1, .shape = {1}}};
    int before = count_files();
    CHECK_ERR(dt_st_write_f32(path_in("w1"), dup, 2, err, sizeof err), err, "w1",
              "tensor 'x' given twice");
    dt_st_entry bad[] = {{.name = "y", .data = a, .ndim = 9}};
    CHECK_ERR(dt_st_write_f32(path_in("w2"), bad, 1, err, sizeof err), err, "9 dimensions");
    dt_st_entry meta[] = {{.name = "__metadata__", .data = a, .ndim = 1, .shape = {1}}};
    CHECK_ERR(dt_st_write_f32(path_in("w3"), meta, 1, err, sizeof err), err, "__metadata__");
    dt_st_entry nodata[] = {{.name = "n", .data = NULL, .ndim = 1, .shape = {2}}};
    CHECK_ERR(dt_st_write_f32(path_in("w4"), nodata, 1, err, sizeof err), err, "no data");
    CHECK(count_files() == before, "a failed write left a file");
    dt_st_entry ok[] = {{.name = "x", .data = a, .ndim = 1, .shape = {2}}};
    CHECK_ERR(dt_st_write_f32(path_in("nodir/x.safetensors"), ok, 1, err, sizeof err), err,
              "nodir/x.safetensors.tmp.", "cannot create");
}

/* ---- PyTorch interop ------------------------------------------------- */

/* EXPECTED: per tensor, a line "name dtype ndim d0 d1 ..." then a line of
 * the fp32 bit patterns torch produced, in hex. */
static int read_torch(const char *file, const char *expected)
{
    char err[1024];
    dt_st_file f;
    if (dt_st_open(file, &f, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    FILE *ex = fopen(expected, "r");
    char name[256], dtype[32];
    int ndim, seen = 0;
    while (ex && fscanf(ex, "%255s %31s %d", name, dtype, &ndim) == 3) {
        const dt_st_tensor *t = dt_st_find(&f, name);
        CHECK(t, "tensor %s not found", name);
        if (!t) break;
        CHECK(!strcmp(dt_st_dtype_name(t->dtype), dtype), "%s: dtype %s", name, dtype);
        CHECK(t->ndim == ndim, "%s: ndim %d != %d", name, t->ndim, ndim);
        for (int d = 0; d < ndim; d++) {
            long long v = -1;
            CHECK(fscanf(ex, "%lld", &v) == 1 && v == t->shape[d], "%s: dim %d", name, d);
        }
        float *got = malloc(t->numel * sizeof *got + 4);
        CHECK(dt_st_read_f32(&f, t, got, err, sizeof err) == 0, "%s: %s", name, err);
        for (uint64_t i = 0; i < t->numel; i++) {
            unsigned bits = 0, mine;
            memcpy(&mine, &got[i], 4);
            CHECK(fscanf(ex, "%x", &bits) == 1 && bits == mine, "%s[%llu]: %08x, torch %08x",
                  name, (unsigned long long)i, mine, bits);
        }
        free(got);
        seen++;
    }
    CHECK(seen == f.ntensors - 1, "compared %d of %d tensors", seen, f.ntensors);
    const dt_st_tensor *ids = dt_st_find(&f, "ids");
    CHECK(ids && ids->dtype == DT_ST_I64 && ids->numel == 3, "ids");
    if (ids) {
        int64_t v[3];
        memcpy(v, ids->data, sizeof v);
        CHECK(v[0] == -1 && v[1] == 50256 && v[2] == (int64_t)1 << 40, "ids values");
    }
    CHECK(dt_st_meta_get(&f, "source") && !strcmp(dt_st_meta_get(&f, "source"), "torch"),
          "metadata");
    if (ex) fclose(ex);
    dt_st_close(&f);
    return finish("read-torch");
}

/* The values test_safetensors_torch.py expects: see its check_written. */
static int write_for_torch(const char *out)
{
    char err[1024];
    float w[12], bias[5], big[1000];
    for (int i = 0; i < 12; i++) w[i] = (float)(i - 6) / 4;
    for (int i = 0; i < 5; i++) bias[i] = 0.1f * (float)i;
    for (int i = 0; i < 1000; i++) big[i] = sinf((float)i);
    uint16_t h[1000], bf[1000];
    for (int i = 0; i < 1000; i++) {
        h[i] = dt_f32_to_f16(big[i] * 100);
        bf[i] = dt_f32_to_bf16(big[i] * 1e5f);
    }
    float scalar = -2.5f;
    dt_st_entry e[] = {
        {.name = "h.0.attn.c_attn.weight", .data = w, .ndim = 2, .shape = {3, 4}},
        {.name = "h.0.ln_1.bias", .data = bias, .ndim = 1, .shape = {5}},
        {.name = "sin", .data = big, .ndim = 3, .shape = {10, 10, 10}},
        {.name = "sin_f16", .data = h, .ndim = 2, .shape = {100, 10}, .dtype = DT_ST_F16},
        {.name = "sin_bf16", .data = bf, .ndim = 1, .shape = {1000}, .dtype = DT_ST_BF16},
        {.name = "scalar", .data = &scalar, .ndim = 0},
        {.name = "caf\xc3\xa9 \"q\"", .data = w, .ndim = 1, .shape = {1}},
    };
    if (dt_st_write_f32(out, e, 7, err, sizeof err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    return 0;
}

static void make_dir(void)
{
    snprintf(dir, sizeof dir, "/tmp/dtrain_st_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        exit(1);
    }
}

static void remove_dir(void)
{
    DIR *d = opendir(dir);
    struct dirent *e;
    while ((e = readdir(d)))
        if (e->d_name[0] != '.') unlink(path_in(e->d_name));
    closedir(d);
    rmdir(dir);
}

int main(int argc, char **argv)
{
    if (argc == 4 && !strcmp(argv[1], "read-torch")) return read_torch(argv[2], argv[3]);
    if (argc == 3 && !strcmp(argv[1], "write")) return write_for_torch(argv[2]);
    if (argc != 2 || strcmp(argv[1], "unit") != 0) {
        fprintf(stderr, "usage: %s unit | read-torch FILE EXPECTED | write OUT\n", argv[0]);
        return 2;
    }
    make_dir();
    test_malformed();
    test_lenient();
    test_round_trip();
    test_write_errors();
    remove_dir();
    return finish("safetensors");
}
