/* Checkpoint metadata at scale: the slice index (ckpt/slice_index.c) must offer a restore
 * target exactly the slices its box meets, checked against scanning every slice over random
 * tilings; and the index of a 1024-device save, built as client 0 builds it, must parse back
 * with every slice found in its own file (the parser looks files up by their number); the
 * index text and the files' safetensors headers, written straight into a buffer
 * (ckpt/json_out.c), are jansson's own dump of the same document byte for byte. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "harness.h"

static uint64_t rng_next(uint64_t *s)
{
    *s ^= *s << 13;
    *s ^= *s >> 7;
    *s ^= *s << 17;
    return *s;
}

static int64_t below(uint64_t *s, int64_t n)
{
    return (int64_t)(rng_next(s) % (uint64_t)n);
}

/* Splits the box (off, size) at random cuts (guillotine: a dim, then each half again, at
 * most `depth` levels) into slices appended to t. */
static void split(uint64_t *r, ck_tensor *t, const int64_t *off, const int64_t *size, int depth)
{
    int d = (int)below(r, t->rank);
    if (depth == 0 || size[d] < 2 || below(r, 5) == 0) {
        ck_slice *s = &t->slices[t->nslices++];
        memcpy(s->off, off, sizeof s->off);
        memcpy(s->size, size, sizeof s->size);
        return;
    }
    int64_t cut = 1 + below(r, size[d] - 1), o2[DT_MAX_RANK], s1[DT_MAX_RANK], s2[DT_MAX_RANK];
    memcpy(o2, off, sizeof o2);
    memcpy(s1, size, sizeof s1);
    memcpy(s2, size, sizeof s2);
    s1[d] = cut;
    o2[d] += cut;
    s2[d] -= cut;
    split(r, t, off, s1, depth - 1);
    split(r, t, o2, s2, depth - 1);
}

static int meets(int rank, const int64_t *ao, const int64_t *as, const int64_t *bo,
                 const int64_t *bs)
{
    for (int d = 0; d < rank; d++)
        if (ao[d] >= bo[d] + bs[d] || bo[d] >= ao[d] + as[d])
            return 0;
    return 1;
}

static void test_the_slices_near_a_box_are_all_the_slices_that_meet_it(void)
{
    uint64_t r = 12345;
    int64_t bad = 0, queries = 0, looked = 0, scanned = 0;
    for (int trial = 0; trial < 200; trial++) {
        ck_tensor t;
        memset(&t, 0, sizeof t);
        t.name = "t";
        t.rank = 1 + (int)below(&r, 3);
        int64_t zero[DT_MAX_RANK] = {0};
        for (int d = 0; d < t.rank; d++)
            t.shape[d] = 1 + below(&r, 40);
        t.slices = calloc(1 << 10, sizeof *t.slices);
        CU_ASSERT_FATAL(t.slices != NULL);
        if (trial % 2) { /* a grid of uneven cuts, as layouts save */
            int64_t k[DT_MAX_RANK], c[DT_MAX_RANK] = {0};
            for (int d = 0; d < t.rank; d++)
                k[d] = 1 + below(&r, t.shape[d] < 8 ? t.shape[d] : 8);
            for (int done = 0; !done;) {
                ck_slice *s = &t.slices[t.nslices++];
                for (int d = 0; d < t.rank; d++) {
                    int64_t q = t.shape[d] / k[d], rem = t.shape[d] % k[d];
                    s->off[d] = c[d] * q + (c[d] < rem ? c[d] : rem);
                    s->size[d] = q + (c[d] < rem);
                }
                done = 1;
                for (int d = t.rank - 1; d >= 0 && done; d--)
                    if (++c[d] < k[d])
                        done = 0;
                    else
                        c[d] = 0;
            }
        } else { /* free-form pieces */
            split(&r, &t, zero, t.shape, 9);
        }
        DT_ASSERT_OK(dt__ckpt_slice_index(&t));
        for (int q = 0; q < 50; q++) {
            int64_t off[DT_MAX_RANK], size[DT_MAX_RANK], first, end, near = 0, all = 0;
            for (int d = 0; d < t.rank; d++) {
                off[d] = below(&r, t.shape[d]);
                size[d] = 1 + below(&r, t.shape[d] - off[d]);
            }
            dt__ckpt_slices_near(&t, off, size, &first, &end);
            for (int64_t i = first; i < end; i++)
                near += meets(t.rank, off, size, t.slices[t.order[i]].off,
                              t.slices[t.order[i]].size);
            for (int64_t s = 0; s < t.nslices; s++)
                all += meets(t.rank, off, size, t.slices[s].off, t.slices[s].size);
            bad += near != all;
            looked += end - first;
            scanned += t.nslices;
            queries++;
        }
        free(t.order);
        free(t.reach);
        free(t.slices);
    }
    printf("\n  %lld queries: %lld slices looked at, %lld by scanning\n", (long long)queries,
           (long long)looked, (long long)scanned);
    CU_ASSERT_EQUAL(bad, 0);
    CU_ASSERT(looked < scanned);
}

static void test_a_1024_device_index_parses_back_with_every_slice_in_its_file(void)
{
    enum { N = 1024 };
    static const char *dims[1] = {"x"};
    int64_t sizes[1] = {N}, sw[2] = {4 * N, 8}, sb[1] = {5};
    dt_mesh *m = NULL;
    dt_layout *lw = NULL, *lb = NULL;
    const char *spec_w[2] = {"x", DT_UNSHARDED}, *spec_b[1] = {DT_UNSHARDED};
    DT_ASSERT_OK(dt_mesh_create("big", 1, dims, sizes, DT_DEVICE_CPU, &m));
    DT_ASSERT_OK(dt_layout_create(m, 2, spec_w, &lw));
    DT_ASSERT_OK(dt_layout_create(m, 1, spec_b, &lb));
    const char *names[2] = {"w", "b"};
    const dt_layout *layouts[2] = {lw, lb};
    const int ranks[2] = {2, 1};
    const int64_t *shapes[2] = {sw, sb};
    const dt_dtype dtypes[2] = {DT_DTYPE_F32, DT_DTYPE_F64};
    ck_plan_input in = {2, names, layouts, ranks, shapes, dtypes, 0, NULL};
    ck_plan plan;
    DT_ASSERT_OK(dt__ckpt_plan(m, &in, DT_CKPT_CHUNK_BYTES, &plan));
    CU_ASSERT_EQUAL(plan.nslices, N + 1);
    uint32_t *crcs = calloc((size_t)plan.nslices, sizeof *crcs);
    uint32_t **chunk = calloc((size_t)plan.nslices, sizeof *chunk);
    for (int64_t i = 0; i < plan.nslices; i++) {
        chunk[i] = calloc(1, sizeof **chunk);
        chunk[i][0] = crcs[i] = (uint32_t)(i * 2654435761u); /* one chunk: the slice's CRC */
    }
    size_t mlen = dt_mesh_format(m, NULL, 0) + 1;
    char *mesh_str = malloc(mlen), *text = NULL;
    dt_mesh_format(m, mesh_str, mlen);
    DT_ASSERT_OK(dt__ckpt_index_text(&plan, mesh_str, N, crcs, (const uint32_t *const *)chunk,
                                     0, NULL, &text));
    dt_ckpt *ck = NULL;
    DT_ASSERT_OK(dt__ckpt_parse_index("big", "big/dtensor-index.json", text, strlen(text), &ck));
    CU_ASSERT_EQUAL(ck->nfiles, plan.nfiles);
    int64_t wrong = 0, si = 0;
    for (int64_t t = 0; t < ck->ntensors; t++) {
        const ck_tensor *ct = &ck->tensors[t];
        for (int64_t s = 0; s < ct->nslices; s++, si++) {
            const ck_plan_slice *ps = &plan.slices[si];
            wrong += ct->slices[s].file != plan.file_of_position[ps->position];
            wrong += ct->slices[s].crc != crcs[si];
            wrong += ck->files[ct->slices[s].file].device_id !=
                     dt_mesh_device_id(m, ps->position);
        }
    }
    CU_ASSERT_EQUAL(si, plan.nslices);
    CU_ASSERT_EQUAL(wrong, 0);
    dt_ckpt_close(ck);
    free(text);
    free(mesh_str);
    for (int64_t i = 0; i < plan.nslices; i++)
        free(chunk[i]);
    free(chunk);
    free(crcs);
    dt__ckpt_plan_free(&plan);
    dt_layout_destroy(lw);
    dt_layout_destroy(lb);
    dt_mesh_destroy(m);
}

/* jansson's dump of text (parsed back) with the given flags, owned. */
static char *jansson_redump(const char *text, size_t len, size_t flags)
{
    json_error_t err;
    json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!root) {
        fprintf(stderr, "jansson: %d:%d: %s\n", err.line, err.column, err.text);
        return NULL;
    }
    char *out = json_dumps(root, flags | JSON_PRESERVE_ORDER);
    json_decref(root);
    return out;
}

static void test_the_writer_escapes_and_formats_as_jansson_does(void)
{
    static const char *strs[] = {"", "plain", "q\"uote", "back\\slash", "nl\n tab\t cr\r",
                                 "\b\f\x01\x1f\x7f", "caf\xc3\xa9 / \xe2\x82\xac", "a#12"};
    static const double reals[] = {0.1, 3.0, -0.0, 1e20, 1e-5, 123456789.125, -2.5e-300,
                                   1.7976931348623157e308};
    static const int64_t ints[] = {0, -1, 7, INT64_MAX, INT64_MIN, 4294967295};
    for (int indent = 0; indent < 3; indent++) {
        ck_jw w;
        json_t *ref = json_object(), *sa = json_array(), *ra = json_array(), *ia = json_array();
        dt__jw_init(&w, indent);
        dt__jw_open(&w, '{');
        dt__jw_key(&w, "strings");
        dt__jw_open(&w, '[');
        for (size_t i = 0; i < sizeof strs / sizeof *strs; i++) {
            dt__jw_elem(&w);
            dt__jw_str(&w, strs[i]);
            json_array_append_new(sa, json_string(strs[i]));
        }
        dt__jw_close(&w, ']');
        dt__jw_key(&w, "reals");
        dt__jw_open(&w, '[');
        for (size_t i = 0; i < sizeof reals / sizeof *reals; i++) {
            dt__jw_elem(&w);
            dt__jw_real(&w, reals[i]);
            json_array_append_new(ra, json_real(reals[i]));
        }
        dt__jw_close(&w, ']');
        dt__jw_key(&w, "ints");
        dt__jw_int_array(&w, (int)(sizeof ints / sizeof *ints), ints);
        for (size_t i = 0; i < sizeof ints / sizeof *ints; i++)
            json_array_append_new(ia, json_integer(ints[i]));
        dt__jw_key(&w, "empty \"obj\"");
        dt__jw_open(&w, '{');
        dt__jw_close(&w, '}');
        dt__jw_key(&w, "empty");
        dt__jw_int_array(&w, 0, NULL);
        dt__jw_close(&w, '}');
        json_object_set_new(ref, "strings", sa);
        json_object_set_new(ref, "reals", ra);
        json_object_set_new(ref, "ints", ia);
        json_object_set_new(ref, "empty \"obj\"", json_object());
        json_object_set_new(ref, "empty", json_array());
        char *mine = dt__jw_take(&w);
        char *theirs = json_dumps(ref, (indent ? JSON_INDENT(indent) : JSON_COMPACT) |
                                           JSON_PRESERVE_ORDER);
        CU_ASSERT_PTR_NOT_NULL(mine);
        CU_ASSERT_PTR_NOT_NULL(theirs);
        if (mine && theirs && strcmp(mine, theirs) != 0)
            fprintf(stderr, "indent %d:\nmine:   %s\njansson: %s\n", indent, mine, theirs);
        CU_ASSERT(mine && theirs && strcmp(mine, theirs) == 0);
        free(mine);
        free(theirs);
        json_decref(ref);
    }
    /* Unbalanced or NULL: no text. */
    ck_jw w;
    dt__jw_init(&w, 1);
    dt__jw_close(&w, '}');
    CU_ASSERT_PTR_NULL(dt__jw_take(&w));
    dt__jw_init(&w, 0);
    dt__jw_str(&w, NULL);
    CU_ASSERT_PTR_NULL(dt__jw_take(&w));
}

/* File names are formatted by hand: the same text as snprintf's, truncated alike. */
static void test_file_names_are_snprintf_s_text(void)
{
    static const int64_t ks[] = {0, 7, 99999, 100000, 1234567, INT64_MAX};
    static const size_t lens[] = {64, 33, 20, 1};
    int wrong = 0;
    for (size_t a = 0; a < sizeof ks / sizeof *ks; a++)
        for (size_t b = 0; b < sizeof ks / sizeof *ks; b++)
            for (size_t c = 0; c < sizeof lens / sizeof *lens; c++) {
                char mine[64], ref[64];
                memset(mine, 'x', sizeof mine);
                dt__ckpt_file_name(mine, lens[c], ks[a], ks[b]);
                snprintf(ref, lens[c], "data-%05lld-of-%05lld.safetensors", (long long)ks[a],
                         (long long)ks[b]);
                wrong += strcmp(mine, ref) != 0;
            }
    CU_ASSERT_EQUAL(wrong, 0);
}

/* A save of pieces (several slices of one tensor in a file: keys name#k and "tensor" in the
 * headers), a layout tensor on a 2-D mesh and named values of every type: the index text is
 * jansson's JSON_INDENT(1) dump of itself plus the final newline, and every header's JSON
 * is jansson's compact dump of itself. */
static void test_the_index_and_headers_are_jansson_s_text_byte_for_byte(void)
{
    static const char *dims[2] = {"x", "y"};
    int64_t sizes[2] = {4, 2}, sw[2] = {16, 6}, sp[1] = {10};
    dt_mesh *m = NULL;
    dt_layout *lw = NULL;
    const char *spec_w[2] = {"x", "y"};
    DT_ASSERT_OK(dt_mesh_create("two\"d", 2, dims, sizes, DT_DEVICE_CPU, &m));
    DT_ASSERT_OK(dt_layout_create(m, 2, spec_w, &lw));
    const char *names[2] = {"w", "p"};
    const dt_layout *layouts[2] = {lw, NULL};
    const int ranks[2] = {2, 1};
    const int64_t *shapes[2] = {sw, sp};
    const dt_dtype dtypes[2] = {DT_DTYPE_F32, DT_DTYPE_F64};
    /* p: [0,3) [3,5) on position 1, [5,10) on position 6. */
    ck_plan_piece pcs[3];
    memset(pcs, 0, sizeof pcs);
    int64_t po[3] = {0, 3, 5}, pz[3] = {3, 2, 5}, pp[3] = {1, 1, 6};
    for (int i = 0; i < 3; i++) {
        pcs[i].tensor = 1;
        pcs[i].position = pp[i];
        pcs[i].off[0] = po[i];
        pcs[i].size[0] = pz[i];
    }
    ck_plan_input in = {2, names, layouts, ranks, shapes, dtypes, 3, pcs};
    ck_plan plan;
    DT_ASSERT_OK(dt__ckpt_plan(m, &in, DT_CKPT_CHUNK_BYTES, &plan));
    CU_ASSERT_EQUAL(plan.nslices, 8 + 3);
    uint32_t *crcs = calloc((size_t)plan.nslices, sizeof *crcs);
    uint32_t **chunk = calloc((size_t)plan.nslices, sizeof *chunk);
    for (int64_t i = 0; i < plan.nslices; i++) {
        chunk[i] = calloc((size_t)plan.slices[i].nchunks + 1, sizeof **chunk);
        chunk[i][0] = crcs[i] = (uint32_t)(i * 2654435761u);
    }
    unsigned char bytes[3] = {0, 0xab, 0xff};
    dt_ckpt_value vals[5];
    memset(vals, 0, sizeof vals);
    vals[0] = (dt_ckpt_value){.name = "step", .type = DT_CKPT_VALUE_I64, .i64 = -42};
    vals[1] = (dt_ckpt_value){.name = "lr", .type = DT_CKPT_VALUE_F64, .f64 = 3e-4};
    vals[2] = (dt_ckpt_value){.name = "whole", .type = DT_CKPT_VALUE_F64, .f64 = 2.0};
    vals[3] = (dt_ckpt_value){.name = "inf", .type = DT_CKPT_VALUE_F64, .f64 = 1.0 / 0.0};
    vals[4] = (dt_ckpt_value){.name = "rng", .type = DT_CKPT_VALUE_BYTES, .bytes = bytes,
                              .nbytes = sizeof bytes};
    size_t mlen = dt_mesh_format(m, NULL, 0) + 1;
    char *mesh_str = malloc(mlen), *text = NULL;
    dt_mesh_format(m, mesh_str, mlen);
    DT_ASSERT_OK(dt__ckpt_index_text(&plan, mesh_str, 8, crcs, (const uint32_t *const *)chunk,
                                     5, vals, &text));
    char *ref = jansson_redump(text, strlen(text), JSON_INDENT(1));
    CU_ASSERT_PTR_NOT_NULL(ref);
    size_t rl = ref ? strlen(ref) : 0;
    CU_ASSERT(ref && strlen(text) == rl + 1 && memcmp(text, ref, rl) == 0 && text[rl] == '\n');
    CU_ASSERT_PTR_NOT_NULL(strstr(text, "\"key\": \"p#1\""));
    dt_ckpt *ck = NULL;
    DT_ASSERT_OK(dt__ckpt_parse_index("d", "d/dtensor-index.json", text, strlen(text), &ck));
    dt_ckpt_close(ck);
    int keyed = 0;
    for (int64_t f = 0; f < plan.nfiles; f++) {
        const ck_plan_file *pf = &plan.files[f];
        uint64_t hlen = 0;
        for (int b = 0; b < 8; b++)
            hlen |= (uint64_t)(unsigned char)pf->header[b] << (8 * b);
        CU_ASSERT_EQUAL(8 + hlen, pf->header_bytes);
        size_t jl = (size_t)hlen;
        while (jl > 0 && pf->header[8 + jl - 1] == ' ')
            jl--;
        char *h = jansson_redump(pf->header + 8, jl, JSON_COMPACT);
        CU_ASSERT(h && strlen(h) == jl && memcmp(h, pf->header + 8, jl) == 0);
        keyed += h && strstr(h, "\\\"tensor\\\":\\\"p\\\"") != NULL;
        free(h);
    }
    CU_ASSERT_EQUAL(keyed, 1);   /* position 1's file holds p and p#1 */
    free(ref);
    free(text);
    free(mesh_str);
    for (int64_t i = 0; i < plan.nslices; i++)
        free(chunk[i]);
    free(chunk);
    free(crcs);
    dt__ckpt_plan_free(&plan);
    dt_layout_destroy(lw);
    dt_mesh_destroy(m);
}

int main(int argc, char **argv)
{
    static const dt_test_case cases[] = {
        DT_TEST(test_the_slices_near_a_box_are_all_the_slices_that_meet_it),
        DT_TEST(test_a_1024_device_index_parses_back_with_every_slice_in_its_file),
        DT_TEST(test_the_writer_escapes_and_formats_as_jansson_does),
        DT_TEST(test_file_names_are_snprintf_s_text),
        DT_TEST(test_the_index_and_headers_are_jansson_s_text_byte_for_byte),
        DT_TEST_END,
    };
    return dt_test_main(argc, argv, "ckpt_scale", cases, 0);
}
