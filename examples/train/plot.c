/* train/plot: a tiny raster plotter for the training curves: pixels, thick lines, 5x7 text,
 * one panel per chart with ticks at "nice" steps, encoded by train/png. */
#include "plot.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "font.h"
#include "png.h"

typedef struct canvas {
    int w, h;
    uint8_t *px;
} canvas;

static const uint8_t BLACK[3] = {0, 0, 0};
static const uint8_t GREY[3] = {110, 110, 110};
static const uint8_t GRID[3] = {225, 225, 225};

static void dot(canvas *c, int x, int y, const uint8_t rgb[3])
{
    if (x < 0 || y < 0 || x >= c->w || y >= c->h)
        return;
    memcpy(c->px + ((size_t)y * (size_t)c->w + (size_t)x) * 3, rgb, 3);
}

static void rect(canvas *c, int x0, int y0, int x1, int y1, const uint8_t rgb[3])
{
    for (int y = y0; y <= y1; y++)
        for (int x = x0; x <= x1; x++)
            dot(c, x, y, rgb);
}

/* Bresenham; thick > 1 stamps a square of that side at each step; dash > 0 draws `dash`
 * pixels on, `dash` off. */
static void line(canvas *c, int x0, int y0, int x1, int y1, const uint8_t rgb[3], int thick,
                 int dash)
{
    int dx = abs(x1 - x0), sx = x0 < x1 ? 1 : -1;
    int dy = -abs(y1 - y0), sy = y0 < y1 ? 1 : -1;
    int e = dx + dy, k = 0;
    for (;;) {
        if (!dash || (k / dash) % 2 == 0)
            rect(c, x0 - (thick - 1) / 2, y0 - (thick - 1) / 2, x0 + thick / 2, y0 + thick / 2,
                 rgb);
        k++;
        if (x0 == x1 && y0 == y1)
            break;
        int e2 = 2 * e;
        if (e2 >= dy) {
            e += dy;
            x0 += sx;
        }
        if (e2 <= dx) {
            e += dx;
            y0 += sy;
        }
    }
}

static int text_width(const char *s, int scale)
{
    return (int)strlen(s) * (FONT_W + 1) * scale - scale;
}

/* Text with its top-left corner at (x, y). */
static void text(canvas *c, int x, int y, const char *s, const uint8_t rgb[3], int scale)
{
    for (; *s; s++, x += (FONT_W + 1) * scale)
        for (int gy = 0; gy < FONT_H; gy++)
            for (int gx = 0; gx < FONT_W; gx++)
                if (font_pixel(*s, gx, gy))
                    rect(c, x + gx * scale, y + gy * scale, x + gx * scale + scale - 1,
                         y + gy * scale + scale - 1, rgb);
}

double plot_nice_ceil(double v)
{
    if (!(v > 0) || !isfinite(v))
        return 1.0;
    double p = pow(10.0, floor(log10(v)));
    static const double m[] = {1.0, 2.0, 2.5, 5.0, 10.0};
    for (int i = 0; i < 5; i++)
        if (m[i] * p >= v * (1 - 1e-12))
            return m[i] * p;
    return 10.0 * p;
}

/* A tick step giving about `want` intervals over span. */
static double tick_step(double span, int want)
{
    double raw = span / want;
    double p = pow(10.0, floor(log10(raw)));
    double f = raw / p;
    return (f < 1.5 ? 1.0 : f < 3.5 ? 2.0 : f < 7.5 ? 5.0 : 10.0) * p;
}

static void tick_label(char *buf, size_t len, double v, double step, int percent)
{
    if (percent) {
        int dec = step * 100 >= 1 ? 0 : (int)ceil(-log10(step * 100));
        snprintf(buf, len, "%.*f%%", dec, v * 100);
        return;
    }
    int dec = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    snprintf(buf, len, "%.*f", dec, fabs(v) < step * 1e-9 ? 0.0 : v);
}

static void draw_panel(canvas *c, int top, int height, const plot_panel *p)
{
    const int left = 78, right = c->w - 24, ptop = top + 50, pbot = top + height - 46;
    double xspan = p->xmax - p->xmin, yspan = p->ymax - p->ymin;
    char buf[64];
#define PX(xv) (left + (int)lround(((xv)-p->xmin) / xspan * (right - left)))
#define PY(yv) (pbot - (int)lround(((yv)-p->ymin) / yspan * (pbot - ptop)))

    text(c, left, top + 10, p->title, BLACK, 2);
    if (p->subtitle)
        text(c, left, top + 32, p->subtitle, GREY, 1);
    /* Legend, right-aligned on the title row. */
    int lx = right;
    for (int s = p->nseries - 1; s >= 0; s--) {
        const plot_series *ser = &p->series[s];
        lx -= text_width(ser->label, 1);
        text(c, lx, top + 16, ser->label, BLACK, 1);
        lx -= 22;
        rect(c, lx, top + 18, lx + 16, top + 20, ser->rgb);
        lx -= 16;
    }

    double ys = tick_step(yspan, 5);
    for (double v = ceil(p->ymin / ys) * ys; v <= p->ymax + ys * 1e-9; v += ys) {
        int y = PY(v);
        line(c, left, y, right, y, GRID, 1, 0);
        line(c, left - 5, y, left, y, BLACK, 1, 0);
        tick_label(buf, sizeof buf, v, ys, p->percent);
        text(c, left - 9 - text_width(buf, 1), y - FONT_H / 2, buf, BLACK, 1);
    }
    double xs = tick_step(xspan, 8);
    if (xs < 1 && xspan >= 1)
        xs = 1;
    for (double v = ceil(p->xmin / xs) * xs; v <= p->xmax + xs * 1e-9; v += xs) {
        int x = PX(v);
        line(c, x, ptop, x, pbot, GRID, 1, 0);
        line(c, x, pbot, x, pbot + 5, BLACK, 1, 0);
        tick_label(buf, sizeof buf, v, xs, 0);
        text(c, x - text_width(buf, 1) / 2, pbot + 9, buf, BLACK, 1);
    }
    text(c, (left + right - text_width(p->xlabel, 1)) / 2, pbot + 24, p->xlabel, GREY, 1);
    if (isfinite(p->hline) && p->hline >= p->ymin && p->hline <= p->ymax) {
        line(c, left, PY(p->hline), right, PY(p->hline), GREY, 1, 6);
        if (p->hline_label)
            text(c, right - 4 - text_width(p->hline_label, 1), PY(p->hline) - FONT_H - 4,
                 p->hline_label, GREY, 1);
    }

    for (int s = 0; s < p->nseries; s++) {
        const plot_series *ser = &p->series[s];
        int have = 0, px0 = 0, py0 = 0;
        for (int i = 0; i < ser->n; i++) {
            double xv = ser->x[i], yv = ser->y[i];
            if (!isfinite(xv) || !isfinite(yv)) {
                have = 0;
                continue;
            }
            /* Clamp into the frame so an early spike does not draw outside it. */
            yv = yv < p->ymin ? p->ymin : yv > p->ymax ? p->ymax : yv;
            int x = PX(xv), y = PY(yv);
            if (have)
                line(c, px0, py0, x, y, ser->rgb, 2, 0);
            if (ser->markers)
                rect(c, x - 2, y - 2, x + 2, y + 2, ser->rgb);
            px0 = x;
            py0 = y;
            have = 1;
        }
    }
    /* The frame last, over the curves' ends. */
    line(c, left, ptop, left, pbot, BLACK, 1, 0);
    line(c, left, pbot, right, pbot, BLACK, 1, 0);
    line(c, right, ptop, right, pbot, BLACK, 1, 0);
    line(c, left, ptop, right, ptop, BLACK, 1, 0);
#undef PX
#undef PY
}

int plot_write_png(const char *path, int width, int panel_height, int npanels,
                   const plot_panel *panels, char *err, size_t errlen)
{
    for (int i = 0; i < npanels; i++)
        if (!(panels[i].xmax > panels[i].xmin) || !(panels[i].ymax > panels[i].ymin)) {
            snprintf(err, errlen, "%s: empty axis range in panel '%s'", path, panels[i].title);
            return -1;
        }
    canvas c = {width, panel_height * npanels, NULL};
    c.px = malloc((size_t)c.w * (size_t)c.h * 3);
    if (!c.px) {
        snprintf(err, errlen, "%s: out of memory", path);
        return -1;
    }
    memset(c.px, 255, (size_t)c.w * (size_t)c.h * 3);
    for (int i = 0; i < npanels; i++)
        draw_panel(&c, i * panel_height, panel_height, &panels[i]);
    int rc = png_write_rgb(path, c.w, c.h, c.px, err, errlen);
    free(c.px);
    return rc;
}
