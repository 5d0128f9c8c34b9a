/* train/font: a 5x7 bitmap font (digits, lowercase letters, a little punctuation) for the
 * plot's labels. Uppercase letters are drawn as lowercase; unknown characters as blanks. */
#ifndef TRAIN_FONT_H
#define TRAIN_FONT_H

#define FONT_W 5
#define FONT_H 7

/* 1 if pixel (x, y), 0 <= x < FONT_W, 0 <= y < FONT_H (y down), of character ch is set. */
int font_pixel(int ch, int x, int y);

#endif
