/* Exchange tallies: counting what a client moves with each peer of an exchange and comparing
 * the peer's count with its own (runtime/tally.h; the mpi and staged transports). */
#include <stdio.h>
#include <string.h>

#include "runtime/error.h"
#include "runtime/tally.h"

size_t dt__tally_peers(const dt__xfer *sends, size_t nsends, const dt__xfer *recvs, size_t nrecvs,
                       dt__tally_cut_fn cut, const void *arg, int *peer_out, dt__tally *mine_out)
{
    size_t np = 0;
    for (size_t i = 0; i < nsends + nrecvs; i++) {
        int sending = i >= nrecvs;
        const dt__xfer *x = sending ? &sends[i - nrecvs] : &recvs[i];
        size_t k = 0;
        while (k < np && peer_out[k] != x->peer)
            k++;
        if (k == np) {
            peer_out[np] = x->peer;
            memset(&mine_out[np++], 0, sizeof *mine_out);
        }
        dt__tally *t = &mine_out[k];
        int64_t bytes = (int64_t)dt__region_bytes(&x->region), msgs = 1;
        uint64_t digest = 0;
        if (cut)
            cut(&x->region, arg, &msgs, &digest);
        /* FNV-1a over the boxes' digests, in the order both clients list them. */
        uint64_t *h = sending ? &t->send_cut : &t->recv_cut;
        *h = (*h ^ digest) * 0x100000001b3ull;
        if (sending) {
            t->nsend++;
            t->send_bytes += bytes;
            t->send_msgs += msgs;
        } else {
            t->nrecv++;
            t->recv_bytes += bytes;
            t->recv_msgs += msgs;
        }
    }
    return np;
}

int dt__tally_agree(const dt__tally *m, const dt__tally *t)
{
    return t->nrecv == m->nsend && t->recv_bytes == m->send_bytes && t->nsend == m->nrecv &&
           t->send_bytes == m->recv_bytes && t->recv_msgs == m->send_msgs &&
           t->send_msgs == m->recv_msgs && t->recv_cut == m->send_cut && t->send_cut == m->recv_cut;
}

/* Which way a pair disagrees, from the sender's side: 1 if `from` sends other than `to`
 * expects. */
static int differs(int64_t nsend, int64_t send_bytes, int64_t send_msgs, uint64_t send_cut,
                   const dt__tally *to)
{
    return nsend != to->nrecv || send_bytes != to->recv_bytes || send_msgs != to->recv_msgs ||
           send_cut != to->recv_cut;
}

dt_status dt__tally_check(const int *peer, const dt__tally *mine, const dt__tally *theirs,
                          size_t np)
{
    for (size_t k = 0; k < np; k++) {
        const dt__tally *m = &mine[k], *t = &theirs[k];
        if (dt__tally_agree(m, t))
            continue;
        /* Only the directions that disagree, each from the sender's side; boxes of the same
         * number and bytes that differ only in their sizes or cut say so. */
        char in[200] = "", out[200] = "";
        if (differs(t->nsend, t->send_bytes, t->send_msgs, t->send_cut, m))
            snprintf(in, sizeof in,
                     "client %d sends %lld bytes in %lld box(es)%s where this "
                     "client expects %lld in %lld",
                     peer[k], (long long)t->send_bytes, (long long)t->nsend,
                     t->nsend == m->nrecv && t->send_bytes == m->recv_bytes ? " of other sizes"
                                                                            : "",
                     (long long)m->recv_bytes, (long long)m->nrecv);
        if (differs(m->nsend, m->send_bytes, m->send_msgs, m->send_cut, t))
            snprintf(out, sizeof out,
                     "this client sends %lld bytes in %lld box(es)%s where "
                     "client %d expects %lld in %lld",
                     (long long)m->send_bytes, (long long)m->nsend,
                     m->nsend == t->nrecv && m->send_bytes == t->recv_bytes ? " of other sizes"
                                                                            : "",
                     peer[k], (long long)t->recv_bytes, (long long)t->nrecv);
        return dt__error(DT_ERR_STATE, "relayout exchange: %s%s%s: %s", in,
                         in[0] && out[0] ? "; " : "", out, DT__MISMATCH_HINT);
    }
    return DT_OK;
}
