/* `dtensor ckpt`: list a checkpoint's tensors and slices (or a manager root's steps), verify
 * every byte of it, export it as standard safetensors. Local: reads files only, starts no runtime and no MPI. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* "[4,0]" for a box corner or shape. */
static void format_dims(char *buf, size_t len, int rank, const int64_t *v)
{
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < rank && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%" PRId64, d ? "," : "", v[d]);
    if (n < len)
        snprintf(buf + n, len - n, "]");
}

static void print_values(const dt_ckpt *ck)
{
    int64_t nv = dt_ckpt_num_values(ck);
    if (nv == 0)
        return;
    printf("values: %" PRId64 "\n", nv);
    for (int64_t i = 0; i < nv; i++) {
        const char *name = NULL;
        dt_ckpt_value_type type;
        if (dt_ckpt_value_info(ck, i, &name, &type) != DT_OK)
            continue;
        if (type == DT_CKPT_VALUE_I64) {
            int64_t v = 0;
            dt_ckpt_value_i64(ck, name, &v);
            printf("  %s i64 %" PRId64 "\n", name, v);
        } else if (type == DT_CKPT_VALUE_F64) {
            double v = 0;
            dt_ckpt_value_f64(ck, name, &v);
            printf("  %s f64 %.17g\n", name, v);
        } else {
            const void *data = NULL;
            size_t nbytes = 0;
            dt_ckpt_value_bytes(ck, name, &data, &nbytes);
            printf("  %s bytes %zu:", name, nbytes);
            for (size_t k = 0; k < nbytes && k < 32; k++)
                printf("%s%02x", k ? "" : " ", ((const unsigned char *)data)[k]);
            printf("%s\n", nbytes > 32 ? "..." : "");
        }
    }
}

/* `ls ROOT` of a manager's root: its steps, which are complete, which is latest. 1 when root
 * holds steps (listed), 0 when it holds none (not a root). */
static int ls_steps(const char *root)
{
    dt_ckpt_step *v = NULL;
    int64_t n = 0, latest = -1;
    if (dt_ckpt_list_steps(root, &v, &n) != DT_OK || n == 0) {
        dt_ckpt_steps_free(v);
        return 0;
    }
    if (dt_ckpt_latest(root, &latest, NULL, 0) != DT_OK)
        latest = -1;
    printf("checkpoint steps under %s: %" PRId64 "\n", root, n);
    for (int64_t i = 0; i < n; i++) {
        char dir[4096];
        if (dt_ckpt_step_dir(root, v[i].step, dir, sizeof dir) != DT_OK)
            continue;
        printf("  step %" PRId64 " %s %s%s\n", v[i].step, strrchr(dir, '/') + 1,
               v[i].complete ? "complete" : "incomplete",
               v[i].step == latest ? " latest" : "");
    }
    if (latest < 0)
        printf("no complete step\n");
    dt_ckpt_steps_free(v);
    return 1;
}

static int cmd_ls(const char *dir)
{
    dt_ckpt *ck = NULL;
    dt_status st = dt_ckpt_open(dir, &ck);
    if (st == DT_ERR_NOT_FOUND && ls_steps(dir))
        return CLI_OK;
    if (st != DT_OK)
        return cli_fail(dir, st);
    int64_t nf = dt_ckpt_num_files(ck), nt = dt_ckpt_num_tensors(ck);
    printf("checkpoint %s (format %d)\n", dt_ckpt_path(ck), dt_ckpt_format_version(ck));
    const char *path = dt_ckpt_path(ck), *old = ".dtensor-old";
    size_t pl = strlen(path), ol = strlen(old);
    if (pl > ol && strcmp(path + pl - ol, old) == 0)
        printf("note: %s holds no complete checkpoint; this is the previous one, left by a "
               "save that stopped while committing\n",
               dir);
    printf("mesh: %s\n", dt_ckpt_mesh(ck));
    printf("files: %" PRId64 "\n", nf);
    for (int64_t i = 0; i < nf; i++) {
        dt_ckpt_file_info fi;
        if (dt_ckpt_file(ck, i, &fi) != DT_OK)
            continue;
        printf("  %s device=%d bytes=%" PRIu64 " header=%" PRIu64 "\n", fi.name, fi.device_id,
               fi.bytes, fi.header_bytes);
    }
    printf("tensors: %" PRId64 "\n", nt);
    for (int64_t i = 0; i < nt; i++) {
        dt_ckpt_tensor_info ti;
        st = dt_ckpt_tensor(ck, i, &ti);
        if (st != DT_OK) {
            dt_ckpt_close(ck);
            return cli_fail(dir, st);
        }
        char shape[256];
        format_dims(shape, sizeof shape, ti.rank, ti.shape);
        printf("%s %s %s slices=%" PRId64 "\n", ti.name, dt_dtype_name(ti.dtype), shape,
               ti.num_slices);
        /* A tensor saved as explicitly placed pieces has no layout. */
        printf("  layout: %s\n", ti.layout[0] ? ti.layout : "(pieces)");
        for (int64_t s = 0; s < ti.num_slices; s++) {
            dt_ckpt_slice_info si;
            if (dt_ckpt_slice(ck, i, s, &si) != DT_OK)
                continue;
            char off[256], sz[256];
            format_dims(off, sizeof off, si.rank, si.offsets);
            format_dims(sz, sizeof sz, si.rank, si.sizes);
            printf("  slice %" PRId64 ": offsets=%s sizes=%s file=%s at=%" PRIu64 " bytes=%" PRIu64
                   " crc32c=%08" PRIx32 "%s%s\n",
                   s, off, sz, si.file, si.file_offset, si.bytes, si.crc32c,
                   strcmp(si.key, ti.name) ? " key=" : "", strcmp(si.key, ti.name) ? si.key : "");
        }
    }
    print_values(ck);
    dt_ckpt_close(ck);
    return CLI_OK;
}

/* Prints one problem found by dt_ckpt_verify: the file, and the tensor and slice if any. */
static void report_problem(void *arg, const dt_ckpt_problem *p)
{
    (void)arg;
    if (p->slice_index >= 0)
        fprintf(stderr, "BAD slice %" PRId64 " of tensor '%s' in %s: %s\n", p->slice_index,
                p->tensor, p->file, p->message);
    else if (p->tensor && p->tensor[0])
        fprintf(stderr, "BAD tensor '%s' in %s: %s\n", p->tensor, p->file, p->message);
    else
        fprintf(stderr, "BAD file %s: %s\n", p->file, p->message);
}

static int cmd_verify(const char *dir)
{
    dt_ckpt *ck = NULL;
    dt_status st = dt_ckpt_open(dir, &ck);
    if (st != DT_OK)
        return cli_fail(dir, st);
    int64_t bad = 0;
    st = dt_ckpt_verify(ck, report_problem, NULL, &bad);
    if (st != DT_OK) {
        fprintf(stderr, "dtensor: %s: %" PRId64 " problem%s found (%s)\n", dt_ckpt_path(ck), bad,
                bad == 1 ? "" : "s", dt_status_name(st));
        dt_ckpt_close(ck);
        return CLI_BAD_INPUT;
    }
    int64_t nt = dt_ckpt_num_tensors(ck), slices = 0;
    for (int64_t i = 0; i < nt; i++) {
        dt_ckpt_tensor_info ti;
        if (dt_ckpt_tensor(ck, i, &ti) == DT_OK)
            slices += ti.num_slices;
    }
    printf("ok: %s: %" PRId64 " tensors, %" PRId64 " slices, %" PRId64 " files verified\n",
           dt_ckpt_path(ck), nt, slices, dt_ckpt_num_files(ck));
    dt_ckpt_close(ck);
    return CLI_OK;
}

static int cmd_export(const char *dir, const char *out, uint64_t max_bytes)
{
    dt_ckpt *ck = NULL;
    dt_status st = dt_ckpt_open(dir, &ck);
    if (st != DT_OK)
        return cli_fail(dir, st);
    dt_ckpt_export_opts opts = DT_CKPT_EXPORT_OPTS_INIT;
    opts.max_file_bytes = max_bytes;
    int files = 0;
    st = dt_ckpt_export(ck, out, &opts, &files);
    if (st != DT_OK) {
        dt_ckpt_close(ck);
        return cli_fail(out, st);
    }
    printf("exported %" PRId64 " tensors from %s to %s in %d file%s%s\n", dt_ckpt_num_tensors(ck),
           dt_ckpt_path(ck), out, files, files == 1 ? "" : "s",
           files > 1 ? " with model.safetensors.index.json" : "");
    dt_ckpt_close(ck);
    return CLI_OK;
}

/* `export --format hf-gpt2 DIR OUT.safetensors [--vocab V]`: our GPT-2 checkpoint as one
 * Hugging Face GPT-2 file (docs/foreign.md). */
static int cmd_export_hf_gpt2(const char *dir, const char *out, int64_t vocab)
{
    dt_ckpt *ck = NULL;
    dt_status st = dt_ckpt_open(dir, &ck);
    if (st != DT_OK)
        return cli_fail(dir, st);
    st = dt_ckpt_export_hf_gpt2(ck, out, vocab, NULL);
    if (st != DT_OK) {
        dt_ckpt_close(ck);
        return cli_fail(out, st);
    }
    printf("exported GPT-2 from %s to %s (Hugging Face names)\n", dt_ckpt_path(ck), out);
    dt_ckpt_close(ck);
    return CLI_OK;
}

static int export_format(int argc, char **argv)
{
    /* argv: ckpt export --format FORMAT DIR OUT [--vocab V] */
    if (strcmp(argv[3], "hf-gpt2") != 0) {
        fprintf(stderr, "dtensor: --format '%s': the formats are hf-gpt2 (the plain form "
                        "exports every tensor as it is)\n", argv[3]);
        return CLI_USAGE;
    }
    int64_t vocab = 0;
    if (argc == 8) {
        char *end;
        long long v = strtoll(argv[7], &end, 10);
        if (strcmp(argv[6], "--vocab") != 0 || end == argv[7] || *end || v <= 0) {
            fprintf(stderr, "dtensor: expected --vocab V with V > 0\n");
            return CLI_USAGE;
        }
        vocab = v;
    }
    return cmd_export_hf_gpt2(argv[4], argv[5], vocab);
}

/* "4096", "64k", "512M", "2G" (binary units); 0 on bad text. */
static uint64_t parse_bytes(const char *text)
{
    char *end;
    unsigned long long v = strtoull(text, &end, 10);
    if (end == text || text[0] == '-')
        return 0;
    int shift = 0;
    if (*end == 'k' || *end == 'K')
        shift = 10;
    else if (*end == 'm' || *end == 'M')
        shift = 20;
    else if (*end == 'g' || *end == 'G')
        shift = 30;
    else if (*end != '\0')
        return 0;
    if (shift && end[1] != '\0')
        return 0;
    if (v > (UINT64_MAX >> shift))
        return 0;
    return (uint64_t)v << shift;
}

int cli_ckpt(int argc, char **argv)
{
    if (argc < 3)
        return cli_usage();
    const char *sub = argv[1];
    if (strcmp(sub, "ls") == 0 && argc == 3)
        return cmd_ls(argv[2]);
    if (strcmp(sub, "verify") == 0 && argc == 3)
        return cmd_verify(argv[2]);
    if (strcmp(sub, "export") == 0 && (argc == 6 || argc == 8) &&
        strcmp(argv[2], "--format") == 0)
        return export_format(argc, argv);
    if (strcmp(sub, "export") == 0 && (argc == 4 || argc == 6)) {
        uint64_t max_bytes = 0;
        if (argc == 6) {
            if (strcmp(argv[4], "--max-file-bytes") != 0)
                return cli_usage();
            max_bytes = parse_bytes(argv[5]);
            if (max_bytes == 0) {
                fprintf(stderr,
                        "dtensor: --max-file-bytes '%s': expected a positive size "
                        "such as 4096, 64k, 512M or 2G\n",
                        argv[5]);
                return CLI_USAGE;
            }
        }
        return cmd_export(argv[2], argv[3], max_bytes);
    }
    return cli_usage();
}
