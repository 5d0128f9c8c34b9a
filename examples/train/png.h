/* train/png: a small PNG encoder (8-bit RGB, deflate through zlib) for the example's plot. */
#ifndef TRAIN_PNG_H
#define TRAIN_PNG_H

#include <stddef.h>
#include <stdint.h>

/* Writes a width x height RGB image (rows top to bottom, 3 bytes per pixel) to `path`.
 * Returns 0, or -1 with a one-line message in err. */
int png_write_rgb(const char *path, int width, int height, const uint8_t *rgb, char *err,
                  size_t errlen);

#endif
