/* The `dtensor` tool: dispatch to subcommands, usage text and shared helpers. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

int cli_usage(void)
{
    fputs("usage: dtensor info\n"
          "       dtensor mesh show FILE.yaml [--name NAME]\n"
          "       dtensor mesh show --string 'MESH'\n"
          "       dtensor layout show 'LAYOUT' [--shape 8,6]\n"
          "       dtensor ckpt ls DIR|ROOT|ROOT/latest\n"
          "       dtensor ckpt verify DIR|ROOT/latest\n"
          "       dtensor ckpt export DIR OUT_DIR|OUT.safetensors [--max-file-bytes SIZE]\n"
          "       dtensor ckpt export --format hf-gpt2 DIR OUT.safetensors [--vocab V] [--heads H]\n"
          "       dtensor launch [--hosts H:N,... | --hostfile F] [--nproc-per-node N] [--dry-run]\n"
          "                      [--max-restarts K [--exclude-lost]] -- PROGRAM ARGS...\n"
          "       dtensor trace DIR [--last N] [--width W]\n"
          "       dtensor ops [--markdown]\n"
          "       dtensor ops --validate [--cases N] [--seed S] [--max-dim D] [--op NAME] [--gpu]\n"
          "       dtensor tokenize (--model DIR | --tokenizer FILE) --out PREFIX [--lines] INPUT...\n"
          "       dtensor generate --model DIR --prompt TEXT [--max-tokens N] [--temperature T]\n"
          "                        [--top-k K] [--top-p P] [--seed S] [--mesh FILE]\n"
          "       dtensor --version\n",
          stderr);
    return CLI_USAGE;
}

int cli_fail(const char *what, dt_status st)
{
    fprintf(stderr, "dtensor: %s: %s: %s\n", what, dt_status_name(st), dt_last_error());
    return CLI_BAD_INPUT;
}

static char *format_alloc(size_t (*fmt)(const void *, char *, size_t), const void *obj)
{
    size_t n = fmt(obj, NULL, 0);
    char *s = malloc(n + 1);
    if (s)
        fmt(obj, s, n + 1);
    return s;
}

static size_t fmt_mesh(const void *m, char *b, size_t n) { return dt_mesh_format(m, b, n); }
static size_t fmt_layout(const void *l, char *b, size_t n) { return dt_layout_format(l, b, n); }

char *cli_mesh_string(const dt_mesh *mesh) { return format_alloc(fmt_mesh, mesh); }
char *cli_layout_string(const dt_layout *layout) { return format_alloc(fmt_layout, layout); }

int cli_parse_shape(const char *text, int64_t *shape, int cap, char *why, size_t whylen)
{
    int rank = 0;
    const char *p = text;
    if (*p == '\0')
        return 0;
    for (;;) {
        char *end;
        size_t len = strcspn(p, ",");
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || v < 0 || (*end != ',' && *end != '\0')) {
            snprintf(why, whylen, "'%.*s' is not a size (a non-negative integer)", (int)len, p);
            return -1;
        }
        if (errno == ERANGE) { /* strtoll clamps to LLONG_MAX: never take that for the size */
            snprintf(why, whylen, "size %.*s is out of range (at most %lld)", (int)len, p,
                     (long long)INT64_MAX);
            return -1;
        }
        if (rank == cap) {
            snprintf(why, whylen, "more than %d sizes", cap);
            return -1;
        }
        shape[rank++] = v;
        if (*end == '\0')
            return rank;
        p = end + 1;
    }
}

int main(int argc, char **argv)
{
    if (argc < 2)
        return cli_usage();
    const char *cmd = argv[1];
    if (strcmp(cmd, "info") == 0)
        return cli_info(argc - 1, argv + 1);
    if (strcmp(cmd, "mesh") == 0)
        return cli_mesh(argc - 1, argv + 1);
    if (strcmp(cmd, "layout") == 0)
        return cli_layout(argc - 1, argv + 1);
    if (strcmp(cmd, "ckpt") == 0)
        return cli_ckpt(argc - 1, argv + 1);
    if (strcmp(cmd, "launch") == 0)
        return cli_launch(argc - 1, argv + 1);
    if (strcmp(cmd, "trace") == 0)
        return cli_trace(argc - 1, argv + 1);
    if (strcmp(cmd, "ops") == 0)
        return cli_ops(argc - 1, argv + 1);
    if (strcmp(cmd, "tokenize") == 0)
        return cli_tokenize(argc - 1, argv + 1);
    if (strcmp(cmd, "generate") == 0)
        return cli_generate(argc - 1, argv + 1);
    if (strcmp(cmd, "--version") == 0) {
        printf("dtensor %s (CUDA %s)\n", DT_VERSION_STRING, DT_HAVE_CUDA ? "built" : "not built");
        return CLI_OK;
    }
    if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0) {
        cli_usage();
        return CLI_OK;
    }
    fprintf(stderr, "dtensor: unknown command '%s'\n", cmd);
    return cli_usage();
}
