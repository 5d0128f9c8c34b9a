/* The index's own checksum (docs/ckpt-format.md, "The index checksum"): the index text ends
 * with the member "index_crc32c", the CRC32C of every byte before it, so that no byte of the
 * index (named values, mesh string, chunk_bytes included) changes unnoticed, while the file
 * stays plain JSON for outside readers. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ckpt/ckpt_impl.h"
#include "runtime/error.h"

/* The index ends with exactly KEY, 8 lowercase hex digits, then END. */
static const char KEY[] = "\"index_crc32c\": \"";
static const char END[] = "\"\n}\n";
enum { KEY_LEN = sizeof KEY - 1, END_LEN = sizeof END - 1, TAIL_LEN = KEY_LEN + 8 + END_LEN };

dt_status dt__ckpt_index_seal(const char *json, char **sealed_out)
{
    /* jansson's indented text of an object ends with "\n}": the member goes before it. */
    size_t n = strlen(json);
    if (n < 2 || strcmp(json + n - 2, "\n}") != 0)
        return dt__error(DT_ERR_STATE, "dt_save: unexpected index text end");
    size_t body = n - 2;
    char *out = malloc(body + 3 + TAIL_LEN + 1);
    if (!out)
        return dt__error(DT_ERR_NO_MEMORY, "dt_save: no memory for the index");
    memcpy(out, json, body);
    memcpy(out + body, ",\n ", 3);
    body += 3;
    uint32_t crc = dt_crc32c(0, out, body);
    snprintf(out + body, TAIL_LEN + 1, "%s%08" PRIx32 "%s", KEY, crc, END);
    *sealed_out = out;
    return DT_OK;
}

dt_status dt__ckpt_index_check_seal(const char *index_path, const char *text, size_t len,
                                    int *sealed_out)
{
    *sealed_out = 0;
    if (len < TAIL_LEN)
        return DT_OK;
    const char *tail = text + len - TAIL_LEN;
    if (memcmp(tail, KEY, KEY_LEN) != 0 || memcmp(text + len - END_LEN, END, END_LEN) != 0)
        return DT_OK;
    uint32_t stored = 0;
    for (int i = 0; i < 8; i++) {
        char ch = tail[KEY_LEN + i];
        int h = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
        if (h < 0)
            return dt__error(DT_ERR_CORRUPT, "%s: field 'index_crc32c' is not 8 lowercase hex "
                             "digits", index_path);
        stored = stored << 4 | (uint32_t)h;
    }
    uint32_t crc = dt_crc32c(0, text, len - TAIL_LEN);
    if (crc != stored)
        return dt__error(DT_ERR_CORRUPT, "%s: index CRC32C mismatch: field 'index_crc32c' is "
                         "%08" PRIx32 ", the text before it has %08" PRIx32 " (index altered)",
                         index_path, stored, crc);
    *sealed_out = 1;
    return DT_OK;
}
