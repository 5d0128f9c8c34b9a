/* The `dtensor` command-line tool: subcommand entry points and shared helpers.
 * Exit codes: 0 success, 1 bad input (message on stderr), 2 usage error. */
#ifndef DT_TOOLS_CLI_H
#define DT_TOOLS_CLI_H

#include <stddef.h>
#include <stdint.h>

#include "dtensor/dtensor.h"

enum { CLI_OK = 0, CLI_BAD_INPUT = 1, CLI_USAGE = 2 };

int cli_info(int argc, char **argv);
int cli_mesh(int argc, char **argv);
int cli_layout(int argc, char **argv);
int cli_ckpt(int argc, char **argv);
int cli_launch(int argc, char **argv);
int cli_trace(int argc, char **argv);
int cli_ops(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_generate(int argc, char **argv);

/* Prints "dtensor: <what>: <status name>: <dt_last_error()>" to stderr; returns CLI_BAD_INPUT. */
int cli_fail(const char *what, dt_status st);

/* Prints the usage text of the tool to stderr and returns CLI_USAGE. */
int cli_usage(void);

/* Formats a mesh or layout into a freshly malloc'ed string (NULL if out of memory). */
char *cli_mesh_string(const dt_mesh *mesh);
char *cli_layout_string(const dt_layout *layout);

/* Parses "8,6" into shape (up to cap entries); returns the rank, or -1 with the reason (a
 * size that is not a non-negative integer, or out of int64_t's range) in why. */
int cli_parse_shape(const char *text, int64_t *shape, int cap, char *why, size_t whylen);

#endif
