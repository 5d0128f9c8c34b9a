/* Exchange tallies (issue 45): what a client moves with each peer in one exchange, sent to
 * that peer beside the data, so that both clients of every pair compare the same two tallies
 * and come to the same verdict (runtime/transport_mpi.c, runtime/transport_staged.c). Not
 * installed. */
#ifndef DTENSOR_RUNTIME_TALLY_H
#define DTENSOR_RUNTIME_TALLY_H

#include <stddef.h>
#include <stdint.h>

#include "runtime/transport.h"

/* What this client moves with one peer: boxes and bytes it sends there and receives from
 * there, and the messages they travel in (one per box, digest 0, unless the transport cuts
 * its boxes: then their number and a digest of their sizes in order). Plain data: it goes
 * over the wire as bytes. */
typedef struct dt__tally {
    int64_t nsend, send_bytes, nrecv, recv_bytes;
    int64_t send_msgs, recv_msgs;
    uint64_t send_cut, recv_cut;
} dt__tally;

/* How a transport cuts one box into messages: their number and a digest of their sizes in
 * order (any value, the same on every client for the same box). */
typedef void (*dt__tally_cut_fn)(const dt__region *r, const void *arg, int64_t *msgs_out,
                                 uint64_t *digest_out);

/* The peers of an exchange (each once, in order of first appearance in recvs then sends) into
 * peer_out and this client's tally with each into mine_out (both nsends + nrecvs entries of
 * room); cut NULL: one message per box. Returns the number of peers. Local. */
size_t dt__tally_peers(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs, size_t nrecvs,
                       dt__tally_cut_fn cut, const void *arg, int *peer_out, dt__tally *mine_out);

/* 1 if a peer's tally mirrors this client's (what one sends the other expects, both ways);
 * symmetric, so both clients of the pair find the same. Local. */
int dt__tally_agree(const dt__tally *mine, const dt__tally *theirs);

/* DT_ERR_STATE naming the first of the np peers whose tally does not mirror this client's,
 * both sizes and DT__MISMATCH_HINT, else DT_OK. The peer finds the same pair of tallies
 * (mirrored) and fails too. Local. */
dt_status dt__tally_check(const int *peer, const dt__tally *mine, const dt__tally *theirs,
                          size_t np);

#endif
