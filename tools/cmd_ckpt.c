/* `dtensor ckpt`: list a checkpoint's tensors and slices (or a manager root's steps), verify
 * every byte of it, export it as standard safetensors. Local: reads files only, starts no runtime and no MPI. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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

/* `ls ROOT` of a manager's root: its steps, which are complete, damaged (and why) or set
 * aside, which is latest, and what latest passed over. 1 when root holds steps (listed), 0
 * when it holds none (not a root). */
static int ls_steps(const char *root)
{
    dt_ckpt_step *v = NULL;
    int64_t n = 0;
    dt_ckpt_latest_info latest = {.step = -1, .skipped_step = -1};
    if (dt_ckpt_list_steps(root, &v, &n) != DT_OK || n == 0) {
        dt_ckpt_steps_free(v);
        return 0;
    }
    if (dt_ckpt_find_latest(root, &latest, NULL, 0) != DT_OK)
        latest.step = -1;
    printf("checkpoint steps under %s: %" PRId64 "\n", root, n);
    for (int64_t i = 0; i < n; i++) {
        const char *state = v[i].complete ? "complete" : "incomplete";
        if (v[i].set_aside)
            state = "damaged, set aside";
        else if (v[i].damaged)
            state = "damaged";
        printf("  step %" PRId64 " %s %s%s%s%s\n", v[i].step, v[i].name, state,
               v[i].complete && v[i].step == latest.step ? " latest" : "",
               v[i].damaged ? ": " : "", v[i].damaged ? v[i].reason : "");
    }
    if (latest.step < 0)
        printf("no complete step\n");
    else if (latest.skipped > 0)
        printf("note: latest is step %" PRId64 ": %" PRId64 " damaged step%s passed over "
               "(the newest, %" PRId64 ": %s); a manager save at or above %s sets %s "
               "aside as step-N.damaged\n",
               latest.step, latest.skipped, latest.skipped == 1 ? "" : "s", latest.skipped_step,
               latest.skipped_reason, latest.skipped == 1 ? "it" : "each",
               latest.skipped == 1 ? "it" : "them");
    dt_ckpt_steps_free(v);
    return 1;
}

/* A checkpoint argument: a manager's "ROOT/latest" pointer file names the step directory
 * beside it (followed into buf, with a line saying so); anything else is itself. 0, or -1
 * with a message printed (a pointer that names no step). */
static int follow_pointer(const char *arg, char *buf, size_t len, int say)
{
    struct stat sb;
    snprintf(buf, len, "%s", arg);
    if (stat(arg, &sb) != 0 || !S_ISREG(sb.st_mode))
        return 0;
    FILE *f = fopen(arg, "r");
    char line[128] = "";
    int ok = f && fgets(line, sizeof line, f) != NULL;
    if (f)
        fclose(f);
    size_t ll = strlen(line);
    ok = ok && ll > 6 && line[ll - 1] == '\n' && strncmp(line, "step-", 5) == 0 &&
         strspn(line + 5, "0123456789") == ll - 6;
    if (!ok) {
        fprintf(stderr, "dtensor: %s: a file, not a checkpoint directory, and not a manager's "
                        "'latest' pointer (one line \"step-N\")\n", arg);
        return -1;
    }
    line[ll - 1] = '\0';
    const char *slash = strrchr(arg, '/');
    int dl = slash ? (int)(slash - arg) : 1;
    if ((size_t)snprintf(buf, len, "%.*s/%s", dl, slash ? arg : ".", line) >= len) {
        fprintf(stderr, "dtensor: %s: path too long\n", arg);
        return -1;
    }
    if (!say)
        return 0;
    printf("%s -> %s\n", arg, buf);
    char root[4096];
    dt_ckpt_latest_info li;
    snprintf(root, sizeof root, "%.*s", dl, slash ? arg : ".");
    if (dt_ckpt_find_latest(root, &li, NULL, 0) == DT_OK && li.skipped > 0 &&
        li.skipped_step == strtoll(line + 5, NULL, 10))
        printf("note: that step is damaged (%s); the latest complete step is %" PRId64 "\n",
               li.skipped_reason, li.step);
    return 0;
}

/* Opens the checkpoint `arg` names (following a 'latest' pointer); prints why not. */
static int open_arg(const char *arg, int say, dt_ckpt **ck_out, dt_status *st_out)
{
    char dir[4096];
    *st_out = DT_OK;
    if (follow_pointer(arg, dir, sizeof dir, say) != 0)
        return CLI_BAD_INPUT;
    dt_status st = dt_ckpt_open(dir, ck_out);
    *st_out = st;
    if (st != DT_OK && strcmp(dir, arg) != 0) {
        fprintf(stderr, "dtensor: %s names %s: %s: %s (`dtensor ckpt ls` of its directory "
                        "lists the steps and which are complete)\n",
                arg, dir, dt_status_name(st), dt_last_error());
        return CLI_BAD_INPUT;
    }
    return CLI_OK;
}

static int cmd_ls(const char *dir)
{
    dt_ckpt *ck = NULL;
    dt_status st;
    int rc = open_arg(dir, 1, &ck, &st);
    if (rc != CLI_OK)
        return rc;
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
    dt_status st;
    int rc = open_arg(dir, 1, &ck, &st);
    if (rc != CLI_OK)
        return rc;
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
    dt_status st;
    int rc = open_arg(dir, 0, &ck, &st);
    if (rc != CLI_OK)
        return rc;
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

/* `export --format hf-gpt2 DIR OUT [--vocab V] [--heads H]`: our GPT-2 checkpoint as one
 * Hugging Face GPT-2 file with its config.json beside it (docs/foreign.md). */
static int cmd_export_hf_gpt2(const char *dir, const char *out, int64_t vocab, int64_t heads)
{
    dt_ckpt *ck = NULL;
    dt_status st;
    int rc = open_arg(dir, 0, &ck, &st);
    if (rc != CLI_OK)
        return rc;
    if (st != DT_OK)
        return cli_fail(dir, st);
    dt_ckpt_export_opts opts = DT_CKPT_EXPORT_OPTS_INIT;
    opts.heads = heads;
    st = dt_ckpt_export_hf_gpt2(ck, out, vocab, &opts);
    if (st != DT_OK) {
        dt_ckpt_close(ck);
        return cli_fail(out, st);
    }
    printf("exported GPT-2 from %s to %s and config.json beside it (Hugging Face names)\n",
           dt_ckpt_path(ck), out);
    dt_ckpt_close(ck);
    return CLI_OK;
}

/* A positive count after flag `flag`: 0 and *v_out, else -1 (printed). */
static int positive_arg(const char *flag, const char *text, int64_t *v_out)
{
    char *end;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end || v <= 0) {
        fprintf(stderr, "dtensor: expected %s N with N > 0, not '%s'\n", flag, text);
        return -1;
    }
    *v_out = v;
    return 0;
}

static int export_format(int argc, char **argv)
{
    /* argv: ckpt export --format FORMAT DIR OUT [--vocab V] [--heads H] */
    if (strcmp(argv[3], "hf-gpt2") != 0) {
        fprintf(stderr, "dtensor: --format '%s': the formats are hf-gpt2 (the plain form "
                        "exports every tensor as it is)\n", argv[3]);
        return CLI_USAGE;
    }
    int64_t vocab = 0, heads = 0;
    for (int i = 6; i < argc; i += 2) {
        int64_t *to = !strcmp(argv[i], "--vocab") ? &vocab : !strcmp(argv[i], "--heads") ? &heads
                                                                                         : NULL;
        if (!to || i + 1 >= argc)
            return cli_usage();
        if (positive_arg(argv[i], argv[i + 1], to) != 0)
            return CLI_USAGE;
    }
    return cmd_export_hf_gpt2(argv[4], argv[5], vocab, heads);
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
    if (strcmp(sub, "export") == 0 && (argc == 6 || argc == 8 || argc == 10) &&
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
