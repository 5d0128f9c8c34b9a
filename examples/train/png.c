/* train/png: writes the PNG signature, IHDR (8-bit truecolour, no interlace), one IDAT of the
 * zlib-deflated scanlines (each prefixed by filter type 1, "Sub", which shrinks the flat areas
 * of a plot well) and IEND, each chunk with its CRC-32 (PNG spec, W3C 2003). */
#include "png.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

static void put_be32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

/* One chunk: length, type, data, CRC-32 of type and data. */
static int write_chunk(FILE *f, const char type[4], const uint8_t *data, uint32_t len)
{
    uint8_t head[8], tail[4];
    put_be32(head, len);
    memcpy(head + 4, type, 4);
    uLong crc = crc32(0L, Z_NULL, 0);
    crc = crc32(crc, (const Bytef *)type, 4);
    if (len)
        crc = crc32(crc, data, len);
    put_be32(tail, (uint32_t)crc);
    if (fwrite(head, 1, 8, f) != 8 || (len && fwrite(data, 1, len, f) != len) ||
        fwrite(tail, 1, 4, f) != 4)
        return -1;
    return 0;
}

int png_write_rgb(const char *path, int width, int height, const uint8_t *rgb, char *err,
                  size_t errlen)
{
    if (width <= 0 || height <= 0 || width > 16384 || height > 16384) {
        snprintf(err, errlen, "%s: bad image size %dx%d", path, width, height);
        return -1;
    }
    size_t stride = (size_t)width * 3;
    size_t raw_len = (stride + 1) * (size_t)height;
    uLongf z_len = compressBound((uLong)raw_len);
    uint8_t *raw = malloc(raw_len);
    uint8_t *z = malloc(z_len);
    int rc = -1;
    FILE *f = NULL;
    if (!raw || !z) {
        snprintf(err, errlen, "%s: out of memory", path);
        goto out;
    }
    for (int y = 0; y < height; y++) {
        uint8_t *dst = raw + (size_t)y * (stride + 1);
        const uint8_t *src = rgb + (size_t)y * stride;
        dst[0] = 1; /* Sub: each byte minus the same channel of the pixel to its left */
        for (size_t i = 0; i < stride; i++)
            dst[1 + i] = (uint8_t)(src[i] - (i >= 3 ? src[i - 3] : 0));
    }
    if (compress2(z, &z_len, raw, (uLong)raw_len, 9) != Z_OK) {
        snprintf(err, errlen, "%s: deflate failed", path);
        goto out;
    }
    f = fopen(path, "wb");
    if (!f) {
        snprintf(err, errlen, "%s: cannot create: %s", path, strerror(errno));
        goto out;
    }
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    uint8_t ihdr[13];
    put_be32(ihdr, (uint32_t)width);
    put_be32(ihdr + 4, (uint32_t)height);
    ihdr[8] = 8;  /* bit depth */
    ihdr[9] = 2;  /* colour type: truecolour */
    ihdr[10] = 0; /* deflate */
    ihdr[11] = 0; /* adaptive filtering */
    ihdr[12] = 0; /* no interlace */
    if (fwrite(sig, 1, 8, f) != 8 || write_chunk(f, "IHDR", ihdr, 13) != 0 ||
        write_chunk(f, "IDAT", z, (uint32_t)z_len) != 0 || write_chunk(f, "IEND", NULL, 0) != 0) {
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        goto out;
    }
    if (fclose(f) != 0) {
        f = NULL;
        snprintf(err, errlen, "%s: write failed: %s", path, strerror(errno));
        goto out;
    }
    f = NULL;
    rc = 0;
out:
    if (f)
        fclose(f);
    free(z);
    free(raw);
    return rc;
}
