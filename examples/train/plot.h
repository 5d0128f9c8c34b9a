/* train/plot: line charts drawn into an RGB raster and written as PNG: one or more panels
 * stacked vertically, each with axes, ticks, grid, labelled numbers, a title and a legend. */
#ifndef TRAIN_PLOT_H
#define TRAIN_PLOT_H

#include <stddef.h>
#include <stdint.h>

typedef struct plot_series {
    const char *label;
    int n;
    const double *x; /* points; a NaN y breaks the line there */
    const double *y;
    uint8_t rgb[3];
    int markers; /* 1: a dot on every point */
} plot_series;

typedef struct plot_panel {
    const char *title;
    const char *subtitle; /* a smaller grey line under the title; may be NULL */
    const char *xlabel;
    double xmin, xmax; /* axis ranges (the caller picks them: xmin < xmax, ymin < ymax) */
    double ymin, ymax;
    int percent;             /* 1: y tick labels as percentages of 1 */
    double hline;            /* a dashed reference line at this y; NaN for none */
    const char *hline_label; /* text above its right end; may be NULL */
    int nseries;
    const plot_series *series;
} plot_panel;

/* Draws the panels (each `width` x `panel_height` pixels) and writes the PNG. Returns 0, or
 * -1 with a one-line message in err. */
int plot_write_png(const char *path, int width, int panel_height, int npanels,
                   const plot_panel *panels, char *err, size_t errlen);

/* A "nice" axis maximum at or above v (1, 2, 2.5 or 5 times a power of ten). */
double plot_nice_ceil(double v);

#endif
