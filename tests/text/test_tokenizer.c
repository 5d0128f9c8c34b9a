/* The tokenizer on hand-worked vocabularies: merges in rank order, pieces never merged across,
 * bytes of invalid UTF-8, special tokens, both tokenizer.json merge forms, ignore_merges,
 * refusals naming the key, and the round trip of random bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "dtensor/tokenizer.h"

static char dir[64];

/* GPT-2's byte-level text of byte b (written out independently of text/vocab.c). */
static void byte_text(int b, char *out)
{
    int printable = (b >= '!' && b <= '~') || (b >= 0xa1 && b <= 0xac) || b >= 0xae;
    int cp = b;
    if (!printable) {
        int n = 0;
        for (int x = 0; x < b; x++)
            n += !((x >= '!' && x <= '~') || (x >= 0xa1 && x <= 0xac) || x >= 0xae);
        cp = 256 + n;
    }
    if (cp < 0x80) {
        out[0] = (char)cp;
        out[1] = 0;
    } else {
        out[0] = (char)(0xc0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3f));
        out[2] = 0;
    }
}

/* Writes JSON's string body for byte-level text (escaping " and \). */
static void put_json_str(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\')
            fputc('\\', f);
        fputc(*s, f);
    }
    fputc('"', f);
}

/* The 256 bytes as ids 0..255, then `extra` (byte-level text) as 256, 257, ... */
static void put_vocab(FILE *f, const char *const *extra, int n_extra)
{
    char t[4];
    fputc('{', f);
    for (int b = 0; b < 256; b++) {
        byte_text(b, t);
        put_json_str(f, t);
        fprintf(f, ": %d,", b);
    }
    for (int i = 0; i < n_extra; i++) {
        put_json_str(f, extra[i]);
        fprintf(f, ": %d%s", 256 + i, i + 1 < n_extra ? "," : "");
    }
    fputc('}', f);
}

static const char *path_of(const char *name)
{
    static char p[4][128];
    static int k;
    k = (k + 1) % 4;
    snprintf(p[k], sizeof p[k], "%s/%s", dir, name);
    return p[k];
}

/* vocab.json + merges.txt of the hand-worked vocabulary. */
static dt_tokenizer *small_files(void)
{
    static const char *const extra[] = {"ab", "bc", "abc", "aa", "<|endoftext|>", "aĠ"};
    FILE *f = fopen(path_of("vocab.json"), "w");
    put_vocab(f, extra, 6);
    fclose(f);
    f = fopen(path_of("merges.txt"), "w");
    fputs("#version: 0.2\nb c\na b\na bc\na a\na Ġ\n", f);
    fclose(f);
    dt_tokenizer *tok = NULL;
    dt_status st = dt_tokenizer_from_files(path_of("vocab.json"), path_of("merges.txt"), &tok);
    if (st != DT_OK)
        fprintf(stderr, "%s\n", dt_last_error());
    CU_ASSERT_FATAL(st == DT_OK);
    return tok;
}

static size_t enc(const dt_tokenizer *tok, const char *s, unsigned flags, int32_t *ids)
{
    size_t n = 0;
    CU_ASSERT_FATAL(dt_tokenizer_encode(tok, s, strlen(s), flags, ids, 64, &n) == DT_OK);
    return n;
}

static void test_tokenizer_merges_apply_in_rank_order(void)
{
    dt_tokenizer *tok = small_files();
    int32_t ids[64];
    /* "b c" (rank 0) before "a b" (rank 1), then "a bc": abc. "a b" first would leave ab c. */
    CU_ASSERT(enc(tok, "abc", 0, ids) == 1 && ids[0] == 258);
    /* Equal ranks merge leftmost first: aaa -> aa a. */
    CU_ASSERT(enc(tok, "aaa", 0, ids) == 2 && ids[0] == 259 && ids[1] == 'a');
    CU_ASSERT(enc(tok, "aaaa", 0, ids) == 2 && ids[0] == 259 && ids[1] == 259);
    CU_ASSERT(enc(tok, "abab", 0, ids) == 2 && ids[0] == 256 && ids[1] == 256);
    dt_tokenizer_destroy(tok);
}

static void test_tokenizer_never_merges_across_pieces(void)
{
    dt_tokenizer *tok = small_files();
    int32_t ids[64];
    /* "a b" splits into "a" and " b": the merge "a Ġ" has no pair to act on. */
    CU_ASSERT(enc(tok, "a b", 0, ids) == 3 && ids[0] == 'a' && ids[1] == ' ' && ids[2] == 'b');
    /* GPT-2's pattern: "a's" -> "a", "'s". */
    CU_ASSERT(enc(tok, "a's", 0, ids) == 3);
    dt_tokenizer_destroy(tok);
}

static void test_tokenizer_encodes_invalid_utf8_as_bytes(void)
{
    dt_tokenizer *tok = small_files();
    int32_t ids[64];
    CU_ASSERT(enc(tok, "\xff\xfe", 0, ids) == 2 && ids[0] == 0xff && ids[1] == 0xfe);
    size_t n = enc(tok,
                   "abc\xe6\x97"
                   "abc",
                   0, ids);
    CU_ASSERT(n == 4 && ids[0] == 258 && ids[1] == 0xe6 && ids[2] == 0x97 && ids[3] == 258);
    dt_tokenizer_destroy(tok);
}

static void test_tokenizer_matches_special_tokens_before_pretokenizing(void)
{
    dt_tokenizer *tok = small_files();
    int32_t ids[64];
    size_t n = enc(tok, "abc<|endoftext|>abc", 0, ids);
    CU_ASSERT(n == 3 && ids[0] == 258 && ids[1] == 260 && ids[2] == 258);
    n = enc(tok, "abc<|endoftext|>abc", DT_TOKENIZER_ENCODE_PLAIN, ids);
    CU_ASSERT(n > 3);
    for (size_t i = 0; i < n; i++)
        CU_ASSERT(ids[i] != 260);
    int32_t id = -1;
    CU_ASSERT(dt_tokenizer_token_id(tok, "<|endoftext|>", 13, &id) == DT_OK && id == 260);
    dt_tokenizer_destroy(tok);
}

static void test_tokenizer_round_trips_random_bytes(void)
{
    dt_tokenizer *tok = small_files();
    unsigned seed = 48;
    char text[300], back[300];
    int32_t ids[300];
    for (int k = 0; k < 3000; k++) {
        size_t len = (size_t)(rand_r(&seed) % 300), n, blen;
        /* half the strings from a small alphabet, so that merges and specials fire */
        static const char alpha[] = "abc <|endoftext|>\n\t'sé";
        for (size_t i = 0; i < len; i++)
            text[i] = k % 2 ? (char)rand_r(&seed) : alpha[rand_r(&seed) % (sizeof alpha - 1)];
        CU_ASSERT_FATAL(dt_tokenizer_encode(tok, text, len, 0, ids, len, &n) == DT_OK);
        CU_ASSERT_FATAL(dt_tokenizer_decode(tok, ids, n, back, sizeof back, &blen) == DT_OK);
        CU_ASSERT_FATAL(blen == len && memcmp(back, text, len) == 0);
    }
    dt_tokenizer_destroy(tok);
}

static void test_tokenizer_reports_small_buffers_without_writing(void)
{
    dt_tokenizer *tok = small_files();
    int32_t ids[2] = {-7, -7}, bad = 99999;
    size_t n = 12345;
    CU_ASSERT(dt_tokenizer_encode(tok, "a b c", 5, 0, ids, 2, &n) == DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT(n == 12345 && ids[0] == -7);
    CU_ASSERT(strstr(dt_last_error(), "5 ids") != NULL);
    CU_ASSERT(dt_tokenizer_encode(tok, "a b c", 5, 0, NULL, 0, &n) == DT_OK && n == 5);
    char buf[4];
    CU_ASSERT(dt_tokenizer_decode(tok, &bad, 1, buf, 4, &n) == DT_ERR_INVALID_ARGUMENT);
    CU_ASSERT(dt_tokenizer_encode(tok, "a", 1, 0x80, ids, 2, &n) == DT_ERR_INVALID_ARGUMENT);
    dt_tokenizer_destroy(tok);
}

static void test_tokenizer_rejects_merge_outside_vocabulary(void)
{
    static const char *const extra[] = {"ab"};
    FILE *f = fopen(path_of("v2.json"), "w");
    put_vocab(f, extra, 1);
    fclose(f);
    f = fopen(path_of("m2.txt"), "w");
    fputs("a b\nab c\n", f); /* "abc" is not a token */
    fclose(f);
    dt_tokenizer *tok = NULL;
    CU_ASSERT(dt_tokenizer_from_files(path_of("v2.json"), path_of("m2.txt"), &tok) ==
              DT_ERR_CORRUPT);
    CU_ASSERT(tok == NULL && strstr(dt_last_error(), "merged token") != NULL);
}

/* A tokenizer.json of the hand-worked vocabulary; merges as strings or as pairs. */
static void write_json(const char *name, int pairs, const char *model_extra, const char *root_extra)
{
    static const char *const extra[] = {"ab", "bc", "abc", "aa"};
    FILE *f = fopen(path_of(name), "w");
    fprintf(f,
            "{%s\"added_tokens\": [{\"id\": 300, \"content\": \"<|eot|>\", \"special\": true}],"
            "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false},"
            "\"decoder\": {\"type\": \"ByteLevel\"},"
            "\"model\": {\"type\": \"BPE\", %s \"vocab\": ",
            root_extra, model_extra);
    put_vocab(f, extra, 4);
    fputs(pairs
              ? ", \"merges\": [[\"b\", \"c\"], [\"a\", \"b\"], [\"a\", \"bc\"], [\"a\", \"a\"]]}}"
              : ", \"merges\": [\"b c\", \"a b\", \"a bc\", \"a a\"]}}",
          f);
    fclose(f);
}

static void test_tokenizer_json_reads_both_merge_forms(void)
{
    write_json("t_str.json", 0, "", "");
    write_json("t_pair.json", 1, "", "");
    dt_tokenizer *a = NULL, *b = NULL;
    CU_ASSERT_FATAL(dt_tokenizer_from_json(path_of("t_str.json"), &a) == DT_OK);
    CU_ASSERT_FATAL(dt_tokenizer_from_json(path_of("t_pair.json"), &b) == DT_OK);
    const char *s = "abc aaa<|eot|> abcabc\xff";
    int32_t ia[64], ib[64];
    size_t na = enc(a, s, 0, ia), nb = enc(b, s, 0, ib);
    CU_ASSERT(na == nb && memcmp(ia, ib, na * sizeof *ia) == 0);
    /* abc, " ", aa, a, <|eot|>, " ", a, b, c, ... : " abcabc" is one piece with a space */
    CU_ASSERT(ia[0] == 258);
    int seen_eot = 0;
    for (size_t i = 0; i < na; i++)
        seen_eot |= ia[i] == 300;
    CU_ASSERT(seen_eot);
    CU_ASSERT(dt_tokenizer_vocab_size(a) == 301);
    const char *bytes;
    size_t len;
    CU_ASSERT(dt_tokenizer_token(a, 300, &bytes, &len) == DT_OK && len == 7 &&
              memcmp(bytes, "<|eot|>", 7) == 0);
    CU_ASSERT(dt_tokenizer_token(a, 299, &bytes, &len) == DT_ERR_NOT_FOUND);
    dt_tokenizer_destroy(a);
    dt_tokenizer_destroy(b);
}

static void test_tokenizer_json_ignore_merges_takes_whole_words(void)
{
    /* "aab" is a token no merge reaches (aa b has no merge). */
    static const char *const extra[] = {"aa", "aab"};
    FILE *f = fopen(path_of("t_im.json"), "w");
    fputs("{\"pre_tokenizer\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", "
          "\"ignore_merges\": true, \"vocab\": ",
          f);
    put_vocab(f, extra, 2);
    fputs(", \"merges\": [\"a a\"]}}", f);
    fclose(f);
    dt_tokenizer *tok = NULL;
    CU_ASSERT_FATAL(dt_tokenizer_from_json(path_of("t_im.json"), &tok) == DT_OK);
    int32_t ids[64];
    CU_ASSERT(enc(tok, "aab", 0, ids) == 1 && ids[0] == 257);
    CU_ASSERT(enc(tok, "aaab", 0, ids) == 3 && ids[0] == 256);
    dt_tokenizer_destroy(tok);
}

static void test_tokenizer_json_nfc_normalizes_between_special_tokens(void)
{
    write_json("t_nfc.json", 0, "", "\"normalizer\": {\"type\": \"NFC\"},");
    write_json("t_raw.json", 0, "", "");
    dt_tokenizer *nfc = NULL, *raw = NULL;
    CU_ASSERT_FATAL(dt_tokenizer_from_json(path_of("t_nfc.json"), &nfc) == DT_OK);
    CU_ASSERT_FATAL(dt_tokenizer_from_json(path_of("t_raw.json"), &raw) == DT_OK);
    int32_t a[64], b[64];
    /* e + U+0301 composes to U+00E9 (c3 a9); the invalid byte ff passes through */
    const char *decomposed = "abc e\xcc\x81<|eot|>\xff\xe1\x84\x80\xe1\x85\xa1";
    const char *composed = "abc \xc3\xa9<|eot|>\xff\xea\xb0\x80";
    size_t na = enc(nfc, decomposed, 0, a), nb = enc(raw, composed, 0, b);
    CU_ASSERT(na == nb && memcmp(a, b, na * sizeof *a) == 0);
    CU_ASSERT(enc(raw, decomposed, 0, b) != na);
    /* ASCII and already composed text: unchanged */
    na = enc(nfc, composed, 0, a);
    nb = enc(raw, composed, 0, b);
    CU_ASSERT(na == nb && memcmp(a, b, na * sizeof *a) == 0);
    dt_tokenizer_destroy(nfc);
    dt_tokenizer_destroy(raw);
}

static void test_tokenizer_json_loads_qwen2_style_split_and_nfc(void)
{
    /* Qwen2's pre-tokenizer: a Split of its pattern (single digits), then ByteLevel. */
    static const char *const extra[] = {"12", "ab"};
    FILE *f = fopen(path_of("t_qwen.json"), "w");
    fputs("{\"normalizer\": {\"type\": \"NFC\"}, \"pre_tokenizer\": {\"type\": \"Sequence\", "
          "\"pretokenizers\": [{\"type\": \"Split\", \"pattern\": {\"Regex\": "
          "\"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
          "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, "
          "\"behavior\": \"Isolated\", \"invert\": false}, {\"type\": \"ByteLevel\", "
          "\"add_prefix_space\": false, \"use_regex\": false}]}, "
          "\"model\": {\"type\": \"BPE\", \"vocab\": ",
          f);
    put_vocab(f, extra, 2);
    fputs(", \"merges\": [\"1 2\", \"a b\"]}}", f);
    fclose(f);
    dt_tokenizer *tok = NULL;
    dt_status st = dt_tokenizer_from_json(path_of("t_qwen.json"), &tok);
    if (st != DT_OK)
        fprintf(stderr, "%s\n", dt_last_error());
    CU_ASSERT_FATAL(st == DT_OK);
    int32_t ids[64];
    /* digits one by one: "12" never forms; "ab" does */
    CU_ASSERT(enc(tok, "12ab", 0, ids) == 3 && ids[0] == '1' && ids[1] == '2' && ids[2] == 257);
    CU_ASSERT(enc(tok, "A'LL", 0, ids) == 4 && ids[1] == '\'');
    dt_tokenizer_destroy(tok);
}

static void test_tokenizer_json_refuses_what_it_does_not_implement(void)
{
    dt_tokenizer *tok = NULL;
    write_json("t_norm.json", 0, "", "\"normalizer\": {\"type\": \"NFKC\"},");
    CU_ASSERT(dt_tokenizer_from_json(path_of("t_norm.json"), &tok) == DT_ERR_UNSUPPORTED);
    CU_ASSERT(strstr(dt_last_error(), "normalizer.type") != NULL);
    write_json("t_bf.json", 0, "\"byte_fallback\": true,", "");
    CU_ASSERT(dt_tokenizer_from_json(path_of("t_bf.json"), &tok) == DT_ERR_UNSUPPORTED);
    CU_ASSERT(strstr(dt_last_error(), "model.byte_fallback") != NULL);
    FILE *f = fopen(path_of("t_wp.json"), "w");
    fputs("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", f);
    fclose(f);
    CU_ASSERT(dt_tokenizer_from_json(path_of("t_wp.json"), &tok) == DT_ERR_UNSUPPORTED);
    CU_ASSERT(strstr(dt_last_error(), "model.type") != NULL);
    f = fopen(path_of("t_bad.json"), "w");
    fputs("{\"model\": ", f);
    fclose(f);
    CU_ASSERT(dt_tokenizer_from_json(path_of("t_bad.json"), &tok) == DT_ERR_PARSE);
    CU_ASSERT(dt_tokenizer_from_json(path_of("missing.json"), &tok) == DT_ERR_IO);
    CU_ASSERT(tok == NULL);
}

int main(int argc, char **argv)
{
    snprintf(dir, sizeof dir, "/tmp/dt_text_XXXXXX");
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    static const dt_test_case cases[] = {
        DT_TEST(test_tokenizer_merges_apply_in_rank_order),
        DT_TEST(test_tokenizer_never_merges_across_pieces),
        DT_TEST(test_tokenizer_encodes_invalid_utf8_as_bytes),
        DT_TEST(test_tokenizer_matches_special_tokens_before_pretokenizing),
        DT_TEST(test_tokenizer_round_trips_random_bytes),
        DT_TEST(test_tokenizer_reports_small_buffers_without_writing),
        DT_TEST(test_tokenizer_rejects_merge_outside_vocabulary),
        DT_TEST(test_tokenizer_json_reads_both_merge_forms),
        DT_TEST(test_tokenizer_json_ignore_merges_takes_whole_words),
        DT_TEST(test_tokenizer_json_nfc_normalizes_between_special_tokens),
        DT_TEST(test_tokenizer_json_loads_qwen2_style_split_and_nfc),
        DT_TEST(test_tokenizer_json_refuses_what_it_does_not_implement),
        DT_TEST_END,
    };
    int rc = dt_test_main(argc, argv, "text_tokenizer", cases, 0);
    char cmd[96];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "could not remove %s\n", dir);
    return rc;
}
